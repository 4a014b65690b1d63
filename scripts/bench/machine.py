"""The machine a benchmark ran on, for its result files."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
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
