"""Incremental detokenisation for streaming output.

Feed the tokens of each decoding step (`add_step`); get back the text that became
complete — a multi-byte character split over tokens waits for its last byte, and text
the detokeniser would rewrite is held back. Within a step the first token is the
model's own and the rest were verified guesses: with `color`, guesses are shown in
green. `steps_of` regroups a finished output by step, so the same rule colors it.
"""

from __future__ import annotations

from itertools import groupby

GREEN, RESET = "\x1b[32m", "\x1b[0m"


class StreamDetokenizer:
    def __init__(self, tokenizer, color: bool = False):
        self.tokenizer, self.color = tokenizer, color
        self.ids: list[int] = []
        self.shown = ""

    def add_step(self, ids: list[int]) -> str:
        """The text completed by one step's tokens (possibly empty)."""
        out = []
        for i, token in enumerate(ids):
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids)
            if text.endswith("\ufffd") or not text.startswith(self.shown):
                continue  # incomplete character, or the detokeniser rewrote earlier text
            piece = text[len(self.shown) :]
            out.append(f"{GREEN}{piece}{RESET}" if self.color and i > 0 and piece else piece)
            self.shown = text
        return "".join(out)

    def flush(self) -> str:
        """Whatever text is still held back."""
        text = self.tokenizer.decode(self.ids)
        rest = text[len(self.shown) :] if text.startswith(self.shown) else ""
        self.shown = text
        return rest


def steps_of(token_ids: list[int], step_of_token: list[int]) -> list[list[int]]:
    """A row's new tokens grouped by the step that emitted them (the prefill's first
    token on its own)."""
    pairs = zip(token_ids, step_of_token, strict=True)
    return [[t for t, _ in group] for _, group in groupby(pairs, key=lambda p: p[1])]
