"""A fixed-shape KV cache with a length per batch row, one buffer per layer.

    k, v     L arrays [B, K, S, Dh]   per layer: batch, kv heads, positions, head dim
    lengths  [B]                      tokens committed per row; positions >= length hold garbage

The layout is the one the attention reads without a transpose (batch and kv heads lead,
as the dots' batch dimensions, so a layer's scores are [B, K, T*Q, Dh] x [B, K, S, Dh] and
its output [B, K, T*Q, S] x [B, K, S, Dh]), and every layer owns its buffer: a forward
that unrolls its layers reads each one in place, where slicing one layer out of a stacked
[L, ...] array (a scan over layers) makes XLA:CPU copy it every step. The same holds for
the weights (llama.py).

Rows grow independently: a lookahead step commits 1..max_emit tokens per row, each row
at its own length. Attention masks positions `>= lengths[b]`, so garbage written
past a row's length (by a fixed-size commit) is never read and is overwritten
by the next commit. Every write here is a scatter into the buffers' own layout, which
XLA performs in place: a step writes only the new tokens' K/V.

A forward's new K/V come in the same layout, with the pass's T tokens for S:
L arrays [B, K, T, Dh].
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Shaped

BATCH_AXIS, POSITIONS_AXIS = 0, 2  # of each layer's [B, K, S, Dh]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    k: tuple[Shaped[Array, "B K S Dh"], ...]  # one per layer (L)
    v: tuple[Shaped[Array, "B K S Dh"], ...]
    lengths: Int[Array, " B"]

    @property
    def positions(self) -> int:
        """S, the positions each row's buffers hold."""
        return self.k[0].shape[POSITIONS_AXIS]


def init_cache(layers: int, batch: int, positions: int, kv_heads: int, head_dim: int, dtype):
    """An empty cache of L buffers [B, K, S, Dh] (every length 0)."""
    shape = (batch, kv_heads, positions, head_dim)
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(layers)),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def write_prefix(cache: KVCache, new_k, new_v, lengths_b) -> KVCache:
    """Write a prefill's K/V (L x [B, K, T, Dh]) into positions 0..T-1; set lengths."""

    def put(dst, src):
        return jax.lax.dynamic_update_slice_in_dim(dst, src.astype(dst.dtype), 0, POSITIONS_AXIS)

    return KVCache(
        k=tuple(map(put, cache.k, new_k)),
        v=tuple(map(put, cache.v, new_v)),
        lengths=lengths_b.astype(jnp.int32),
    )


def write_ragged(cache: KVCache, new_k, new_v, row_t, position_t, lengths_b) -> KVCache:
    """Write a ragged pass's K/V (L x [1, K, T, Dh]: rows packed one after another) token
    by token: token t's at row row_t[t], position position_t[t] (row B or more: dropped,
    the pass's tail); set lengths [B]."""

    def put(dst, src):  # dst [B, K, S, Dh]; x[rows, :, at] indexes T pairs: [T, K, Dh]
        update = jnp.swapaxes(src[0], 0, 1).astype(dst.dtype)
        return dst.at[row_t, :, position_t].set(update, mode="drop")

    return KVCache(
        k=tuple(map(put, cache.k, new_k)),
        v=tuple(map(put, cache.v, new_v)),
        lengths=lengths_b.astype(jnp.int32),
    )


def commit(cache: KVCache, new_k, new_v, src_be, count_b) -> KVCache:
    """Append selected new tokens' K/V to each row at its own length.

    new_k, new_v  L x [B, K, T, Dh]  K/V of the tokens of one forward pass
    src_be        [B, E]            which of the T tokens to commit, in order
    count_b       [B]               how many of the E are real (0..E)

    Row b gets `new_k[l][b, :, src_be[b, j]]` at position `lengths[b] + j` for every j < E;
    only the first `count_b[b]` of them lie below the new length, the rest are
    the garbage past the length that the class docstring allows. The caller
    guarantees `lengths + E <= S` (a write past S would be dropped, not clamped).

    Example (one row, E = 3, lengths = [5], src = [[0, 4, 2]], count = [2]): positions 5, 6, 7
    get the pass's tokens 0, 4, 2; the new length is 7, so position 7 is garbage for now.
    """
    B, E = src_be.shape
    rows_be = jnp.broadcast_to(jnp.arange(B)[:, None], (B, E))
    at_be = cache.lengths[:, None] + jnp.arange(E, dtype=jnp.int32)[None]
    # Garbage positions are multiplied by zero attention weights, so they must stay finite:
    # clip (never fill with NaN) any index a caller computes for an unused position.
    pick = src_be[:, None, :, None]

    def put(dst, src):  # dst [B, K, S, Dh], src [B, K, T, Dh]
        sel = jnp.take_along_axis(src, pick, axis=POSITIONS_AXIS, mode="clip")  # [B, K, E, Dh]
        # x[rows, :, at] indexes [B, E] pairs: its update is [B, E, K, Dh]
        return dst.at[rows_be, :, at_be].set(
            jnp.swapaxes(sel, 1, 2).astype(dst.dtype),
            mode="drop",
            unique_indices=True,
            indices_are_sorted=True,
        )

    return KVCache(
        k=tuple(map(put, cache.k, new_k)),
        v=tuple(map(put, cache.v, new_v)),
        lengths=cache.lengths + count_b.astype(jnp.int32),
    )


def map_buffers(fn, cache: KVCache) -> KVCache:
    """The cache with `fn` applied to every layer's K and V buffer (lengths kept)."""
    return dataclasses.replace(cache, k=tuple(map(fn, cache.k)), v=tuple(map(fn, cache.v)))
