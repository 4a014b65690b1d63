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

Across requests (SuffixDecoding's idea, `memory_tokens` > 0): the engine keeps the text
of the rows that ended (each output with the `key_max` prompt tokens before it) in a
buffer of M tokens, segments set apart by SEPARATOR, each written after the last one or,
where it would not fit, from the buffer's start (so after a wrap older segments can sit
after newer ones: "the most recent" holds between a row's own text and the memory, not
within the memory); a new row takes a copy as its state, and matches run over [its copy,
then its own text], a continuation cut at a separator. A row asked again finds its
earlier answer there; any row finds the model's stock phrases.

    memory  [1, M]: `x y p q r | a b c | . . .`  (| = SEPARATOR, . never written)
    a row   copy [M] ++ text [S]: the text's positions come last, so at an equal match
            length its own text wins (the most recent)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.draft_tree import Proposals, chains
from lookahead_jax.guesses.guess_source import Ended, Prompt, Text, Verified, check_int

# What stands between the memory's segments: no token equals it, and a match stops at it
# on either side, so no match and no continuation crosses it.
SEPARATOR = -1


def match_lengths(tokens_bs, end_b, key_max: int):
    """[B, S] int32: the match length at each position j (0 where j >= end-1)."""
    B, S = tokens_bs.shape
    j = jnp.arange(S)[None]  # [1, S]
    run = jnp.ones((B, S), bool)
    length = jnp.zeros((B, S), jnp.int32)
    for i in range(key_max):
        mine = end_b - 1 - i  # [B] the row's token i back from its input
        mine_tok = jnp.take_along_axis(tokens_bs, jnp.maximum(mine, 0)[:, None], axis=1)  # [B, 1]
        # the token i back from every position j: the text shifted right by i (a slice,
        # not a gather: this runs every step over the whole text)
        theirs_tok = jnp.pad(tokens_bs, ((0, 0), (i, 0)))[:, :S]
        # (a text shorter than key_max reads back into the memory's copy, and a separator
        # there must not match the one before a segment)
        mine_ok = (mine[:, None] >= 0) & (mine_tok != SEPARATOR)
        run = run & (j >= i) & mine_ok & (theirs_tok == mine_tok)
        length = length + run.astype(jnp.int32)
    earlier = j < (end_b - 1)[:, None]
    return jnp.where(earlier, length, 0)


def largest(score_bs, count: int):
    """jax.lax.top_k(score_bs, count): score [B, S] int32 -> (best [B, count], their
    positions [B, count] int32), as `count` rounds of argmax (the first of equal scores,
    as top_k): XLA:CPU lowers top_k to a sort of the whole row (6 ms a step at B=8,
    S=4096 on an AMD EPYC, against 0.1 ms)."""
    rows = jnp.arange(score_bs.shape[0])
    best, pos = [], []
    for _ in range(count):
        p = jnp.argmax(score_bs, axis=1)  # [B]
        best.append(score_bs[rows, p])
        pos.append(p)
        score_bs = score_bs.at[rows, p].set(jnp.iinfo(score_bs.dtype).min)
    return jnp.stack(best, axis=1), jnp.stack(pos, axis=1).astype(jnp.int32)


def propose(tokens_bs, end_b, *, key_max: int, span: int, count: int):
    """The `count` best continuations of up to `span` tokens.

    Returns tokens [B, count, span], length [B, count] (0 = no match) and the match
    length of each [B, count] (the guess's key length, 1..key_max).
    """
    B, S = tokens_bs.shape
    lengths = match_lengths(tokens_bs, end_b, key_max)
    # longest match first, then the most recent position
    score = jnp.where(lengths > 0, lengths * S + jnp.arange(S)[None], -1)
    best, pos = largest(score, count)  # [B, count]
    found = best >= 0
    key_len = jnp.where(found, best // S, 0)
    idx = pos[:, :, None] + 1 + jnp.arange(span)[None, None]  # [B, count, span]
    cont = jnp.take_along_axis(tokens_bs, jnp.minimum(idx, S - 1).reshape(B, -1), axis=1)
    cont = cont.reshape(B, count, span)
    known = jnp.clip(end_b[:, None] - 1 - pos, 0, span)  # tokens known after position j
    # a continuation stops at a separator (the memory's segments: module docstring)
    before_separator = jnp.cumprod((cont != SEPARATOR).astype(jnp.int32), axis=2).sum(axis=2)
    length = jnp.where(found, jnp.minimum(known, before_separator), 0).astype(jnp.int32)
    return cont, length, key_len


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffixMemory:
    """The engine-wide text: tokens [1, M] (SEPARATOR where nothing is), and head [1],
    where the next segment goes. The last position is never written (a separator before
    a row's own text)."""

    tokens: Int[Array, "1 M"]
    head: Int[Array, " 1"]


def _remember_row(memory: SuffixMemory, row, *, key_max: int):
    """scan's body: one row's output, with the `key_max` tokens before it, and a separator
    written at the head (at 0 if it would not fit before the last position), if the row is
    chosen. An output longer than the memory keeps its end."""
    tokens_s, prompt_len, end, chosen = row
    M, S = memory.tokens.shape[1], tokens_s.shape[0]
    start = jnp.maximum(prompt_len - key_max, 0)
    length = jnp.minimum(end - start, M - 2)
    start = end - length
    head = jnp.where(memory.head[0] + length + 1 > M - 1, 0, memory.head[0])
    i = jnp.arange(S + 1)  # S + 1: an output of the whole text still gets its separator
    values = jnp.where(i < length, tokens_s[jnp.minimum(start + i, S - 1)], SEPARATOR)
    at = jnp.where(chosen & (i <= length), head + i, M)  # M: dropped
    return SuffixMemory(
        tokens=memory.tokens.at[0, at].set(values.astype(jnp.int32), mode="drop"),
        head=jnp.where(chosen, head + length + 1, memory.head[0])[None].astype(jnp.int32),
    ), None


# Modelled chance that a suffix-match guess is right when its parent is, by match length
# (the merge orders proposals by it: guess_source.py).
SUFFIX_RATES = (0.0, 0.3, 0.45, 0.6, 0.7, 0.75, 0.8, 0.8, 0.85)


@dataclasses.dataclass(frozen=True)
class SuffixSource:
    """Suffix match as a guess source: `count` continuations of up to `span` tokens,
    keyed on up to `key_max` of the row's last tokens. It reads the row's text; with
    `memory_tokens` M > 0 its state is the row's copy of the engine's memory [B, M]
    (module docstring), otherwise it keeps none."""

    count: int
    span: int = 8
    key_max: int = 4
    memory_tokens: int = 0
    name: str = "suffix"

    @property
    def nodes(self) -> int:
        return self.count * self.span

    @property
    def depth(self) -> int:
        return self.span

    def init(self, prompt: Prompt) -> jax.Array | None:
        if not self.memory_tokens:
            return None
        B = prompt.tokens.shape[0]
        return jnp.full((B, self.memory_tokens), SEPARATOR, jnp.int32)

    def propose(self, state: jax.Array | None, text: Text) -> Proposals:
        tokens, end = text.tokens, text.end
        if state is not None:  # the memory's copy first: [B, M + S]
            tokens, end = jnp.concatenate([state, tokens], axis=1), end + state.shape[1]
        cont_bcm, length_bc, key_len_bc = propose(
            tokens, end, key_max=self.key_max, span=self.span, count=self.count
        )
        rate_bc = jnp.asarray(SUFFIX_RATES, jnp.float32)[key_len_bc]
        score_bcm = rate_bc[:, :, None] ** jnp.arange(1, self.span + 1)[None, None]
        return chains(cont_bcm, length_bc, score_bcm)

    def feed(self, state: jax.Array | None, step: Verified) -> jax.Array | None:
        return state

    # ------------------------------------------------ across requests (guess_source.py)

    def memory(self, vocab: int) -> SuffixMemory | None:
        """Empty (None: this source keeps no memory, `memory_tokens` = 0)."""
        if not self.memory_tokens:
            return None
        empty = jnp.full((1, self.memory_tokens), SEPARATOR, jnp.int32)
        return SuffixMemory(tokens=empty, head=jnp.zeros((1,), jnp.int32))

    def recall(self, memory: SuffixMemory, state: jax.Array, prompt: Prompt) -> jax.Array:
        """Every new row's copy: the memory's text."""
        return jnp.broadcast_to(memory.tokens, state.shape)

    def remember(self, memory: SuffixMemory, state, rows_b, ended: Ended) -> SuffixMemory:
        """The outputs of rows `rows_b` [B] (bool) appended, in row order."""
        del state  # the row's copy of the memory: nothing of its own
        body = functools.partial(_remember_row, key_max=self.key_max)
        xs = (ended.tokens, ended.prompt_len, ended.end, rows_b)
        return jax.lax.scan(body, memory, xs)[0]


@dataclasses.dataclass(frozen=True)
class SuffixSettings:
    """Suffix match's knobs in LookaheadConfig (guess_source.SourceSettings).

    suffix         continuations proposed a step (0: none)
    suffix_span    tokens each, at most
    suffix_key     of the row's last tokens matched, at most
    suffix_memory  tokens of the engine's earlier outputs matched too when the engine
                   shares guesses across requests (0: none)
    """

    suffix: int = 0
    suffix_span: int = 8
    suffix_key: int = 4
    suffix_memory: int = 0

    def __post_init__(self):
        for name, low in (("suffix", 0), ("suffix_span", 1), ("suffix_key", 1)):
            check_int(name, getattr(self, name), low)
        check_int("suffix_memory", self.suffix_memory, 0)
        if 0 < self.suffix_memory < self.suffix_key + 3:
            raise UserInputError(
                f"lookahead suffix_memory must be 0 or at least suffix_key + 3 = "
                f"{self.suffix_key + 3} (a segment: its key, a token, a separator), got "
                f"{self.suffix_memory}"
            )
        if self.suffix_key >= len(SUFFIX_RATES):
            raise UserInputError(f"lookahead suffix_key must be at most {len(SUFFIX_RATES) - 1}")

    def check(self, config) -> None:
        pass

    def source(self, config) -> SuffixSource | None:
        if not self.suffix:
            return None
        return SuffixSource(self.suffix, self.suffix_span, self.suffix_key, self.suffix_memory)

    def describe(self, config) -> dict:
        return dataclasses.asdict(self)
