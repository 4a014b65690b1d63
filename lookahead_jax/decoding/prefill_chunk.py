"""One chunk of a long prompt's prefill, run between decode rounds (chunked prefill): the
K/V of the prompt's next C positions, computed over the blocks before them and stored
into the prefix cache's pool (models/kv_pool.py) as C / Sb new blocks. No decode state
comes out: once the prompt's rest fits one chunk, the request is prefilled as any other
whose prompt starts with cached blocks (decode_state.prefill with a CachedPrefix), so
the tokens are those of a prefill in one piece (to float rounding; bit for bit in
float64 on the tests' models).

    chunk:   prompt positions length .. length + C - 1 (a whole number of blocks, all
             real tokens), over the row's blocks 0 .. length / Sb - 1 (pool ids blocks_m)

Worked example (Sb = 16, C = 64, a 300-token prompt): chunks at 0, 64, 128, 192 store
blocks 0..15; at 256 the rest (44 tokens) fits a chunk, so the request's prefill takes
blocks 0..15 from the pool and runs positions 256..299.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lookahead_jax.decoding.loop import compiler_options
from lookahead_jax.decoding.program_caches import ProgramCache
from lookahead_jax.models import kv_cache, kv_pool, seam


def prefill_chunk(params, pool: kv_pool.KVPool, blocks_m, length, chunk_t, dst, *, lm, dtype):
    """The pool (donated) with blocks `dst` [C / Sb] (C = T, the chunk's tokens: one
    forward pass) holding the K/V of `chunk_t` [T] at positions length .. length + T - 1,
    attending to the row's cached blocks `blocks_m` [Mb] (those past length / Sb: any
    id, not read)."""
    (M,), (C,) = blocks_m.shape, chunk_t.shape
    block = pool.block
    cache = lm.init_cache(1, M * block + C, jnp.dtype(dtype))
    cache = kv_pool.gather_prefix(pool, blocks_m[None], length[None], cache)
    rows_1t = jnp.arange(C, dtype=jnp.int32)[None]
    last = jnp.zeros((1, 1), jnp.int32)  # one logits row: the LM head is not wanted
    _, k, v = seam.apply_causal(lm, params, chunk_t[None], length + rows_1t, cache, last)
    cache = kv_cache.commit(cache, k, v, rows_1t, jnp.full((1,), C, jnp.int32))
    starts = length + block * jnp.arange(C // block, dtype=jnp.int32)
    return kv_pool.store_blocks(pool, cache, jnp.zeros_like(starts), starts, dst)


_JITTED = ProgramCache("prefill chunk functions", 8)


def program(lm, dtype: str):
    """prefill_chunk jitted for a model (one compilation per Mb and chunk length), the
    pool donated, with the decode programs' compiler options (loop.compiler_options)."""

    def make():
        fn = functools.partial(prefill_chunk, lm=lm, dtype=dtype)
        return jax.jit(fn, donate_argnums=1, compiler_options=compiler_options())

    return _JITTED.get_or_make((lm, dtype), make)
