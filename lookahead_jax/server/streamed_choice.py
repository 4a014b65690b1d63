"""One choice of a streamed answer (server/app.py): the text its updates add, less what
could still start a stop string, and its tokens' logprobs, chunk by chunk."""

from __future__ import annotations

from lookahead_jax.engine.stop_strings import held_back
from lookahead_jax.engine.streaming import StreamDetokenizer
from lookahead_jax.server.logprobs import LogprobsJson


class StreamedChoice:
    """One choice of a streamed answer: its detokenizer, the text sent so far, and its
    tokens' logprobs JSON (when asked); with echo, the prompt's text (and its logprobs,
    when asked) lead its first chunk."""

    def __init__(self, tokenizer, chat: bool, echo: str | None = None, prompt_ids=()):
        self.detok = StreamDetokenizer(tokenizer) if tokenizer is not None else None
        self.sent, self.pending, self.first = "", "", True
        self.logprobs = LogprobsJson(tokenizer, chat)
        self.echo, self.prompt_ids = echo, list(prompt_ids)

    def add(self, update, stops) -> list[tuple[str, str | None, bool, dict | None]]:
        """The chunks (text, finish, first, logprobs) an update gives: its new text, less
        what could start a stop string, with its tokens' logprobs (when asked); with the
        result, the rest and then its finish."""
        self.pending += self.detok.add_step(update.token_ids) if self.detok else ""
        logprobs = None
        if update.logprobs is not None:  # it asked for them
            prompt = update.prompt_logprobs if self.echo is not None else None
            eos = None if update.result is None else update.result.eos
            ids, lps = listed(self.prompt_ids, prompt, update.token_ids, update.logprobs, eos)
            logprobs = self.logprobs.add(ids, lps) if lps else None
        result, chunks = update.result, []
        if result is None:
            keep = held_back(self.sent + self.pending, stops)  # might start a stop string
            cut = len(self.pending) - keep
            out, self.pending = self.pending[:cut], self.pending[cut:]
            if out or self.first or logprobs:
                chunks.append((self._lead(out), None, self.first, logprobs))
                self.sent, self.first = self.sent + out, False
            return chunks
        if result.finish == "stop" and result.text is not None:
            out = result.text[len(self.sent) :]
        else:
            out = self.pending + (self.detok.flush() if self.detok else "")
        if out or self.first or logprobs:
            chunks.append((self._lead(out), None, self.first, logprobs))
            self.first = False
        chunks.append(("", result.finish, False, None))
        return chunks

    def _lead(self, text: str) -> str:
        """The text of a chunk: the first one's after the echoed prompt."""
        return (self.echo or "") + text if self.first else text


def listed(prompt_ids, prompt_logprobs, token_ids, logprobs, eos):
    """(ids, logprobs) a choice lists: with echo the prompt's first (prompt_logprobs not
    None), its new tokens', and the EOS that ended it last (as OpenAI-style servers list
    it, with the text "")."""
    ids, lps = list(token_ids), list(logprobs)
    if prompt_logprobs is not None:
        ids, lps = list(prompt_ids) + ids, list(prompt_logprobs) + lps
    if eos is not None:
        ids, lps = ids + [eos[0]], lps + [eos[1]]
    return ids, lps
