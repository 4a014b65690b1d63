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


# Tokens of context decoded before the unshown ones: a token's text can depend on the
# tokens before it (a SentencePiece word start, a character split over byte tokens), never
# on more than a few. Decoding a window, not the whole history, keeps a token O(1).
CONTEXT = 6


class StreamDetokenizer:
    def __init__(self, tokenizer, color: bool = False):
        self.tokenizer, self.color = tokenizer, color
        self.ids: list[int] = []
        self.shown_ids = 0  # the first tokens whose text is out

    def _unshown(self) -> tuple[str, str]:
        """(the text of the context before the unshown tokens, that and theirs)."""
        start = max(0, self.shown_ids - CONTEXT)
        decode = self.tokenizer.decode
        return decode(self.ids[start : self.shown_ids]), decode(self.ids[start:])

    def add_step(self, ids: list[int]) -> str:
        """The text completed by one step's tokens (possibly empty)."""
        out = []
        for i, token in enumerate(ids):
            self.ids.append(token)
            before, text = self._unshown()
            if text.endswith("\ufffd") or not text.startswith(before):
                continue  # incomplete character, or the detokeniser rewrote earlier text
            piece = text[len(before) :]
            out.append(f"{GREEN}{piece}{RESET}" if self.color and i > 0 and piece else piece)
            self.shown_ids = len(self.ids)
        return "".join(out)

    def flush(self) -> str:
        """Whatever text is still held back."""
        before, text = self._unshown()
        self.shown_ids = len(self.ids)
        return text[len(before) :] if text.startswith(before) else ""


def steps_of(token_ids: list[int], step_of_token: list[int]) -> list[list[int]]:
    """A row's new tokens grouped by the step that emitted them (the prefill's first
    token on its own)."""
    pairs = zip(token_ids, step_of_token, strict=True)
    return [[t for t, _ in group] for _, group in groupby(pairs, key=lambda p: p[1])]
