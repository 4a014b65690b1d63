"""Dataset mode of the command line: a JSONL file of prompts in, one JSONL line per prompt
out, through the engine (engine/continuous.py).

Input: a prompt file (prompts_jsonl.py has its keys), one JSON object a line:

    {"id": "q1", "prompt": "Write a haiku", "max_new_tokens": 64, "temperature": 0.7}
    {"messages": [{"role": "user", "content": "Hi"}]}

`messages` go through the tokenizer's chat template; a line's `max_new_tokens`,
`temperature`, `top_k` and `top_p` replace the command line's. Every line is checked
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

from lookahead_jax import prompts_jsonl
from lookahead_jax.cli.exits import read_user_file
from lookahead_jax.engine import inputs
from lookahead_jax.errors import UserInputError

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


def read_prompts(
    path: str, tokenizer, vocab: int, max_context: int, max_new_tokens: int, chat: bool
) -> list[Line]:
    """Every line of `path` ('-': stdin) parsed (prompts_jsonl), tokenized
    (inputs.encode_prompt) and checked; the first bad line raises
    UserInputError('FILE line N: ...')."""
    name = "stdin" if path == STDIO else path
    text = sys.stdin.read() if path == STDIO else read_user_file(path, "--prompts", "a JSONL file")
    out: list[Line] = []
    for r in prompts_jsonl.parse(text, name):
        try:
            ids = inputs.encode_prompt(tokenizer, vocab, r.prompt, chat, "the prompt")
            inputs.check_context(max_context, len(ids), r.max_new_tokens or max_new_tokens)
        except UserInputError as e:
            raise prompts_jsonl.line_error(name, r.number, str(e)) from None
        out.append(Line(r.id, ids, r.max_new_tokens, r.temperature, r.top_k, r.top_p))
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
    """Appends one whole, flushed line per result to a file ('-': stdout), opened at the
    first result (a run stopped before one, compiling, leaves no empty file behind)."""

    def __init__(self, path: str):
        self.path = path
        self._file = sys.stdout.buffer if path == STDIO else None

    def write(self, record: dict) -> None:
        if self._file is None:
            _cut_torn_line(self.path)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        self._file.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        if self.path != STDIO and self._file is not None:
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
