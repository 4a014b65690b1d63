"""The guess-source protocol: what a lookahead step asks of each source of draft guesses
(the n-gram pool, suffix match, token recycling, or a source written outside the package).

A source is a frozen, hashable dataclass (it sits in LookaheadConfig, a static jit
argument) with

    name    its key in the stats and its row in the acceptance record
    nodes   how many draft nodes `propose` returns per row: its share of the proposals,
            a static count (the tree's Z nodes are filled from every source's nodes)
    depth   the deepest node it proposes (the root's children are depth 1)

and three pure, fixed-shape functions of its own state (any pytree; None if it keeps
none):

    init(prompt: Prompt) -> state              once, after the prefill
    propose(state, text: Text) -> Proposals    [B, nodes]: guesses for the tokens after
                                               each row's input token
    feed(state, step: Verified) -> state       after every step: what it verified and
                                               committed

A source's state is per row: every leaf's first axis is B (the engine writes a new row's
state into its batch row, and a mesh shards the batch over that axis), and its shapes
depend on the config alone (not on the prompt bucket), so that the state of any prompt
fits the engine's batch. Proposals follow draft_tree.Proposals: `parent` indexes the
source's own proposals (ROOT for a child of the input), a parent comes before its child,
and a node's depth is its parent's + 1; the step marks a node that breaks these rules,
or lies deeper than `depth`, invalid (never verified).

The step (decoding/lookahead.py) calls `propose` on every configured source, merges the
proposals into the draft tree (draft_tree.py), runs one forward pass, verifies, commits,
and calls `feed` on every source. A source never decides what is emitted: verification
keeps exactly the tokens plain decoding would, whatever the proposals, so a source can
only change how many tokens a step emits. The merge orders proposals by `score`, the
source's own estimate that the node's whole path is right; it needs to be comparable
across sources (the built-in ones are modelled chances, 0..1).

Across requests (optional): a source may also keep an engine-wide memory (any pytree),
with three more pure functions (decoding/guess_memory.py calls them when the engine's
`shared_guesses` is on):

    memory(vocab) -> memory | None              empty, once per engine and layout (None:
                                                this instance keeps none)
    recall(memory, state, prompt: Prompt) -> state    new rows' state, from the memory
                                                (after `init`, which it may replace)
    remember(memory, state, rows [B] bool, ended: Ended) -> memory
                                                the ended rows folded in

Token recycling keeps one (one row of its tables of the model's runners-up), suffix
match another (the ended rows' text), so a prompt asked again, or a conversation's next
turn, starts with the earlier answers' guesses. As with `propose`, nothing here can
change a token, only how many a step emits.

Worked example: docs/library.md, "A guess source of your own" (a source that proposes
the chain that follows the input token through where each token last occurred).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
from jaxtyping import Array, Bool, Float, Int, UInt32

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.draft_tree import Proposals


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What `init` reads: each row's prompt (and its first new token).

    tokens  [B, S] int32  prompt, then output; positions >= end hold nothing yet
    end     [B] int32     tokens known (prompt + new tokens so far)
    active  [B] bool      rows that will decode (not done at the prefill)
    keys    [B, 2] uint32 each row's PRNG key (sampling.row_keys: a function of the seed
                          and the request, never of the row's place in the batch), for
                          a source that draws at random; fold in a salt of its own
    bucket  P: the padded prompt length of the prefill (static)
    vocab   V: the model's vocabulary size (static)
    """

    tokens: Int[Array, "B S"]
    end: Int[Array, " B"]
    active: Bool[Array, " B"]
    keys: UInt32[Array, "B 2"]
    bucket: int
    vocab: int


@dataclasses.dataclass(frozen=True)
class Ended:
    """What `remember` reads about each row besides its state (the rows it folds in have
    just ended).

    tokens      [B, S] int32  prompt, then output
    prompt_len  [B] int32     the prompt's tokens: the output starts there
    end         [B] int32     tokens known (prompt + output)
    """

    tokens: Int[Array, "B S"]
    prompt_len: Int[Array, " B"]
    end: Int[Array, " B"]


@dataclasses.dataclass(frozen=True)
class Sampler:
    """How sampling rows choose their tokens (given to `propose` when rows may sample).

    sampling     [B] bool     rows that sample (the others are greedy)
    temperature  [B] float32
    n_out        [B] int32    new tokens so far: a node at depth a guesses new-token
                              index n_out + a - 1
    noise        (index [B, A] int32, vocab V) -> [B, A, V] float32: the Gumbel noise a
                 row adds at those new-token indices (sampling.py): the token sampled
                 there is argmax(log p / temperature + noise)
    """

    sampling: Bool[Array, " B"]
    temperature: Float[Array, " B"]
    n_out: Int[Array, " B"]
    noise: Callable[[jax.Array, int], jax.Array]


@dataclasses.dataclass(frozen=True)
class Text:
    """What `propose` reads about each row.

    tokens   [B, S] int32  prompt, then output; positions >= end hold nothing yet
    end      [B] int32     tokens known; tokens[end - 1] is the step's input
    input    [B] int32     the step's input token (the newest, not yet in the cache)
    prev     [B] int32     the token before it
    active   [B] bool      rows still decoding
    sampler  Sampler, or None when no row can sample (DecodeSpec.sampled is False)
    grammar  [B, Gl] int32 each row's grammar's fixed text ahead, as tokens (-1 after; a
                           row with no grammar: all -1); None when no row can have one
                           (DecodeSpec.grammar is False)
    """

    tokens: Int[Array, "B S"]
    end: Int[Array, " B"]
    input: Int[Array, " B"]
    prev: Int[Array, " B"]
    active: Bool[Array, " B"]
    sampler: Sampler | None
    grammar: Int[Array, "B Gl"] | None = None


@dataclasses.dataclass(frozen=True)
class WindowNGrams:
    """The Jacobi window's W n-grams of one step: column j's oldest level (the key), the
    levels after it and the new level (the tail), and the token before the key.

    keys   [B, W] int32
    tails  [B, W, N-1] int32
    prev   [B, W] int32
    ok     [B, W] bool   (the row was active)
    """

    keys: Int[Array, "B W"]
    tails: Int[Array, "B W M"]
    prev: Int[Array, "B W"]
    ok: Bool[Array, "B W"]


@dataclasses.dataclass(frozen=True)
class Verified:
    """What `feed` reads: one step, verified and committed.

    tokens     [B, S] int32  prompt and output, the step's emitted tokens included
    end        [B] int32     tokens known after the step
    start      [B] int32     tokens known before it (the first emitted token's position)
    max_emit   the most tokens a step emits (static)
    active     [B] bool      rows that decoded this step
    window     WindowNGrams  the window's n-grams (W = 0 without a window)
    computed       [B, R] int32  the R step tokens whose logits the step computed (the
                                 input, the window's newest level, every tree node)
    computed_prev  [B, R] int32  the token each of them follows
    computed_ok    [B, R] bool   real (not padding) and the row active
    logits         [B, R, V]     their logits
    log_norm       [B, R]        each logits row's logsumexp (log of its softmax's
                                 denominator; computed once, by the CPU kernel where
                                 it runs the model; where no source reads it, XLA
                                 drops it: tests/test_loop_copies.py checks)
    chosen         [B, R] int32  the model's token after each of them: the argmax, or for
                                 a sampling row its seeded draw (what verification compared)
    on_path        [B, R] bool   those of the accepted path's nodes (their logits saw the
                                 true context, as the input's did)
    accepted_source  [B] int32   the source (its index in LookaheadConfig.source_names)
                                 of the accepted path's deepest node; -1: none accepted
    """

    tokens: Int[Array, "B S"]
    end: Int[Array, " B"]
    start: Int[Array, " B"]
    max_emit: int
    active: Bool[Array, " B"]
    window: WindowNGrams
    computed: Int[Array, "B R"]
    computed_prev: Int[Array, "B R"]
    computed_ok: Bool[Array, "B R"]
    logits: Float[Array, "B R V"]
    log_norm: Float[Array, "B R"]
    chosen: Int[Array, "B R"]
    on_path: Bool[Array, "B R"]
    accepted_source: Int[Array, " B"]


@runtime_checkable
class GuessSource(Protocol):
    """A source of draft guesses (see the module docstring)."""

    name: str
    nodes: int
    depth: int

    def init(self, prompt: Prompt) -> Any: ...

    def propose(self, state: Any, text: Text) -> Proposals: ...

    def feed(self, state: Any, step: Verified) -> Any: ...


@runtime_checkable
class SourceSettings(Protocol):
    """A built-in source's knobs in LookaheadConfig (guesses/built_in.py lists them): a
    frozen dataclass whose field names are the keys LookaheadConfig and its `parse` take
    (`suffix`, `suffix_span`, ...), each validated in its __post_init__, and

    check(config)    what the knobs must satisfy beside the config's other fields (raise
                     UserInputError), called once the config is whole
    source(config)   the GuessSource they make, None when they make none (a count of 0)
    describe(config) their figures for LookaheadConfig.describe()
    """

    def check(self, config) -> None: ...

    def source(self, config) -> GuessSource | None: ...

    def describe(self, config) -> dict: ...


def check_int(name: str, value, low: int, none_ok: bool = False) -> None:
    """Refuse a lookahead knob that is not an integer >= low (nor None, if none_ok)."""
    if none_ok and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        either = "None or " if none_ok else ""
        raise UserInputError(f"lookahead {name} must be {either}an integer >= {low}, got {value!r}")
