"""Dataset mode of the CLI (--prompts / --output): bad lines stop the job before any
decoding with the output untouched; Ctrl-C leaves whole lines; a rerun finishes the rest
and skips what is done; stdin and stdout work. Run in this process (main()), so the
compiled programs are shared between the runs."""

import io
import json

import pytest

from lookahead_jax.cli import dataset, generate

PROMPTS = [
    {"id": "haiku", "prompt": "Write a haiku about the sea."},
    {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_new_tokens": 3},
    {"prompt": "def fib(n):", "max_new_tokens": 1},
    {"id": 9, "prompt": "List three colors:", "temperature": 0.7},
]
ARGS = ["--max-new-tokens", "6", "--no-lookahead", "--batch", "2"]


def write_lines(path, lines):
    """Strings as they are, objects as one JSON line each."""
    path.write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in lines))


def ids_of(text: str) -> list:
    return [json.loads(line)["id"] for line in text.splitlines()]


@pytest.mark.parametrize(
    "line,needle",
    [
        ("{not json\n", "not JSON"),
        ('["a"]\n', "expected a JSON object"),
        ('{"prompt": "x", "colour": 1}\n', "unknown key 'colour'"),
        ('{"id": 3}\n', 'exactly one of "prompt"'),
        ('{"prompt": "  "}\n', "non-empty string"),
        ('{"prompt": "x", "max_new_tokens": 0}\n', "max_new_tokens must be"),
        ('{"prompt": "x", "top_p": 2}\n', "top_p must be"),
        ('{"prompt": "x", "temperature": Infinity}\n', "temperature must be"),
        ('{"messages": [{"role": "user"}]}\n', "messages[0] must be"),
        ('{"id": "haiku", "prompt": "again"}\n', "used again (first on line 1)"),
        ('{"prompt": "' + "word " * 9000 + '"}\n', "exceeds the model's context"),
        ('{"prompt": "x", "json_schema": "nope"}\n', "json_schema must be a JSON object"),
        ('{"prompt": "x", "regex": "a", "json_schema": {}}\n', "not both"),
        ('{"prompt": "x", "json_schema": {"minimum": 1}}\n', "$.minimum ('minimum') is not"),
        ('{"prompt": "x", "regex": "(a"}\n', "not a valid regular expression"),
    ],
)
def test_bad_line_exits_2_naming_it_and_leaves_output_untouched(
    tiny_text_ckpt, tmp_path, capsys, line, needle
):
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(prompts, [PROMPTS[0], "\n", line])
    out.write_text('{"id": "old"}\n')
    code = generate.main(
        ["--ckpt", str(tiny_text_ckpt), "--prompts", str(prompts), "--output", str(out), *ARGS]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{prompts} line 3: " in err and needle in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert out.read_text() == '{"id": "old"}\n'


def test_dataset_flags_are_checked_before_anything_loads(tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    write_lines(prompts, PROMPTS)
    for argv, needle in [
        (["--prompts", str(prompts), "--output", str(prompts)], "must not be the --prompts"),
        (["--prompt", "x", "--batch", "2"], "--batch is for dataset mode"),
        (["--prompt", "x", "--output", "o.jsonl"], "--output is for dataset mode"),
        (["--prompts", str(prompts), "--stream"], "--stream does not apply"),
        (["--prompts", str(prompts), "--batch", "0"], "batch (--batch) must be an integer >= 1"),
        (["--prompts", str(prompts), "--prefix-cache-mb", "inf"], "finite number >= 0"),
        (["--prompt", "x", "--prefix-cache-mb", "64"], "--prefix-cache-mb is for dataset mode"),
        (
            ["--prompts", str(prompts), "--output", str(tmp_path / "no" / "o.jsonl")],
            "does not exist",
        ),
        (["--prompts", str(prompts), "--output", str(tmp_path)], "cannot be written"),
    ]:
        assert generate.main(["--ckpt", "/nonexistent", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err, (argv, err)


def test_interrupt_then_rerun_finishes_the_rest_and_stdio_agrees(
    tiny_text_ckpt, tmp_path, capsys, monkeypatch
):
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(prompts, PROMPTS)
    out.write_bytes(b'{"id": "torn", "te')  # a kill in the middle of a write
    argv = ["--ckpt", str(tiny_text_ckpt), "--prompts", str(prompts), "--output", str(out), *ARGS]

    # Ctrl-C after the first result is written
    real_write = dataset.ResultWriter.write
    calls = []

    def write_then_interrupt(self, record):
        real_write(self, record)
        calls.append(record["id"])
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset.ResultWriter, "write", write_then_interrupt)
    assert generate.main(argv) == 130
    assert "run the same command again" in capsys.readouterr().err
    first = out.read_text()
    assert ids_of(first) == calls  # the torn line is gone, one whole line written

    monkeypatch.setattr(dataset.ResultWriter, "write", real_write)
    capsys.readouterr()
    assert generate.main(argv) == 0
    err = capsys.readouterr().err
    assert f"{len(calls)} of 4 prompts are already in" in err  # what a resumed run skips
    assert "tokens/s over" in err and "with compiling" in err  # what each figure covers
    text = out.read_text()
    assert text.startswith(first) and text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]
    assert sorted(map(str, ids_of(text))) == sorted(["haiku", "2", "3", "9"])
    by_id = {r["id"]: r for r in records}
    assert by_id[3]["new_tokens"] == 1 and by_id[3]["finish"] == "length"
    assert by_id[2]["new_tokens"] <= 3
    # a text prompt goes through the chat template by default (a character a token here)
    assert by_id["haiku"]["prompt_tokens"] > len("Write a haiku about the sea.") + 1
    for r in records:
        assert set(r) == {
            "id",
            "text",
            "token_ids",
            "new_tokens",
            "finish",
            "steps",
            "prompt_tokens",
            "time_s",
        }
        assert len(r["token_ids"]) == r["new_tokens"] and isinstance(r["text"], str)
    capsys.readouterr()

    assert generate.main(argv) == 0  # nothing left to do
    assert "already in" in capsys.readouterr().err
    assert out.read_text() == text

    # stdin -> stdout: the same tokens
    monkeypatch.setattr("sys.stdin", io.StringIO(prompts.read_text()))
    assert generate.main(["--ckpt", str(tiny_text_ckpt), "--prompts", "-", *ARGS]) == 0
    piped = {r["id"]: r["token_ids"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert piped == {r["id"]: r["token_ids"] for r in records}


def test_ctrl_c_before_the_first_result_leaves_no_output_file(
    tiny_text_ckpt, tmp_path, capsys, monkeypatch
):
    import lookahead_jax as lj

    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(prompts, PROMPTS)

    def compiling(self, requests):  # interrupted before anything came back
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(lj.Engine, "run", compiling)
    argv = ["--ckpt", str(tiny_text_ckpt), "--prompts", str(prompts), "--output", str(out), *ARGS]
    assert generate.main(argv) == 130
    assert "0 of 4 prompts written" in capsys.readouterr().err
    assert not out.exists()


def test_lines_with_their_own_grammars(tiny_text_ckpt, tmp_path, capsys):
    """A line's "regex" or "json_schema" holds its answer to it (docs/engine.md), beside
    lines with none, in one run."""
    import re

    regex = r"[ab]{2,6}\."
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    lines = [
        {"id": "r", "prompt": "say ab", "regex": regex, "max_new_tokens": 12},
        {"id": "free", "prompt": "anything"},
        {"id": "j", "prompt": "json please", "json_schema": schema, "max_new_tokens": 16},
    ]
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_lines(prompts, lines)
    code = generate.main(
        ["--ckpt", str(tiny_text_ckpt), "--prompts", str(prompts), "--output", str(out), *ARGS]
    )
    assert code == 0, capsys.readouterr().err
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert got["r"]["finish"] == "eos" and re.fullmatch(regex, got["r"]["text"]), got["r"]
    assert got["j"]["finish"] == "eos" and json.loads(got["j"]["text"]) in (
        {"ok": True},
        {"ok": False},
    ), got["j"]


def test_a_single_prompt_with_a_grammar_and_bad_schemas_before_loading(
    tiny_text_ckpt, tmp_path, capsys
):
    import re

    args = ["--ckpt", str(tiny_text_ckpt), "--prompt", "x", "--max-new-tokens", "12", "--json"]
    code = generate.main([*args, "--no-lookahead", "--regex", r"[ab]{2,6}\."])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)
    assert re.fullmatch(r"[ab]{2,6}\.", record["text"]), record
    schema_file = tmp_path / "s.json"
    schema_file.write_text('{"type": "integer", "minimum": 1}')
    for bad, needle in (
        ('{"type": "integer", "minimum": 1}', r"$.minimum ('minimum') is not supported"),
        (str(schema_file), r"$.minimum ('minimum') is not supported"),
        ("{not json", "not valid JSON"),
        (str(tmp_path / "missing.json"), "missing.json"),
    ):
        code = generate.main(["--ckpt", "/nonexistent", "--prompt", "x", "--json-schema", bad])
        err = capsys.readouterr().err
        assert code == 2 and needle in err, err
