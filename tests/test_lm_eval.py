"""lm-evaluation-harness against the server, as researchers evaluate a served model:
`lm_eval --model local-completions` with its default settings (token-id prompts; for
multiple choice `echo`, `logprobs` 1, `max_tokens` 1) on two tiny tasks written here (no
download), each document's answer equal to `lm_eval --model hf` on the same weights."""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiny
from tests.test_server import SERVER_FLAGS, start_server, stop_server

pytest.importorskip("lm_eval")

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "dog",
    "ran",
    "to",
    "park",
    "sun",
    "is",
    "hot",
    "sky",
    "blue",
    "red",
    "car",
    "fast",
]


def write_tasks(root: Path) -> None:
    """A multiple-choice task (loglikelihoods) and a generate_until task over local JSON."""
    import random

    rng = random.Random(0)
    phrase = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    mc = [
        {"question": phrase(5), "choices": [" " + phrase(rng.randint(1, 3)) for _ in range(3)],
         "answer": i % 3}
        for i in range(8)
    ]  # fmt: skip
    gen = [{"question": phrase(4) + ":", "answer": " cat"} for _ in range(6)]
    for name, rows in (("mc", mc), ("gen", gen)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: '{{question}}'\n"
    (root / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    (root / "tiny_gen.yaml").write_text(
        f"task: tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )


def lm_eval(out: Path, tasks: Path, model: str, model_args: str, *extra) -> dict:
    """Run the lm_eval command; {task: its per-document samples}."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [str(Path(sys.executable).parent / "lm_eval"), "--model", model, "--model_args",
           model_args, "--tasks", "tiny_mc,tiny_gen", "--include_path", str(tasks),
           "--output_path", str(out), "--log_samples", *extra]  # fmt: skip
    # (under pytest's 300 s: the command is killed and its stderr shown)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        task: [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).open()]
        for task in ("tiny_mc", "tiny_gen")
    }


def test_lm_eval_local_completions_agrees_with_its_hf_backend(tiny_ckpts, tiny_text_ckpt, tmp_path):
    hf_dir = tmp_path / "hf"  # the tiny model's HF weights with the server's tokenizer
    shutil.copytree(tiny_ckpts["gqa"][0], hf_dir)
    tiny.add_tokenizer(hf_dir)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_tasks(tasks)
    # the HF reference runs while the server loads and warms up
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        hf_run = pool.submit(lm_eval, tmp_path / "hf_out", tasks, "hf",
                             f"pretrained={hf_dir},dtype=float64", "--device", "cpu",
                             "--batch_size", "1")  # fmt: skip
        # test_server.py's server (its flags, float64): its warm-up's programs come from
        # the run's compile cache (test_server.py is handed out earlier: LONGEST_FILES)
        # rather than a float32 set of its own (2-core Intel Xeon: 63.5 s with its own
        # flags, 55.0 s with these after test_server.py; alone with an empty cache these
        # compile the three row buckets' loops where its own compiled one); the HF
        # reference in float64 as the server (float32 logprobs: test_logprobs.py)
        proc, url = start_server(tiny_text_ckpt, *SERVER_FLAGS, model_name=str(hf_dir))
        try:
            args = f"model={hf_dir},base_url={url}/v1/completions"
            got = lm_eval(tmp_path / "server_out", tasks, "local-completions", args)
        finally:
            code, err = stop_server(proc)
        want = hf_run.result()
    assert code == 0, err
    for g, w in zip(got["tiny_mc"], want["tiny_mc"], strict=True):
        ours = [(float(ll), greedy) for ll, greedy in g["filtered_resps"]]
        theirs = [(float(ll), greedy) for ll, greedy in w["filtered_resps"]]
        assert g["acc"] == w["acc"], (g["doc_id"], ours, theirs)
        assert [x[1] for x in ours] == [x[1] for x in theirs]  # is_greedy, per choice
        assert [x[0] for x in ours] == pytest.approx([x[0] for x in theirs], abs=1e-4)
    for g, w in zip(got["tiny_gen"], want["tiny_gen"], strict=True):
        assert g["filtered_resps"] == w["filtered_resps"], g["doc_id"]
