"""What `auto` chooses on this device for a model shape, from the curve of whole decode
steps (decoding/step_curve.py) beside the forwards' curve it used before: each curve's
ratios to a plain step and the choice made from each (random weights, a fresh cache:
the acceptance priors as they are).

    python3 scripts/gpu/auto_check.py --out $OUT/auto_check --dtypes float32,bfloat16
    python3 scripts/gpu/auto_check.py --out $OUT/auto_check --curves steps   # steps alone
    python3 scripts/gpu/auto_check.py --out /tmp/auto_check --dry-run   # on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("LOOKAHEAD_JAX_CACHE", tempfile.mkdtemp(prefix="auto-check-"))

import step_report  # noqa: E402  (its random-weight model shapes)

from lookahead_jax.decoding import autotune, cost_curve  # noqa: E402


def check(name: str, dtype: str, curves: list[str]) -> dict:
    model = step_report.bench_model(name, dtype)
    out = {"model": name, "dtype": dtype}
    for label, whole in (("forwards", False), ("steps", True)):
        if label not in curves:
            continue
        for f in cost_curve.tune_dir().glob("cost-*.json"):
            f.unlink()  # each curve measured afresh
        t0 = time.perf_counter()
        with mock.patch.object(cost_curve, "whole_steps", lambda whole=whole: whole):
            choice = autotune.choose(model)
            curve = cost_curve.cached_curve(model, autotune.PROBE_TOKENS)
        out[label] = {
            "seconds": time.perf_counter() - t0,
            "curve_ms": {t: 1000 * s for t, s in curve.items()},
            "ratios": {t: s / curve[1] for t, s in curve.items()},
            "choice": choice.summary(),
            "table": {str(k): round(v, 3) for k, v in choice.table.items()},
        }
        print(name, dtype, label, json.dumps(out[label]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--curves", default="forwards,steps", help="which curves: forwards,steps")
    ap.add_argument("--dry-run", action="store_true", help="the tiny shape, float32")
    args = ap.parse_args()
    import jax

    report = {"command": " ".join(["python", *sys.argv]), "device": jax.devices()[0].device_kind,
              "jax": jax.__version__, "rows": []}  # fmt: skip
    name = "tiny" if args.dry_run else args.model
    for dtype in ["float32"] if args.dry_run else args.dtypes.split(","):
        report["rows"].append(check(name, dtype, args.curves.split(",")))
        Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
