"""A pool of K/V blocks kept across requests: the device side of the prefix cache
(engine/prefix_cache.py keeps which prompt prefix each block holds).

    k, v   L arrays [Nb, K, Sb, Dh]   per layer: blocks, kv heads, positions, head dim

Block j of a prompt holds its positions j*Sb .. (j+1)*Sb - 1, in the cache's layout
(kv_cache.py) with Nb blocks in place of B rows, so a block moves between the pool and a
row's cache as one slice per layer, no transpose.

Two programs move blocks:

    gather_prefix  a fresh cache for n rows whose row i holds the blocks blocks_nm[i, :]
                   at positions 0, Sb, 2*Sb, ... and length length_n[i]
    store_blocks   blocks cut out of a prefilled cache (row rows_m[j], positions
                   starts_m[j] ..) written over pool blocks dst_m[j] (m entries; a
                   dst >= Nb is dropped)

Worked example (Sb = 4; one row whose 10-token prompt shares its first 8 tokens with
a prompt seen before, whose blocks sit at pool ids 7 and 2):

    gather_prefix(pool, blocks_nm=[[7, 2, 0]], length_n=[8], cache)   (Mb = 3 blocks a row)
        positions 0..3 <- pool block 7, 4..7 <- pool block 2, 8..11 <- block 0 (past the
        length: garbage the attention never reads, overwritten by the prefill's commit)
    the prefill then runs only tokens 8, 9 at positions 8, 9 over that cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Shaped

from lookahead_jax.models.kv_cache import POSITIONS_AXIS, KVCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVPool:
    k: tuple[Shaped[Array, "Nb K Sb Dh"], ...]  # one per layer (L)
    v: tuple[Shaped[Array, "Nb K Sb Dh"], ...]

    @property
    def blocks(self) -> int:
        """Nb, the blocks the pool holds."""
        return self.k[0].shape[0]

    @property
    def block(self) -> int:
        """Sb, the positions a block holds."""
        return self.k[0].shape[POSITIONS_AXIS]


def init_pool(cache_like: KVCache, blocks: int, block: int) -> KVPool:
    """An all-zero pool of Nb = `blocks` blocks of `block` positions, for caches shaped and
    typed like `cache_like` (its B and S are not used). Zeros, not garbage: a block
    gathered past a row's length is multiplied by zero attention weights, so it must be
    finite (kv_cache.commit)."""

    def zeros(x):
        _, K, _, Dh = x.shape
        return jnp.zeros((blocks, K, block, Dh), x.dtype)

    return KVPool(k=tuple(map(zeros, cache_like.k)), v=tuple(map(zeros, cache_like.v)))


def gather_prefix(pool: KVPool, blocks_nm, length_n, cache: KVCache) -> KVCache:
    """`cache` (n rows, S >= Mb * Sb positions) with row i's positions 0 .. Mb*Sb - 1
    replaced by the pool's blocks `blocks_nm[i]` [Mb], one after another, and its length
    set to `length_n[i]` (the cached positions: blocks past them are garbage)."""
    n, Mb = blocks_nm.shape

    def put(dst, blocks):  # dst [n, K, S, Dh], blocks [Nb, K, Sb, Dh]
        _, K, Sb, Dh = blocks.shape
        rows = blocks[blocks_nm]  # [n, Mb, K, Sb, Dh]
        rows = jnp.swapaxes(rows, 1, 2).reshape(n, K, Mb * Sb, Dh)
        return jax.lax.dynamic_update_slice_in_dim(dst, rows.astype(dst.dtype), 0, POSITIONS_AXIS)

    return KVCache(
        k=tuple(map(put, cache.k, pool.k)),
        v=tuple(map(put, cache.v, pool.v)),
        lengths=length_n.astype(jnp.int32),
    )


def store_blocks(pool: KVPool, cache: KVCache, rows_m, starts_m, dst_m) -> KVPool:
    """The pool with block dst_m[j] replaced by positions starts_m[j] .. + BLOCK - 1 of
    the cache's row rows_m[j], for each of the m entries (dst_m[j] >= N: dropped, a
    padding entry)."""
    block = pool.block

    def cut(src, row, start):  # src [n, K, S, Dh] -> [K, Sb, Dh]: one slice, not src[row]
        _, K, _, Dh = src.shape
        zero = jnp.zeros((), row.dtype)  # (one index dtype: int64 zeros under x64 clash)
        return jax.lax.dynamic_slice(src, (row, zero, start, zero), (1, K, block, Dh))[0]

    def put(blocks, src):
        cut_m = jax.vmap(cut, in_axes=(None, 0, 0))(src, rows_m, starts_m)
        return blocks.at[dst_m].set(cut_m.astype(blocks.dtype), mode="drop")

    return KVPool(k=tuple(map(put, pool.k, cache.k)), v=tuple(map(put, pool.v, cache.v)))
