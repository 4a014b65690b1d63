"""The generate CLI: the --json contract, streaming, and that it equals the Python API."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lookahead_jax as lj

JSON_FIELDS = {
    "text",
    "token_ids",
    "new_tokens",
    "steps",
    "compression",
    "decode_s",
    "tokens_per_s",
    "prefill_s",
    "compile_s",
    "config",
}


def run_cli(*args, timeout=300, env_extra=None, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "lookahead_jax.generate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def cache_without_acceptance(tmp_path):
    """A cache root for one CLI run: the suite's seeded cost curves, built kernels and
    models, but not the acceptance the suite's other `auto` runs recorded for the tiny
    model (its weights are random, so their guesses mostly miss: what they recorded can
    make `auto` choose plain decoding, which this test must not depend on)."""
    shared = Path(os.environ["LOOKAHEAD_JAX_CACHE"])
    own = tmp_path / "cache"
    (own / "autotune").mkdir(parents=True)
    for curve in (shared / "autotune").glob("cost-*.json"):
        shutil.copy(curve, own / "autotune")
    for part in shared.iterdir():
        if part.name != "autotune":
            (own / part.name).symlink_to(part)
    return own


def test_json_contract_and_api_agreement(tiny_text_ckpt, tmp_path):
    prompt = "List three colours."
    r = run_cli(
        "--ckpt",
        str(tiny_text_ckpt),
        "--prompt",
        prompt,  # chat by default: the tokenizer has a template
        "--max-new-tokens",
        "24",
        "--json",
        env_extra={"LOOKAHEAD_JAX_CACHE": str(cache_without_acceptance(tmp_path))},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert set(rec) >= JSON_FIELDS
    assert rec["new_tokens"] == len(rec["token_ids"]) <= 24
    # tokens its steps emitted a step: the prefill's first is not a step's, an EOS is
    emitted = round(rec["compression"] * rec["steps"])
    assert emitted in (rec["new_tokens"] - 1, rec["new_tokens"]), rec
    assert rec["config"]["dtype"] == "float32"
    # the default is auto: the record says what it chose and ran exactly that. With the
    # cost curve conftest seeds for this model's shapes a small layout wins, and on this
    # prompt its guesses land: the agreement with plain decoding below is not vacuous
    la, auto = rec["config"]["lookahead"], rec["config"]["lookahead_auto"]
    assert auto["chosen"] == (None if la is None else la["name"])
    assert la is not None and rec["steps"] < rec["new_tokens"] - 1, rec
    api = lj.generate(
        lj.load(tiny_text_ckpt), [prompt], max_new_tokens=24, chat=True, lookahead=None
    )
    assert rec["token_ids"] == api.token_ids[0]
    assert rec["text"] == api.texts[0]
    assert "tokens/s" in r.stderr


def test_stream_plain_equals_lookahead_text(tiny_text_ckpt):
    # a prompt on which the tiny model repeats itself, so lookahead's guesses land (with
    # a chat template it ends its answer after a few tokens, one a step)
    common = ("--ckpt", str(tiny_text_ckpt), "--prompt", "abcabcabc", "--max-new-tokens", "40",
              "--no-chat")  # fmt: skip
    a = run_cli(*common, "--stream", "--no-lookahead")
    b = run_cli(*common, "--stream", "--lookahead", "4,4,4", "--color")  # into a pipe:
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr  # no escape codes
    assert a.stdout == b.stdout and len(a.stdout.strip()) >= 20
    assert "[plain]" in a.stderr and "[lookahead 4,4,4]" in b.stderr
    # not vacuous: fewer steps than tokens after the prefill's, so guesses were accepted
    tokens, steps = map(int, re.search(r"\] (\d+) tokens in .*?, (\d+) steps", b.stderr).groups())
    assert steps < tokens - 1, b.stderr


def test_chat_by_default_where_the_tokenizer_has_a_template_and_empty_answers_say_why():
    from types import SimpleNamespace as NS

    from lookahead_jax.checkpoints.tokenizer import Tokenizer
    from lookahead_jax.cli.report import empty_answer_note

    templated, bare = NS(chat_template="{{ messages }}"), NS(chat_template=None)
    chat_for = lambda flag, tokenizer: Tokenizer.wants_chat(tokenizer, flag)  # noqa: E731
    assert chat_for(None, templated) and not chat_for(None, bare)  # the default
    assert not chat_for(False, templated) and chat_for(True, bare)  # --no-chat, --chat
    out = lambda ids, interrupted=False: NS(token_ids=[ids], stats=NS(interrupted=interrupted))  # noqa: E731
    assert empty_answer_note(out([5]), True) is None
    assert empty_answer_note(out([], interrupted=True), True) is None
    assert "--no-chat" in empty_answer_note(out([]), True)
    assert "--chat" in empty_answer_note(out([]), False)


def test_color_only_where_asked_or_on_a_terminal(monkeypatch):
    from lookahead_jax.cli.report import wants_color

    tty, pipe = type("T", (), {"isatty": lambda self: True})(), io.StringIO()
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert wants_color("auto", tty) and not wants_color("auto", pipe)
    assert wants_color("always", pipe) and not wants_color("never", tty)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color("auto", tty)


def test_bad_flags_exit_2_before_loading_anything():
    # one fresh interpreter as a smoke check; every bad flag has its row in
    # tests/test_bad_input.py (a forked process each, against a corrupted checkpoint)
    for args, needle in [
        (["--prompt", "x", "--lookahead", "5,x,7"], "--lookahead"),
    ]:
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_single_prompt_turns_off_ynn_dot_fusions_unless_the_user_chose(monkeypatch):
    """The command's one-shot XLA flag (cli/generate.py: a program's first run packs its
    weights with them) goes into XLA_FLAGS beside the user's, not over their choice."""
    from lookahead_jax.cli import generate as cli

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    cli.one_shot_xla_flags()
    assert (
        os.environ["XLA_FLAGS"]
        == f"--xla_force_host_platform_device_count=1 {cli.ONE_SHOT_XLA_FLAG}"
    )
    chosen = "--xla_cpu_experimental_ynn_fusion_type=dot"
    monkeypatch.setenv("XLA_FLAGS", chosen)
    cli.one_shot_xla_flags()
    assert os.environ["XLA_FLAGS"] == chosen
