"""Prompt files: one JSON object a line, read alike by `generate --prompts` (cli/dataset.py),
`training --prompts` (training/__main__.py) and the benchmarks' prompt sets
(scripts/bench/prompts.py).

    {"id": "q1", "prompt": "Write a haiku", "max_new_tokens": 64, "temperature": 0.7}
    {"messages": [{"role": "user", "content": "Hi"}]}
    {"question_id": 81, "category": "writing", "turns": ["Compose ...", "Rewrite ..."]}

The keys, one set for every reader (any other key is an error, so that a misspelt one
stops the job instead of being ignored):

    prompt          the prompt text                                    } exactly
    messages        chat turns, [{"role": ..., "content": ...}, ...]   } one of
    turns           MT-bench's user turns (strings); the first is the prompt } the three
    id              an integer or a string, unique in the file (default: `question_id`,
                    else the line number)
    question_id     MT-bench's name for `id` (give one of the two)
    category        a string (the benchmarks group prompts by it)
    reference       MT-bench's reference answers: allowed, not read
    max_new_tokens  this prompt's budget, an integer > 0              } generate's dataset
    temperature     a finite number >= 0                              } mode reads them;
    top_k           an integer >= 0 (0: off)                          } training and the
    top_p           a number in (0, 1]                                } benchmarks do not
    json_schema     structured output: a JSON schema (an object) the  }
                    answer must be valid under (docs/engine.md)        }
    regex           ... or a regex the answer must match (a string)    }

Blank lines are skipped. Every line is checked before any is used; the first bad one
raises `UserInputError("FILE line N: what is wrong")` (`line_error`, which the callers
also use for what they check later, such as a prompt too long for the context).
"""

from __future__ import annotations

import dataclasses
import json

from lookahead_jax.errors import UserInputError

PROMPT_KEYS = ("prompt", "messages", "turns")
KEYS = ("id", "question_id", "category", "reference", *PROMPT_KEYS)
KEYS += ("max_new_tokens", "temperature", "top_k", "top_p", "json_schema", "regex")


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """One checked line: the prompt (text, or chat messages) and its optional settings
    (None: the caller's default)."""

    number: int  # the line in the file, from 1
    id: int | str
    prompt: str | list[dict]
    category: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    json_schema: dict | None = None
    regex: str | None = None


def line_error(name: str, number: int, what: str) -> UserInputError:
    """The one error format for a prompt file: `FILE line N: what is wrong`."""
    return UserInputError(f"{name} line {number}: {what}")


def parse(text: str, name: str) -> list[PromptRecord]:
    """The records of a prompt file's `text`; `name` is what errors call the file (its
    path, or 'stdin'). A file with no prompt is an error too."""
    records: list[PromptRecord] = []
    first_line_of: dict = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = _record(raw, number)
        except UserInputError as e:
            raise line_error(name, number, str(e)) from None
        if record.id in first_line_of:
            what = f"id {record.id!r} is used again (first on line {first_line_of[record.id]})"
            raise line_error(name, number, what)
        first_line_of[record.id] = number
        records.append(record)
    if not records:
        raise UserInputError(f"{name} holds no prompts")
    return records


def _record(raw: str, number: int) -> PromptRecord:
    """One line checked; what is wrong raises UserInputError (without the line)."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UserInputError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise UserInputError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(KEYS))
    if unknown:
        raise UserInputError(f"unknown key {unknown[0]!r} (known keys: {', '.join(KEYS)})")
    given = [k for k in PROMPT_KEYS if k in obj]
    if len(given) != 1:
        raise UserInputError(
            'give exactly one of "prompt" (text), "messages" (chat turns) and "turns" '
            "(MT-bench's user turns)"
        )
    if "id" in obj and "question_id" in obj:
        raise UserInputError('give one of "id" and "question_id" (MT-bench\'s name for it)')
    pid = obj.get("id", obj.get("question_id", number))
    if not (_int(pid) or isinstance(pid, str)):
        raise UserInputError(f"id must be an integer or a string, got {pid!r}")
    _check_settings(obj)
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise UserInputError(f"category must be a string, got {category!r}")
    return PromptRecord(
        number=number,
        id=pid,
        prompt=_prompt(obj, given[0]),
        category=category,
        max_new_tokens=obj.get("max_new_tokens"),
        temperature=obj.get("temperature"),
        top_k=obj.get("top_k"),
        top_p=obj.get("top_p"),
        json_schema=obj.get("json_schema"),
        regex=obj.get("regex"),
    )


def _prompt(obj: dict, key: str) -> str | list[dict]:
    value = obj[key]
    if key == "messages":
        if not isinstance(value, list) or not value:
            raise UserInputError('messages must be a non-empty list of {"role", "content"} objects')
        for i, m in enumerate(value):
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise UserInputError(
                    f'messages[{i}] must be an object with string "role" and "content"'
                )
        return value
    if key == "turns":
        if not (isinstance(value, list) and value and all(isinstance(t, str) for t in value)):
            raise UserInputError(f"turns must be a non-empty list of strings, got {value!r}")
        key, value = "turns[0]", value[0]
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_settings(obj: dict) -> None:
    m = obj.get("max_new_tokens")
    if m is not None and not (_int(m) and m > 0):
        raise UserInputError(f"max_new_tokens must be an integer > 0, got {m!r}")
    t = obj.get("temperature")
    if t is not None and not (_number(t) and 0 <= t < float("inf")):
        raise UserInputError(f"temperature must be a finite number >= 0, got {t!r}")
    k = obj.get("top_k")
    if k is not None and not (_int(k) and k >= 0):
        raise UserInputError(f"top_k must be an integer >= 0, got {k!r}")
    p = obj.get("top_p")
    if p is not None and not (_number(p) and 0 < p <= 1):
        raise UserInputError(f"top_p must be a number in (0, 1], got {p!r}")
    schema, regex = obj.get("json_schema"), obj.get("regex")
    if schema is not None and not isinstance(schema, dict):
        raise UserInputError(f"json_schema must be a JSON object (a schema), got {schema!r}")
    if regex is not None and not (isinstance(regex, str) and regex):
        raise UserInputError(f"regex must be a non-empty string, got {regex!r}")
    if schema is not None and regex is not None:
        raise UserInputError("give json_schema or regex, not both")
    if schema is not None:  # what the grammar can enforce, before anything loads
        from lookahead_jax.grammar import json_schema

        json_schema.check(schema)
    if regex is not None:
        from lookahead_jax.grammar import check_regex

        check_regex(regex)
