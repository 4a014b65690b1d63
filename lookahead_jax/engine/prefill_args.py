"""The host arrays of a prefill's start program (device_slots.py): the requests' prompts
right-padded to the prompt side, lengths, budgets, PRNG keys and sampling settings, n
rows (padding rows have max_new_tokens 0: done at once), and with the prefix cache each
row's cached blocks and the rest of its prompt past them; or, for a ragged prefill, the
prompts one after another (RaggedPrompts).

A prefill is of one of four kinds, each its own programs and shapes (prefill_shapes.py):
"prompt" (rows n, prompt side P), "suffix" (rows n, suffix side Ts, after cached blocks),
"ragged" (rows n, the pass's tokens Tr: several prompts from scratch, packed) and
"shared" (rows n, the pass's tokens Tr: several prompts past the cached blocks they all
share, packed after them: SharedPrefix)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.decode_state import CachedPrefix, RaggedPrompts, SharedPrefix
from lookahead_jax.decoding.grammar_rows import GrammarRows
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, keys_for
from lookahead_jax.distributed import multihost, sharding
from lookahead_jax.engine import inputs
from lookahead_jax.engine.grammar_bank import GrammarBank

# program_pool's marker of a ragged pass; the kind of a pass after a shared prefix
from lookahead_jax.engine.prefill_shapes import RAGGED, SHARED
from lookahead_jax.engine.requests import Encoded
from lookahead_jax.models import kv_pool


def rows(requests: list[Encoded], n: int, P: int, mesh=None) -> tuple:
    """(prompt [n, P], prompt_len [n], max_new [n], keys [n, 2], RowSampling) for the
    requests then n - len(requests) padding rows; on a mesh, where the start program
    takes them (rows over `data`)."""
    pad = n - len(requests)
    prompt_np = np.zeros((n, P), np.int32)
    prompt_len_n, max_new_n = np.ones((n,), np.int32), np.zeros((n,), np.int32)
    for i, r in enumerate(requests):
        prompt_np[i, : len(r.ids)] = r.ids
        prompt_len_n[i], max_new_n[i] = len(r.ids), r.max_new_tokens
    keys_n2 = np.zeros((n, 2), np.uint32)  # padding rows: zeros
    by_seed: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        by_seed.setdefault(r.seed, []).append(i)
    for seed, rows_i in by_seed.items():  # one vmapped fold_in per seed, not per row
        keys_n2[rows_i] = np.asarray(keys_for(seed, [requests[i].key for i in rows_i]))
    sampling = RowSampling.of(
        [r.sampling for r in requests] + [SamplingConfig()] * pad,
        [r.logprobs is not None for r in requests] + [False] * pad,
        [r.prompt_logprobs is not None for r in requests] + [False] * pad,
    )
    out = (prompt_np, prompt_len_n, max_new_n, keys_n2, sampling)
    if mesh is not None:
        out = jax.tree.map(
            lambda a: multihost.replicated(mesh, a, sharding.batch_major(a, mesh)), out
        )
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class SharedPool:
    """program_pool's value for a ragged pass after a shared prefix: the pool it reads."""

    pool: kv_pool.KVPool


def shared_blocks(hits: list[list[int]]) -> list[int]:
    """The leading cached blocks (pool ids) every row's `hits` share: a SharedPrefix's."""
    n = min(len(h) for h in hits)
    for i in range(n):
        if any(h[i] != hits[0][i] for h in hits):
            return hits[0][:i]
    return hits[0][:n]


def shared_length(hits: list[list[int]], block: int) -> int:
    """The positions the blocks every row's `hits` share hold (a SharedPrefix's length)."""
    return len(shared_blocks(hits)) * block


def sides(requests: list[Encoded], hits, pool, ragged: bool = False) -> tuple[str, list[int]]:
    """(kind, each request's prefill side): "prompt" and its prompt's, or with hits
    "suffix" and its prompt's rest past its cached blocks'; with `ragged`, one side, the
    pass's: "ragged" and all the prompts' tokens, or with hits "shared" and their tokens
    past the blocks they share."""
    if ragged:
        skip = 0 if hits is None else shared_length(hits, pool.block)
        tokens = sum(len(r.ids) - skip for r in requests)
        return (RAGGED if hits is None else SHARED), [inputs.prefill_side(tokens)]
    if hits is None:
        return "prompt", [inputs.prefill_side(len(r.ids)) for r in requests]
    rest = [len(r.ids) - len(h) * pool.block for r, h in zip(requests, hits, strict=True)]
    return "suffix", [inputs.prefill_side(n) for n in rest]


def program_pool(hits, pool, ragged: bool = False) -> kv_pool.KVPool | SharedPool | str | None:
    """What keys a prefill's program besides its shape (DeviceSlots._start_key): `pool`
    for requests with hits, RAGGED for a ragged prefill, SharedPool(pool) for a ragged
    one with hits (after their shared blocks), None (a prompt prefill's program)
    otherwise, cache on or off."""
    if ragged:
        return RAGGED if hits is None else SharedPool(pool)
    return None if hits is None else pool


def ragged(requests: list[Encoded], n: int, Tr: int, offset: int = 0) -> RaggedPrompts:
    """The requests' prompts from position `offset` on one after another in Tr tokens
    (RaggedPrompts' example; the tail at position `offset`), for n rows (padding rows have
    nothing there: start 0)."""
    tokens, row = np.zeros((1, Tr), np.int32), np.full((1, Tr), n, np.int32)
    position, start = np.full((1, Tr), offset, np.int32), np.zeros((n,), np.int32)
    at = 0
    for i, r in enumerate(requests):
        m = len(r.ids) - offset
        tokens[0, at : at + m], row[0, at : at + m] = r.ids[offset:], i
        position[0, at : at + m], start[i] = offset + np.arange(m), at
        at += m
    return RaggedPrompts(tokens, row, position, start)


def shared(requests: list[Encoded], hits, pool, n: int, Tr: int, P: int) -> SharedPrefix:
    """The prefill's SharedPrefix for n rows: the blocks the requests' hits share (M = P //
    BLOCK ids), and their prompts past those packed in Tr tokens (SharedPrefix's
    example)."""
    blocks, length = shared_blocks(hits), shared_length(hits, pool.block)
    blocks_1m = np.zeros((1, P // pool.block), np.int32)
    blocks_1m[0, : len(blocks)] = blocks
    packed = ragged(requests, n, Tr, length)
    return SharedPrefix(pool, blocks_1m, np.array([length], np.int32), packed)


def cached_prefix(P: int, requests: list[Encoded], hits, pool, n: int, T: int) -> CachedPrefix:
    """The prefill's CachedPrefix for n rows (the requests', then padding rows with
    nothing cached): M = P // BLOCK block ids a row, the suffixes padded to T."""
    block = pool.block
    blocks_nm = np.zeros((n, P // block), np.int32)
    length_n = np.zeros((n,), np.int32)
    for i, ids in enumerate(hits):
        blocks_nm[i, : len(ids)] = ids
        length_n[i] = len(ids) * block
    suffix_nt = np.zeros((n, T), np.int32)
    for i, r in enumerate(requests):
        rest = r.ids[length_n[i] :]
        suffix_nt[i, : len(rest)] = rest
    return CachedPrefix(pool, blocks_nm, length_n, suffix_nt)


def grammar_rows(requests: list[Encoded], n: int, bank: GrammarBank) -> GrammarRows:
    """The n rows' initial grammar states (FREE for a request without a grammar and for
    padding rows) and the bank's tables."""
    state_n = np.zeros((n,), np.int32)
    for i, r in enumerate(requests):
        state_n[i] = bank.initial_state(r.grammar)
    return GrammarRows(state_n, bank.on_device())


def kind_of(pool) -> str:
    """The kind of prefill a program_pool value keys: "prompt", "suffix", "ragged" or
    "shared"."""
    if pool is None:
        return "prompt"
    if isinstance(pool, SharedPool):
        return SHARED
    return RAGGED if isinstance(pool, str) else "suffix"


def prefix_shapes(
    rows: int, side: int, pool, P: int
) -> CachedPrefix | RaggedPrompts | SharedPrefix:
    """The start program's `prefix` argument as shapes (jax.ShapeDtypeStruct leaves) for
    a prefill of (rows, side) of the kind `pool` keys (program_pool; not a prompt's):
    a CachedPrefix of rows at prompt side P, RaggedPrompts of `side` tokens, or a
    SharedPrefix of those after blocks of prompt side P."""
    like = lambda *shape: jax.ShapeDtypeStruct((rows, *shape), jnp.int32)  # noqa: E731
    one = jax.ShapeDtypeStruct((1, side), jnp.int32)
    kind = kind_of(pool)
    if kind == RAGGED:
        return RaggedPrompts(one, one, one, like())
    pool = pool.pool if kind == SHARED else pool
    pool_like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), pool
    )
    if kind == SHARED:
        blocks = jax.ShapeDtypeStruct((1, P // pool.block), jnp.int32)
        length = jax.ShapeDtypeStruct((1,), jnp.int32)
        return SharedPrefix(pool_like, blocks, length, RaggedPrompts(one, one, one, like()))
    return CachedPrefix(pool_like, like(P // pool.block), like(), like(side))
