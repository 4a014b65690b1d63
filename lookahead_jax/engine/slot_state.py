"""The engine's edits of the B-slot device state, each a small jitted program: prompts
written into free slots, the state's S axis grown, rows retired.

Every leaf of a DecodeState has its rows (the engine's slots) on its first axis, the K/V
buffers' [B, K, S, Dh] too, so every edit here is one `tree.map`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lookahead_jax.decoding.decode_state import DecodeState
from lookahead_jax.decoding.program_caches import ProgramCache
from lookahead_jax.decoding.sampling import RowSampling
from lookahead_jax.models import kv_cache


def _rows(state: DecodeState) -> tuple[DecodeState, object]:
    """(the state without the grammar tables, the tables): the one part that is not per
    row (grammar_rows.py); the edits below map every other leaf by rows."""
    if state.grammar is None:
        return state, None
    g = state.grammar
    rows = dataclasses.replace(g, tables=None)
    return dataclasses.replace(state, grammar=rows), g.tables


def _with_table(state: DecodeState, tables) -> DecodeState:
    if tables is None:
        return state
    grammar = dataclasses.replace(state.grammar, tables=tables)
    return dataclasses.replace(state, grammar=grammar)


def insert(state: DecodeState, fresh: DecodeState, slots_n) -> DecodeState:
    """The B-row `state` with its rows `slots_n` [n] replaced by the n rows of `fresh` (a
    prefill of n prompts), every field; a slot index >= B (a padding row) writes nothing.
    The grammar tables become fresh's (a run's bank is made once, with every grammar
    of the run: fresh's are the same)."""
    (state, _), (fresh, table) = _rows(state), _rows(fresh)
    edited = jax.tree.map(lambda big, small: big.at[slots_n].set(small, mode="drop"), state, fresh)
    return _with_table(edited, table)


def retire(state: DecodeState, retired_b) -> DecodeState:
    """The state with the rows `retired_b` [B] (bool) done: they stop decoding (a
    cancelled request, or one whose stop string the host found; or a row already done
    whose result was read). Every done row's sampling settings become greedy, so that a
    batch of greedy requests skips the sampling work (sampling.py's conds) once the
    sampled ones have left."""
    done = state.done | retired_b
    return dataclasses.replace(state, done=done, sampling=_greedy_where(done, state.sampling))


def _greedy_where(rows_b, sampling: RowSampling) -> RowSampling:
    """`sampling` with the rows `rows_b` [B] (bool) set to greedy (temperature 0, top-k and
    top-p off) and no logprobs."""
    return RowSampling(
        temperature=jnp.where(rows_b, 0.0, sampling.temperature).astype(sampling.temperature.dtype),
        top_k=jnp.where(rows_b, 0, sampling.top_k).astype(sampling.top_k.dtype),
        top_p=jnp.where(rows_b, 1.0, sampling.top_p).astype(sampling.top_p.dtype),
        logprobs=sampling.logprobs & ~rows_b,
        prompt_logprobs=sampling.prompt_logprobs & ~rows_b,
    )


def grow_positions(state: DecodeState, positions: int) -> DecodeState:
    """The state with its S axis (token and logprob buffers [B, S, ...], K/V buffers
    [B, K, S, Dh]) padded with zeros to `positions`. The new positions lie past every
    row's end, where nothing is read."""

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, positions - x.shape[axis])
        return jnp.pad(x, widths)

    cache = kv_cache.map_buffers(lambda x: pad(x, kv_cache.POSITIONS_AXIS), state.cache)
    kept = state.logprobs
    if kept is not None:  # every field's S axis is its second
        kept = jax.tree.map(lambda x: pad(x, 1), kept)
    return dataclasses.replace(
        state,
        cache=cache,
        tokens=pad(state.tokens, 1),
        step_of_token=pad(state.step_of_token, 1),
        logprobs=kept,
    )


def take_rows(state: DecodeState, index_r, keep_r) -> DecodeState:
    """An R-row state whose row r is `state`'s row index_r[r] [R], every field; rows where
    keep_r [R] (bool) is False are done (padding: a copy of some row, never decoded). A
    new row bucket's state (row_buckets.py): live rows gathered into fewer rows, or the
    rows padded to more. One gather of the whole state: a resize costs a copy of the
    rows kept, once, not a copy a step."""
    state, table = _rows(state)
    taken = _with_table(jax.tree.map(lambda x: x[index_r], state), table)
    done = taken.done | ~keep_r
    return dataclasses.replace(taken, done=done, sampling=_greedy_where(done, taken.sampling))


def empty_slots(fresh: DecodeState, batch: int) -> DecodeState:
    """A B-row state of `fresh`'s shapes (but its number of rows) whose every slot is done
    (nothing decodes)."""
    fresh, table = _rows(fresh)
    state = _with_table(jax.tree.map(lambda x: jnp.repeat(x[:1], batch, axis=0), fresh), table)
    done = jnp.ones((batch,), bool)
    return dataclasses.replace(state, done=done, sampling=_greedy_where(done, state.sampling))


def prefill_rows(n: int, batch: int) -> int:
    """How many rows a prefill of n prompts runs: a power of two (so that few programs are
    compiled), at most the batch."""
    return min(1 << max(n - 1, 0).bit_length(), batch)


# the slot edits jitted, by function, output sharding and options (a handful per engine)
_PROGRAMS = ProgramCache("slot edits", 64)


def program(fn, out_shardings, **jit_kw):
    """`fn` (insert, retire, empty_slots, grow_positions) jitted once per process, output
    sharding and jit options, so that jax.jit's own cache compiles it once per shape
    across runs. (Their compilations, a fraction of a second each, are not in the stats'
    compile_s.)"""
    sh_key = None
    if out_shardings is not None:
        sh_key = (jax.tree.structure(out_shardings), tuple(jax.tree.leaves(out_shardings)))
        jit_kw["out_shardings"] = out_shardings
    key = (fn, sh_key, tuple(sorted((k, v) for k, v in jit_kw.items() if k != "out_shardings")))
    return _PROGRAMS.get_or_make(key, lambda: jax.jit(fn, **jit_kw))
