"""Dataset mode of the command line: a JSONL file of prompts in, one JSONL line per prompt
out, through the engine (engine/continuous.py).

Input, one JSON object a line (blank lines are skipped):

    {"id": "q1", "prompt": "Write a haiku", "max_new_tokens": 64, "temperature": 0.7}
    {"messages": [{"role": "user", "content": "Hi"}]}

`prompt` (text) or `messages` (chat turns, through the tokenizer's chat template), and
optionally `id` (an integer or a string; default: the line number), `max_new_tokens`,
`temperature`, `top_k`, `top_p` (default: the command line's). Every line is checked
before any decoding starts; a bad one stops the job with `FILE line N: what is wrong`
(exit 2) and the output file untouched.

Output: one object a line, {"id", "text", "token_ids", "new_tokens", "finish", "steps",
"prompt_tokens", "time_s"}, in finish order, each written whole and flushed, so Ctrl-C or
a crash leaves only whole lines (a torn last line, from a kill mid-write, is cut off when
the job is run again). Running the same command again skips the ids already in the
output and decodes the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from lookahead_jax.cli.exits import read_user_file
from lookahead_jax.engine import inputs
from lookahead_jax.errors import UserInputError

KEYS = ("id", "prompt", "messages", "max_new_tokens", "temperature", "top_k", "top_p")
STDIO = "-"


@dataclasses.dataclass(frozen=True)
class Line:
    """One checked input line: its id, token ids and settings (None = default)."""

    id: int | str
    token_ids: list[int]
    max_new_tokens: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_settings(obj: dict) -> str | None:
    """What is wrong with a line's optional settings, or None."""
    m = obj.get("max_new_tokens")
    if m is not None and not (_int(m) and m > 0):
        return f"max_new_tokens must be an integer > 0, got {m!r}"
    t = obj.get("temperature")
    if t is not None and not (_number(t) and 0 <= t < float("inf")):
        return f"temperature must be a finite number >= 0, got {t!r}"
    k = obj.get("top_k")
    if k is not None and not (_int(k) and k >= 0):
        return f"top_k must be an integer >= 0, got {k!r}"
    p = obj.get("top_p")
    if p is not None and not (_number(p) and 0 < p <= 1):
        return f"top_p must be a number in (0, 1], got {p!r}"
    return None


def _check_messages(messages) -> str | None:
    if not isinstance(messages, list) or not messages:
        return 'messages must be a non-empty list of {"role", "content"} objects'
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            return f'messages[{i}] must be an object with string "role" and "content"'
    return None


def read_prompts(
    path: str, tokenizer, vocab: int, max_context: int, max_new_tokens: int, chat: bool
) -> list[Line]:
    """Every line of `path` ('-': stdin) parsed, tokenized (inputs.encode_prompt) and
    checked; the first bad line raises UserInputError('FILE line N: ...')."""
    name = "stdin" if path == STDIO else path
    text = sys.stdin.read() if path == STDIO else read_user_file(path, "--prompts", "a JSONL file")
    out: list[Line] = []
    first_line_of: dict = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue

        def bad(what: str, number=number):
            return UserInputError(f"{name} line {number}: {what}")

        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise bad(f"not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise bad(f"expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - set(KEYS))
        if unknown:
            raise bad(f"unknown key {unknown[0]!r} (known keys: {', '.join(KEYS)})")
        if ("prompt" in obj) == ("messages" in obj):
            raise bad('give exactly one of "prompt" (text) and "messages" (chat turns)')
        pid = obj.get("id", number)
        if not (_int(pid) or isinstance(pid, str)):
            raise bad(f"id must be an integer or a string, got {pid!r}")
        if pid in first_line_of:
            raise bad(f"id {pid!r} is used again (first on line {first_line_of[pid]})")
        first_line_of[pid] = number
        if (problem := _check_settings(obj)) is not None:
            raise bad(problem)
        if "messages" in obj:
            prompt = obj["messages"]
            if (problem := _check_messages(prompt)) is not None:
                raise bad(problem)
        else:
            prompt = obj["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise bad(f"prompt must be a non-empty string, got {prompt!r}")
        try:
            ids = inputs.encode_prompt(tokenizer, vocab, prompt, chat, "the prompt")
            inputs.check_context(max_context, len(ids), obj.get("max_new_tokens") or max_new_tokens)
        except UserInputError as e:
            raise bad(str(e)) from None
        out.append(
            Line(
                pid,
                ids,
                obj.get("max_new_tokens"),
                obj.get("temperature"),
                obj.get("top_k"),
                obj.get("top_p"),
            )
        )
    if not out:
        raise UserInputError(f"{name} holds no prompts")
    return out


def done_ids(path: str) -> set:
    """The ids already in an output file (read only: nothing is changed here). A torn
    last line (no newline: a kill mid-write) does not count; any other line that is not
    a JSON object with an id means the file is not this command's output."""
    if path == STDIO or not os.path.exists(path):
        return set()
    with open(path, "rb") as f:
        data = f.read()
    ids = set()
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            ids.add(obj["id"])
        except (ValueError, KeyError, TypeError):
            raise UserInputError(
                f"{path} line {number}: not a result line of this command; give another "
                "--output (a rerun appends to it and skips the ids already there)"
            ) from None
    return ids


class ResultWriter:
    """Appends one whole, flushed line per result to a file ('-': stdout)."""

    def __init__(self, path: str):
        self.path = path
        if path == STDIO:
            self._file = sys.stdout.buffer
            return
        _cut_torn_line(path)
        self._file = open(path, "ab")  # noqa: SIM115 (closed by close())

    def write(self, record: dict) -> None:
        self._file.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        if self.path != STDIO:
            self._file.close()


def _cut_torn_line(path: str) -> None:
    """Drop a last line without its newline (left by a kill in the middle of a write)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def record(result) -> dict:
    """The output line of one engine Result."""
    return {
        "id": result.id,
        "text": result.text,
        "token_ids": result.token_ids,
        "new_tokens": len(result.token_ids),
        "finish": result.finish,
        "steps": result.steps,
        "prompt_tokens": result.prompt_tokens,
        "time_s": round(result.time_s, 4),
    }
