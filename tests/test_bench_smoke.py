"""The benchmark scripts run end to end (--quick): a smoke check, not a timed test."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args, timeout=240):  # (under pytest's 300: the child is killed, its stderr shown)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_bench_quick(tmp_path, tiny_text_ckpt):
    """bench.py end to end on the tiny model with a tokenizer (its MT-bench prompts read
    character by character): our systems, the exactness count, tables and plots. The
    figures it makes are meaningless; the real model runs as a benchmark, not a test.
    --no-hf: the Hugging Face baselines (torch's import and the HF model's load, about 20
    s of the suite) run with every benchmark, whose results show them."""
    out = tmp_path / "bench"
    run(
        "scripts/bench/bench.py", "--quick", "--sets", "mt_bench", "--ckpt", str(tiny_text_ckpt),
        "--no-hf", "--out", str(out),
    )  # fmt: skip
    result = json.loads(out.with_suffix(".json").read_text())
    systems = set(result["sets"]["mt_bench"]["summary"])
    assert {"plain", "lookahead_default"} <= systems and not any("hf" in s for s in systems)
    assert result["exact_rows"].split("/")[0] == result["exact_rows"].split("/")[1]
    assert out.with_suffix(".md").read_text().startswith("# Decoding benchmark")
    for png in ("bench_speedup.png", "bench_categories.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_cost_curve_quick(tmp_path, tiny_ckpts):
    out = tmp_path / "cc"
    run(
        "scripts/bench/cost_curve.py",
        "--model",
        str(tiny_ckpts["gqa"][1]),
        "--tokens",
        "1,4",
        "--batch",
        "1,2",
        "--repeats",
        "2",
        "--out",
        str(out),
    )
    result = json.loads(out.with_suffix(".json").read_text())
    assert [(r["batch"], r["tokens"]) for r in result["rows"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert all(r["all_logits_s"]["min"] > 0 for r in result["rows"])
    for r in result["rows"]:  # each step against its batch's plain one-token step
        plain = next(
            q["one_logit_s"]
            for q in result["rows"]
            if q["batch"] == r["batch"] and q["tokens"] == 1
        )
        assert r["ratio_to_plain"]["min"] == r["all_logits_s"]["min"] / plain["min"]
    assert [r["batch"] for r in result["plain_roofline"]] == [1, 2]
    assert all(r["plain_step_s"] > 0 for r in result["plain_roofline"])
    assert out.with_suffix(".png").stat().st_size > 1000
