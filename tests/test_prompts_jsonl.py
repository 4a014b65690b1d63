"""The one prompt-file reader (prompts_jsonl.py) that generate --prompts, training and the
benchmarks share: its keys, and each bad line as `FILE line N: ...` (no model here; the
callers' own tests run it through their commands)."""

import json
from pathlib import Path

import pytest

from lookahead_jax import prompts_jsonl
from lookahead_jax.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]


def test_every_key_is_read_and_blank_lines_are_skipped():
    text = "\n".join(
        [
            json.dumps({"id": "a", "prompt": "Hi", "max_new_tokens": 4, "temperature": 0.5}),
            "",
            "   ",
            json.dumps({"messages": [{"role": "user", "content": "Yo"}], "top_k": 3}),
            json.dumps({"question_id": 81, "category": "writing", "turns": ["One", "Two"]}),
            json.dumps({"prompt": "x", "top_p": 1, "reference": ["ignored"]}),
        ]
    )
    a, b, c, d = prompts_jsonl.parse(text, "f.jsonl")
    assert (a.number, a.id, a.prompt, a.max_new_tokens, a.temperature) == (1, "a", "Hi", 4, 0.5)
    assert (b.number, b.id, b.prompt, b.top_k) == (4, 4, [{"role": "user", "content": "Yo"}], 3)
    assert (c.id, c.category, c.prompt) == (81, "writing", "One")  # MT-bench: the first turn
    assert (d.number, d.id, d.top_p, d.max_new_tokens) == (6, 6, 1, None)


@pytest.mark.parametrize(
    "line,needle",
    [
        ("{not json", "not JSON (Expecting property name"),
        ('["a"]', "expected a JSON object, got list"),
        ('{"prompt": "x", "colour": 1}', "unknown key 'colour' (known keys: id,"),
        ('{"id": 3}', 'give exactly one of "prompt"'),
        ('{"prompt": "x", "turns": ["y"]}', 'give exactly one of "prompt"'),
        ('{"prompt": 7}', "prompt must be a non-empty string, got 7"),
        ('{"prompt": "  "}', "prompt must be a non-empty string"),
        ('{"turns": []}', "turns must be a non-empty list of strings"),
        ('{"turns": [""]}', "turns[0] must be a non-empty string"),
        ('{"messages": [{"role": "user"}]}', "messages[0] must be an object"),
        ('{"id": 1.5, "prompt": "x"}', "id must be an integer or a string, got 1.5"),
        ('{"id": 1, "question_id": 1, "prompt": "x"}', 'give one of "id" and "question_id"'),
        ('{"prompt": "x", "category": 3}', "category must be a string"),
        ('{"prompt": "x", "max_new_tokens": true}', "max_new_tokens must be an integer > 0"),
        ('{"prompt": "x", "temperature": -1}', "temperature must be a finite number >= 0"),
        ('{"prompt": "x", "top_k": "3"}', "top_k must be an integer >= 0"),
        ('{"prompt": "x", "top_p": 0}', "top_p must be a number in (0, 1]"),
        ('{"id": "first", "prompt": "again"}', "id 'first' is used again (first on line 1)"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(line, needle):
    text = json.dumps({"id": "first", "prompt": "ok"}) + "\n\n" + line + "\n"
    with pytest.raises(UserInputError) as e:
        prompts_jsonl.parse(text, "in.jsonl")
    assert str(e.value).startswith("in.jsonl line 3: ") and needle in str(e.value), e.value


def test_a_file_without_prompts_is_an_error():
    with pytest.raises(UserInputError, match=r"^empty\.jsonl holds no prompts$"):
        prompts_jsonl.parse("\n  \n", "empty.jsonl")


@pytest.mark.parametrize("name", ["mt_bench", "code"])
def test_the_committed_benchmark_sets_read(name):
    records = prompts_jsonl.parse((ROOT / f"benchmarks/prompts/{name}.jsonl").read_text(), name)
    assert len(records) == {"mt_bench": 80, "code": 20}[name]
    assert all(isinstance(r.prompt, str) and r.category for r in records)
