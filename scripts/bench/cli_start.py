"""CLI cold and warm start: wall time of `python -m lookahead_jax.generate` end to end.

    python scripts/bench/cli_start.py --out benchmarks/cpu/cli_start

Cold = empty compilation cache and empty autotune cache (the converted model is reused:
conversion is a one-time step, reported separately); warm = the same command again, with
the persistent compilation cache (and the autotune results) from the cold run. Each run
is a fresh process; the JSON's load_s / compile_s / total_s are reported next to the wall
time of the process (which adds Python and JAX imports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lookahead_jax.cache_dir import cache_root  # noqa: E402
from lookahead_jax.checkpoints import default_model  # noqa: E402

PROMPT = "Explain in two sentences why the sky is blue."


def run_cli(cache: Path, lookahead: list[str]) -> dict:
    env = dict(os.environ, LOOKAHEAD_JAX_CACHE=str(cache), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "lookahead_jax.generate", "--prompt", PROMPT, "--chat"]
    cmd += ["--max-new-tokens", "64", "--json", *lookahead]
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    out = json.loads(r.stdout)
    keys = ("load_s", "compile_s", "prefill_s", "decode_s", "total_s", "new_tokens")
    return {"wall_s": wall, **{k: out[k] for k in keys}, "config": out["config"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="cold/warm pairs per mode")
    ap.add_argument("--out", default="benchmarks/cpu/cli_start")
    args = ap.parse_args()

    default_model.resolve(None)  # converts the default model if it is not yet
    models = cache_root() / "models"
    modes = {
        "auto (default)": [],
        "--lookahead 5,1,1": ["--lookahead", "5,1,1"],
        "--no-lookahead": ["--no-lookahead"],
    }
    rows = []
    for name, flags in modes.items():
        for k in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp)
                (cache / "models").symlink_to(models, target_is_directory=True)
                cold = run_cli(cache, flags)
                warm = run_cli(cache, flags)
            rows.append({"mode": name, "repeat": k, "cold": cold, "warm": warm})
            print(json.dumps(rows[-1]), flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(["python", *sys.argv]), "prompt": PROMPT, "rows": rows}
    out.with_name(out.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# CLI start: SmolLM2-135M, 64 new tokens, one prompt",
        "",
        f"`{result['command']}` — each row is a fresh process; cold = empty XLA and "
        "autotune caches (the converted model reused), warm = the same command again.",
        "",
        "| mode | run | wall s | load s | compile s | total s (CLI) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for kind in ("cold", "warm"):
            x = r[kind]
            lines.append(
                f"| {r['mode']} | {kind} | {x['wall_s']:.1f} | {x['load_s']:.1f} | "
                f"{x['compile_s']:.1f} | {x['total_s']:.1f} |"
            )
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
