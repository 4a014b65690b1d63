"""The state of a batched decode, the prefill that creates it, and token emission.

Every row keeps the invariant

    tokens[b, i]       the token at sequence position i (prompt, then new tokens)
    cache.lengths[b]   = prompt_len[b] + n_out[b] - 1: every token but the newest
                         one has its K/V in the cache
    tokens[b, cache.lengths[b]]   the newest token: the input of the next step

so a step never needs to carry "the last token" separately. Prompts are
right-padded to a bucket length P; the pad positions are overwritten by new tokens.
Positions past a row's end hold garbage and are never read.

Plain decoding uses the fields up to `accept_hist`; lookahead decoding also
fills `draft` (the guess sources' state, lookahead.DraftState; None otherwise), and a
spec with `logprobs` the tokens' logprobs (the new tokens', and a prompt's where its row
asks: logprobs.py; None otherwise).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, UInt32

from lookahead_jax.decoding import grammar_rows, logprobs
from lookahead_jax.decoding.grammar_rows import GrammarRows
from lookahead_jax.decoding.prompt_logprobs import prompt_logprobs
from lookahead_jax.decoding.sampling import RowSampling, choose_tokens
from lookahead_jax.guesses.lookahead_config import LookaheadConfig
from lookahead_jax.models import kv_cache, kv_pool, packed, seam
from lookahead_jax.models.kv_cache import KVCache, write_prefix

if TYPE_CHECKING:  # lookahead.py imports this module
    from lookahead_jax.decoding.lookahead import DraftState


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeState:
    cache: KVCache
    tokens: Int[Array, "B S"]  # see the module docstring
    step_of_token: Int[Array, "B S"]  # the step that emitted each new token (0 = prefill)
    prompt_len: Int[Array, " B"]
    n_out: Int[Array, " B"]  # new tokens emitted (EOS excluded)
    max_new_tokens: Int[Array, " B"]  # budget per row
    done: Bool[Array, " B"]
    steps: Int[Array, " B"]  # forward passes after prefill while the row was active
    rng: UInt32[Array, "B 2"]  # per-row PRNG keys (sampling.row_keys)
    sampling: RowSampling  # temperature, top-k, top-p per row
    accept_hist: Int[Array, "B E"]  # steps that emitted 1..E tokens
    draft: DraftState | None = None  # the window's and the guess sources' state
    logprobs: logprobs.Logprobs | None = None  # its tokens' logprobs (spec.logprobs)
    grammar: GrammarRows | None = None  # the rows' grammar states (spec.grammar)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CachedPrefix:
    """What a prefill's rows take from the prefix cache (engine/prefix_cache.py): row b's
    first `length[b]` positions are the pool's blocks `blocks[b]` (kv_pool.gather_prefix),
    and only its prompt from there on, `suffix[b]`, runs through the model. A row without
    a hit has length 0 and its whole prompt as suffix."""

    pool: kv_pool.KVPool
    blocks: Int[Array, "B Mb"]  # pool ids, Mb = P // Sb (past a row's length: any id)
    length: Int[Array, " B"]  # cached positions: a multiple of Sb, below prompt_len
    suffix: Int[Array, "B Ts"]  # prompt[b, length[b]:], right-padded to Ts


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RaggedPrompts:
    """A prefill's prompts one after another in one pass of Tr tokens (a ragged prefill:
    no row is padded to the longest prompt, only the pass's tail). Row b's prompt is
    tokens[0, start[b] : start[b] + prompt_len[b]]; token j is position position[0, j] of
    row row[0, j]. Tail tokens (and a padding row's) have row B, where nothing is written,
    and position 0 (each attends to itself alone).

    Example (B = 2, prompts [5 6 7] and [8 9], Tr = 6):
        tokens = [[5 6 7 8 9 0]]  row = [[0 0 0 1 1 2]]  position = [[0 1 2 0 1 0]]
        start = [0 3]
    """

    tokens: Int[Array, "1 Tr"]
    row: Int[Array, "1 Tr"]
    position: Int[Array, "1 Tr"]
    start: Int[Array, " B"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SharedPrefix:
    """A ragged pass after a cached prefix all its rows share (sixteen chats behind one
    system prompt): every row's first `length[0]` positions are the pool's blocks
    `blocks[0]` (kv_pool.gather_prefix), and only the prompts from there on run, packed
    one after another (`ragged`, whose positions start at length[0]; its tail tokens
    there too), each token seeing the prefix and its own row's tokens up to itself.

    Example (block 2; prompts [1 2 5 6 7] and [1 2 8 9], [1 2] cached in pool block 4,
    Mb = 2, Tr = 6):
        blocks = [[4 0]]  length = [2]
        ragged: tokens = [[5 6 7 8 9 0]]  row = [[0 0 0 1 1 2]]
                position = [[2 3 4 2 3 2]]  start = [0 3]
    """

    pool: kv_pool.KVPool
    blocks: Int[Array, "1 Mb"]  # pool ids, Mb = P // Sb (past the length: any id)
    # the shared positions: a multiple of Sb, below each real row's prompt_len
    length: Int[Array, " 1"]
    ragged: RaggedPrompts


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Everything static about a decode: a jit static argument."""

    lm: seam.CausalLM  # the model seam (seam.py)
    eos_ids: tuple[int, ...]
    # whether any row may sample (False: every row is greedy, whatever its settings say,
    # and the programs carry no sampling code); the settings are per row, in the state
    sampled: bool = False
    lookahead: LookaheadConfig | None = None  # None: plain decoding
    cache_dtype: str = "float32"
    # Buffers sized for steps of this many tokens at least: a plain decode that takes
    # over a lookahead state mid-generation keeps that state's buffer sizes.
    min_slack: int = 1
    # keep each new token's logprob and this many most likely alternatives (logprobs.py)
    # for the rows that ask (RowSampling.logprobs); None: no logprob buffers or code
    logprobs: int | None = None
    # rows may follow a grammar (grammar_rows.py): their logits are masked by their
    # states; False: no grammar state or code
    grammar: bool = False

    @property
    def max_emit(self) -> int:
        """Most tokens one step can emit (also the width of a KV commit)."""
        return 1 if self.lookahead is None else self.lookahead.max_emit


def positions_needed(prompt_bucket: int, new_positions: int, max_emit: int) -> int:
    """Cache/token-buffer positions S so that no fixed-size write ever goes out of bounds:
    the prompt bucket, the room for new tokens (new_positions) and one step's emit."""
    return prompt_bucket + new_positions + max_emit


def emit(state: DecodeState, spec: DecodeSpec, new_be, count_b, logits=None) -> DecodeState:
    """Append up to `count_b` of the tokens `new_be [B, E]` to each active row.

    A row stops at its first EOS (the EOS itself is not kept) or when it reaches
    its budget, even in the middle of the E tokens.

    logits: (logits [B, R, V], rows [B, E]): token e was chosen from logits row
    rows[b, e] — its logprob's source, with spec.logprobs.
    """
    E = new_be.shape[1]
    active = ~state.done
    count_b = jnp.where(active, count_b, 0)
    i = jnp.arange(E)[None]
    is_eos = jnp.isin(new_be, jnp.asarray(spec.eos_ids, jnp.int32)) & (i < count_b[:, None])
    first_eos = jnp.where(is_eos.any(-1), jnp.argmax(is_eos, axis=-1), E)
    k = jnp.minimum(jnp.minimum(count_b, first_eos), state.max_new_tokens - state.n_out)
    k = jnp.where(active, k, 0)
    n_out = state.n_out + k
    done = state.done | (active & ((first_eos < count_b) | (n_out >= state.max_new_tokens)))

    # the E tokens go to positions start.. of each active row; an inactive row's go past S,
    # where the scatter drops them, so both buffers are written in place
    B, S = state.tokens.shape
    start = state.prompt_len + state.n_out  # first free position of each row
    at_be = jnp.where(active[:, None], start[:, None] + i, S)
    rows_be = jnp.broadcast_to(jnp.arange(B)[:, None], (B, E))
    step_id = jnp.broadcast_to(state.steps[:, None], new_be.shape).astype(jnp.int32)
    tokens = state.tokens.at[rows_be, at_be].set(new_be, mode="drop")
    step_of = state.step_of_token.at[rows_be, at_be].set(step_id, mode="drop")
    kept = state.logprobs
    if kept is not None:
        logits_brv, logits_rows_be = logits
        want_b = state.sampling.logprobs & active
        values = logprobs.of_tokens_if(want_b, logits_brv, logits_rows_be, new_be, spec.logprobs)
        kept = logprobs.write(kept, rows_be, at_be, values)
    return dataclasses.replace(
        state,
        tokens=tokens,
        step_of_token=step_of,
        n_out=n_out,
        done=done,
        logprobs=kept,
        grammar=None if state.grammar is None else grammar_rows.advance(state.grammar, new_be, k),
    )


def prefill(
    params,
    prompt_bp: jax.Array,
    prompt_len_b: jax.Array,
    max_new_b: jax.Array,
    rng_b2: jax.Array,
    sampling: RowSampling,
    prefix: CachedPrefix | RaggedPrompts | SharedPrefix | None = None,
    grammar: GrammarRows | None = None,
    *,
    spec: DecodeSpec,
    new_positions: int,
) -> DecodeState:
    """Run the prompts [B, P] (right-padded), fill the cache, emit the first new token.
    sampling: each row's settings ([B] arrays). prefix: the rows' cached prefixes, whose
    prompt positions are not run again (None: every row runs its whole prompt), or the
    same prompts packed one after another (RaggedPrompts: one pass without the rows'
    padding; the model has seam.apply_ragged), or packed after a prefix they share
    (SharedPrefix).
    grammar: the rows' initial grammar states and the table (spec.grammar; the first
    token is chosen under the mask too)."""
    B, P = prompt_bp.shape
    S = positions_needed(P, new_positions, max(spec.max_emit, spec.min_slack))
    cache = spec.lm.init_cache(B, S, jnp.dtype(spec.cache_dtype))
    if prefix is None:
        positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
        last = (prompt_len_b - 1)[:, None]
        logits, k, v = seam.apply_causal(spec.lm, params, prompt_bp, positions, None, last)
        cache = write_prefix(cache, k, v, prompt_len_b)
    elif isinstance(prefix, RaggedPrompts):
        logits, cache = _prefill_ragged(params, prompt_len_b, prefix, cache, spec)
    elif isinstance(prefix, SharedPrefix):
        logits, cache = _prefill_ragged(params, prompt_len_b, prefix.ragged, cache, spec, prefix)
    else:
        logits, cache = _prefill_after_prefix(params, prompt_len_b, prefix, cache, spec)
    tokens = jnp.zeros((B, S), jnp.int32).at[:, :P].set(prompt_bp)
    state = DecodeState(
        cache=cache,
        tokens=tokens,
        step_of_token=jnp.zeros((B, S), jnp.int32),
        prompt_len=prompt_len_b.astype(jnp.int32),
        n_out=jnp.zeros((B,), jnp.int32),
        max_new_tokens=max_new_b.astype(jnp.int32),
        done=max_new_b <= 0,
        steps=jnp.zeros((B,), jnp.int32),
        rng=rng_b2,
        sampling=sampling,
        accept_hist=jnp.zeros((B, spec.max_emit), jnp.int32),
        logprobs=None
        if spec.logprobs is None
        else _prompt_logprobs(params, prompt_bp, S, spec, sampling.prompt_logprobs),
        grammar=grammar,
    )
    if grammar is not None:
        logits = grammar_rows.mask(logits, grammar.state_b[:, None], grammar.tables)
    zero = jnp.zeros((B, 1), jnp.int32)
    first = choose_tokens(logits, sampling, rng_b2, zero, spec.sampled, packed.is_packed(params))
    one_b = jnp.ones((B,), jnp.int32)
    return emit(state, spec, first, one_b, (logits, zero))


def _prefill_after_prefix(params, prompt_len_b, prefix: CachedPrefix, cache: KVCache, spec):
    """(the last prompt token's logits [B, 1, V], the filled cache) of rows that start
    from cached blocks: the blocks copied in, then one causal pass of each row's suffix
    [B, T] at positions length[b] .. over them (padding past a row's prompt runs too,
    after every real position, and is not committed)."""
    B, T = prefix.suffix.shape
    cache = kv_pool.gather_prefix(prefix.pool, prefix.blocks, prefix.length, cache)
    rows_bt = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    positions = prefix.length[:, None] + rows_bt
    last = (prompt_len_b - 1 - prefix.length)[:, None]
    logits, k, v = seam.apply_causal(spec.lm, params, prefix.suffix, positions, cache, last)
    return logits, kv_cache.commit(cache, k, v, rows_bt, prompt_len_b - prefix.length)


def _prefill_ragged(
    params, prompt_len_b, ragged: RaggedPrompts, cache: KVCache, spec, shared=None
):  # fmt: skip
    """(the last prompt token's logits [B, 1, V], the filled cache) of prompts packed in
    one pass (RaggedPrompts): each token's K/V scattered to its row and position; with
    `shared` (a SharedPrefix) after its prefix, whose blocks every row's cache takes."""
    Tr = ragged.tokens.shape[1]
    offset, prefix = jnp.zeros((1,), jnp.int32), None  # [1]: where the pass's rows start
    if shared is not None:
        B, Mb = prompt_len_b.shape[0], shared.blocks.shape[1]
        offset, dtype = shared.length, cache.k[0].dtype
        one = spec.lm.init_cache(1, Mb * shared.pool.block, dtype)
        prefix = kv_pool.gather_prefix(shared.pool, shared.blocks, offset, one)
        blocks_bm = jnp.broadcast_to(shared.blocks, (B, Mb))
        cache = kv_pool.gather_prefix(shared.pool, blocks_bm, jnp.broadcast_to(offset, (B,)), cache)
    first = jnp.arange(Tr, dtype=jnp.int32)[None] - (ragged.position - offset[:, None])
    # (a padding row's prompt_len, 1, lies below a shared prefix: its last token is 0)
    last = jnp.maximum(ragged.start + prompt_len_b - offset - 1, 0)[None]  # [1, B]
    logits, k, v = seam.apply_ragged(
        spec.lm, params, ragged.tokens, ragged.position, first, last, prefix
    )
    filled = kv_cache.write_ragged(cache, k, v, ragged.row[0], ragged.position[0], prompt_len_b)
    return jnp.swapaxes(logits, 0, 1), filled


def _prompt_logprobs(params, prompt_bp, S: int, spec: DecodeSpec, want_b) -> logprobs.Logprobs:
    """The logprob buffers [B, S, ...] with each prompt's own logprobs at its positions
    (prompt_logprobs.py) when some row asks (want_b [B]), else zeros."""
    P = prompt_bp.shape[1]
    buffers = logprobs.init(prompt_bp.shape[0], S, spec.logprobs)

    def compute():
        values = prompt_logprobs(params, prompt_bp, spec.lm, spec.logprobs, spec.cache_dtype)
        return jax.tree.map(
            lambda buf, x: buf.at[:, :P].set(x), buffers, logprobs.Logprobs(*values)
        )

    return jax.lax.cond(jnp.any(want_b), compute, lambda: buffers)


def input_tokens(state: DecodeState) -> jax.Array:
    """The newest token of each row [B] (not yet in the cache)."""
    return jnp.take_along_axis(state.tokens, state.cache.lengths[:, None], axis=1)[:, 0]
