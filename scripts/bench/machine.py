"""The machine a benchmark ran on, for its result files."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (Linux: /proc/cpuinfo; a
    VM's name may say only "AMD EPYC", and family 25 model 17 is Zen 4), else what
    platform knows."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            numbers = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_header() -> dict:
    """What every result file starts with: the command that made it, the CPU, its cores
    and JAX's version."""
    import jax

    return {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
    }
