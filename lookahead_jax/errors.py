"""Errors that describe bad input. The CLIs print their message on one line and exit 2.

They subclass the builtin exceptions a Python caller expects (`ValueError`,
`FileNotFoundError`), so library users can catch either.

A message names what a front end calls its own way through slots, `${name}`: the request
it is about (`${request}`: "prompt 3" to the library, "the prompt" to the server, whose
client never saw the engine's request id) and the settings in WORDS. `str(e)` is the
message in the library's and the CLI's words; `e.render(words)` in a front end's (the
server's: server/app.py). No front end rewrites a message's text.
"""

import re
from collections.abc import Mapping

_SLOT = re.compile(r"\$\{(\w+)\}")
# The library's and the CLI's words for a message's slots (the server has its own)
WORDS = {
    "max_new_tokens": "max_new_tokens (--max-new-tokens)",
    "engine_max_new_tokens": "this engine's max_new_tokens (--max-new-tokens)",
    "max_prompt_tokens": "this engine's max_prompt_tokens (--max-prompt-tokens)",
}


class UserInputError(ValueError):
    """A value the user gave (flag, argument, config field) that cannot be used. `field`
    names the request field it is about where there is one (the engine's checks of a
    request: "prompt", "max_new_tokens", "seed", "stop", "id"), so that a front end can
    name its own (the server's OpenAI `param`). `values`: what the message's slots hold
    for this error (`request`)."""

    def __init__(self, message: str = "", field: str | None = None, **values: str):
        super().__init__(message)
        self.template, self.field, self.values = message, field, dict(values)

    def render(self, words: Mapping[str, str] | None = None) -> str:
        """The message, its slots filled: by `words` first, then this error's values,
        then the library's WORDS."""
        if "${" not in self.template:
            return self.template
        filled = {**WORDS, **self.values, **(words or {})}
        # only ${name} slots with a filling: other text ($, $$, an unknown ${x}) as it is
        return _SLOT.sub(lambda m: filled.get(m.group(1), m.group(0)), self.template)

    def __str__(self) -> str:
        return self.render()


class MissingFileError(UserInputError, FileNotFoundError):
    """A path the user named does not exist or is not the expected kind of file."""


class CheckpointError(UserInputError):
    """A checkpoint directory that is incomplete, damaged or of an unknown format."""
