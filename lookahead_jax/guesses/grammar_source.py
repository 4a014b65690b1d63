"""Guesses from the grammar a row follows: the tokens of the text its grammar fixes next
(decoding/grammar_rows.chains, made by grammar/fixed_text.py), proposed as one chain.

Under a JSON schema the structure between values is fixed (`","age":`, `"},{"name":"`):
the model must write it, and almost always in the tokenizer's own tokenization, so the
chain is a strong guess (`RATE` a token). A row without a grammar proposes nothing.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lookahead_jax.guesses.draft_tree import Proposals, chains
from lookahead_jax.guesses.guess_source import Prompt, Text, Verified, check_int

RATE = 0.9  # the modelled chance that each next token of the fixed text is the model's


@dataclasses.dataclass(frozen=True)
class GrammarSource:
    """Proposes each row's fixed-text chain, up to `length` tokens (guess_source.py)."""

    length: int
    name: str = "grammar"

    @property
    def nodes(self) -> int:
        return self.length

    @property
    def depth(self) -> int:
        return self.length

    def init(self, prompt: Prompt) -> None:
        return None

    def propose(self, state: None, text: Text) -> Proposals:
        B = text.input.shape[0]
        if text.grammar is None:  # (no row can follow a grammar)
            tokens = jnp.zeros((B, self.length), jnp.int32)
            known = jnp.zeros((B,), jnp.int32)
        else:
            tokens = text.grammar[:, : self.length]
            known = jnp.sum(jnp.cumprod(tokens >= 0, axis=1), axis=1)
        score = RATE ** jnp.arange(1, self.length + 1, dtype=jnp.float32)
        return chains(
            jnp.maximum(tokens, 0)[:, None],
            jnp.where(text.active, known, 0)[:, None],
            jnp.broadcast_to(score, (B, 1, self.length)),
        )

    def feed(self, state: None, step: Verified) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class GrammarSettings:
    """The grammar source's knob in LookaheadConfig (guess_source.SourceSettings).

    grammar_guess  tokens of a row's fixed text proposed a step (0: none; the engine sets
                   it for a run whose requests follow grammars)
    """

    grammar_guess: int = 0

    def __post_init__(self):
        check_int("grammar_guess", self.grammar_guess, 0)

    def check(self, config) -> None:
        pass

    def source(self, config) -> GrammarSource | None:
        return GrammarSource(self.grammar_guess) if self.grammar_guess else None

    def describe(self, config) -> dict:
        return dataclasses.asdict(self)
