"""Tokens' logprobs in OpenAI's shapes (the engine's TokenLogprob: decoding/logprobs.py).

    completions  {"tokens": [str], "token_logprobs": [float | None],
                  "top_logprobs": [{str: float} | None], "text_offset": [int]}
    chat         {"content": [{"token", "logprob", "bytes",
                               "top_logprobs": [{"token", "logprob", "bytes"}]}],
                  "refusal": None}

A token's string is the text it completes (the incremental detokenizer's piece, so the
strings of a choice's tokens add up to its text — but for a stop string, whose
completing token is listed while the text ends before it — and a character split over
several tokens belongs to its last; the others are ""); `text_offset` is where it starts in the
choice's text. An alternative's string is its token decoded alone. A completions entry's
top_logprobs holds the token itself (under its piece) besides the `logprobs` most likely
ones, as vLLM's does, so that it is never empty (with logprobs 0 it is the token alone);
being a dict, it holds one value per string (the most likely's, where two tokens decode
to one string: the API's shape cannot say more). Without a
tokenizer a token's string is "token_id:N" (vLLM's `return_tokens_as_token_ids`).
"""

from __future__ import annotations

from lookahead_jax.engine.requests import TokenLogprob
from lookahead_jax.engine.streaming import StreamDetokenizer


class LogprobsJson:
    """One choice's tokens, step by step, as logprobs JSON (`add`), offsets continuing
    from the tokens before (the prompt's too, with echo)."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self.detok = StreamDetokenizer(tokenizer) if tokenizer is not None else None
        self.offset = 0  # characters of the choice's text so far

    def piece(self, token: int) -> str:
        """The text `token` completes after the tokens before it."""
        if self.detok is None:
            return f"token_id:{token}"
        return self.detok.add_step([token])

    def alone(self, token: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token}"
        return self.tokenizer.decode([token])

    def add(self, token_ids: list[int], logprobs: list[TokenLogprob | None]) -> dict:
        """The JSON for these tokens (a prompt's first token has no logprob: None)."""
        pieces = [self.piece(t) for t in token_ids]
        if self.chat:
            return {
                "content": [
                    self._chat_entry(p, lp) for p, lp in zip(pieces, logprobs, strict=True)
                ],
                "refusal": None,
            }
        offsets = []
        for p in pieces:
            offsets.append(self.offset)
            self.offset += len(p)
        return {
            "tokens": pieces,
            "token_logprobs": [None if lp is None else lp.logprob for lp in logprobs],
            "top_logprobs": [
                None if lp is None else self._top_dict(t, p, lp)
                for t, p, lp in zip(token_ids, pieces, logprobs, strict=True)
            ],
            "text_offset": offsets,
        }

    def _top_dict(self, token: int, piece: str, lp: TokenLogprob) -> dict[str, float]:
        """The alternatives by string (the token's own under its piece); where two
        decode to one string, the more likely one's value stays."""
        top = {piece: lp.logprob}
        for t, v in lp.top:
            if t != token:
                top.setdefault(self.alone(t), v)
        return top

    def _chat_entry(self, piece: str, lp: TokenLogprob) -> dict:
        def entry(text: str, value: float) -> dict:
            return {"token": text, "logprob": value, "bytes": list(text.encode())}

        return {
            **entry(piece, lp.logprob),
            "top_logprobs": [entry(self.alone(t), v) for t, v in lp.top],
        }
