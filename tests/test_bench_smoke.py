"""The benchmark scripts run end to end (--quick): a smoke check, not a timed test."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args, timeout=900):
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


def test_gpu_step_report_dry_run(tmp_path, tiny_text_ckpt):
    """scripts/gpu/step_report.py (issue 49's device run) with every part on a two-layer
    model on the CPU, so that a typo never costs device time; its figures mean nothing."""
    out = tmp_path / "sr"
    run("scripts/gpu/step_report.py", "--dry-run", "--smollm2", str(tiny_text_ckpt),
        "--out", str(out))  # fmt: skip
    parts = json.loads(out.with_suffix(".json").read_text())["parts"]
    assert not [(n, p) for n, p in parts.items() if "error" in p or "skipped" in p]
    engine = [(r["layout"], r["batch"], r["context"]) for r in parts["engine"]["rows"]]
    assert engine == [("plain", 1, 24), ("16", 1, 24)]
    assert all(r["roofline"]["gbps"] > 0 for r in parts["engine"]["rows"] if r["layout"] == "plain")
    # the accelerators' attention adds no loop: one while loop, the loop over steps
    loops = {r["option"]: r["loops"] for r in parts["options"]["rows"]}
    fused = {r["option"]: r["fused"] for r in parts["options"]["rows"]}
    assert fused["Q/K/V and gate/up fused"] and not fused["Q/K/V and gate/up apart"]
    assert len(parts["options"]["flags_checked"]) == 3  # the GPU flags: accepted by XLA
    assert loops["attention over the whole cache"] == 1
    assert loops["attention in blocks (a loop per layer)"] == 1 + 2  # two layers
    assert parts["profile"]["plain"]["launches_per_step"] > 0
    assert [r["tokens"] for r in parts["cost_curve"]["rows"]] == [1, 4]
    systems = parts["smollm2"]["float32"]["systems"]
    assert set(systems) == {"plain", "tokens=16"}
    # the LM head padded to more rows gives the lone row's logits (float32 here)
    assert all(r["max_abs_diff"] < 1e-5 for r in parts["head"]["alone"].values())
    assert set(parts["head"]["step"]) == {"head_rows=1", "head_rows=2"}
    assert [(r["layout"], r["batch"]) for r in parts["triton"]["rows"]] == [("16", 1), ("plain", 2)]
    assert all(s["equal_to_plain"] == 2 for s in systems.values())  # the dry run's 2 prompts
    assert out.with_suffix(".md").read_text().startswith("# GPU step report")
