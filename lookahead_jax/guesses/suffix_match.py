"""Context suffix match: guess that the text continues as it did after an earlier
occurrence of its last few tokens (prompt lookup, llama.cpp's lookup, SAM-decoding's
idea), on the device, for every row at once.

A row's known text is `tokens[0:end]` (prompt, then new tokens; the last one,
`tokens[end-1]`, is the step's input). For every earlier position j < end-1, the *match
length* is how many tokens ending at j equal the tokens ending at end-1 (at most
`key_max`). The best positions — longest match first, then the most recent — each
propose their continuation `tokens[j+1 : j+1+span]`, cut where the known text ends.

Example, key_max=3, span=4, text (positions 0..9) = `a b c d x a b c d a`, end = 10:

    the row ends in ... c d a       (the input is `a` at 9)
    j=0 (`a`):          match 1 (`a`; nothing before it)     continuation b c d x
    j=5 (`a`):          match 1 (`x a` vs `d a`: x != d)     continuation b c d a
    j=3 (`d`):          match 0
    best: j=5 (match 1, most recent) then j=0 (match 1)

(A match of `d a` would need `d` right before an earlier `a`; there is none, so every
match here has length 1.) The continuation from j=5 runs into the row's own last
tokens, `b c d a`: copying a repeating pattern is how such matches pay off.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lookahead_jax.guesses.draft_tree import Proposals, chains
from lookahead_jax.guesses.guess_source import Prompt, Text, Verified


def match_lengths(tokens_bs, end_b, key_max: int):
    """[B, S] int32: the match length at each position j (0 where j >= end-1)."""
    B, S = tokens_bs.shape
    j = jnp.arange(S)[None]  # [1, S]
    run = jnp.ones((B, S), bool)
    length = jnp.zeros((B, S), jnp.int32)
    for i in range(key_max):
        mine = end_b - 1 - i  # [B] the row's token i back from its input
        theirs = j - i
        mine_tok = jnp.take_along_axis(tokens_bs, jnp.maximum(mine, 0)[:, None], axis=1)  # [B, 1]
        theirs_tok = jnp.take_along_axis(
            tokens_bs, jnp.broadcast_to(jnp.maximum(theirs, 0), (B, S)), axis=1
        )
        run = run & (theirs >= 0) & (mine[:, None] >= 0) & (theirs_tok == mine_tok)
        length = length + run.astype(jnp.int32)
    earlier = j < (end_b - 1)[:, None]
    return jnp.where(earlier, length, 0)


def propose(tokens_bs, end_b, *, key_max: int, span: int, count: int):
    """The `count` best continuations of up to `span` tokens.

    Returns tokens [B, count, span], length [B, count] (0 = no match) and the match
    length of each [B, count] (the guess's key length, 1..key_max).
    """
    B, S = tokens_bs.shape
    lengths = match_lengths(tokens_bs, end_b, key_max)
    # longest match first, then the most recent position
    score = jnp.where(lengths > 0, lengths * S + jnp.arange(S)[None], -1)
    best, pos = jax.lax.top_k(score, count)  # [B, count]
    found = best >= 0
    key_len = jnp.where(found, best // S, 0)
    idx = pos[:, :, None] + 1 + jnp.arange(span)[None, None]  # [B, count, span]
    cont = jnp.take_along_axis(tokens_bs, jnp.minimum(idx, S - 1).reshape(B, -1), axis=1)
    cont = cont.reshape(B, count, span)
    known = jnp.clip(end_b[:, None] - 1 - pos, 0, span)  # tokens known after position j
    return cont, jnp.where(found, known, 0), key_len


# Modelled chance that a suffix-match guess is right when its parent is, by match length
# (the merge orders proposals by it: guess_source.py).
SUFFIX_RATES = (0.0, 0.3, 0.45, 0.6, 0.7, 0.75, 0.8, 0.8, 0.85)


@dataclasses.dataclass(frozen=True)
class SuffixSource:
    """Suffix match as a guess source: `count` continuations of up to `span` tokens,
    keyed on up to `key_max` of the row's last tokens. It keeps no state: it reads the
    row's text."""

    count: int
    span: int = 8
    key_max: int = 4
    name: str = "suffix"

    @property
    def nodes(self) -> int:
        return self.count * self.span

    @property
    def depth(self) -> int:
        return self.span

    def init(self, prompt: Prompt) -> None:
        return None

    def propose(self, state: None, text: Text) -> Proposals:
        cont_bcm, length_bc, key_len_bc = propose(
            text.tokens, text.end, key_max=self.key_max, span=self.span, count=self.count
        )
        rate_bc = jnp.asarray(SUFFIX_RATES, jnp.float32)[key_len_bc]
        score_bcm = rate_bc[:, :, None] ** jnp.arange(1, self.span + 1)[None, None]
        return chains(cont_bcm, length_bc, score_bcm)

    def feed(self, state: None, step: Verified) -> None:
        return None
