"""A fixed-shape KV cache with a length per batch row.

    k, v     [L, B, S, K, Dh]   layers, batch, slots, kv heads, head dim
    lengths  [B]                tokens committed per row; slots >= length hold garbage

Rows grow independently: a lookahead step commits 1..max_emit tokens per row, each row
at its own length. Attention masks slots `>= lengths[b]`, so garbage written
past a row's length (by a fixed-size commit) is never read and is overwritten
by the next commit.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    k: jax.Array  # [L, B, S, K, Dh]
    v: jax.Array  # [L, B, S, K, Dh]
    lengths: jax.Array  # [B] int32


def init_cache(layers: int, batch: int, slots: int, kv_heads: int, head_dim: int, dtype):
    """An empty cache [L, B, S, K, Dh] (every length 0)."""
    shape = (layers, batch, slots, kv_heads, head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def write_prefix(cache: KVCache, new_k, new_v, lengths_b) -> KVCache:
    """Write a prefill's K/V `[L, B, T, K, Dh]` into slots 0..T-1; set lengths."""
    k = jax.lax.dynamic_update_slice_in_dim(cache.k, new_k.astype(cache.k.dtype), 0, axis=2)
    v = jax.lax.dynamic_update_slice_in_dim(cache.v, new_v.astype(cache.v.dtype), 0, axis=2)
    return KVCache(k=k, v=v, lengths=lengths_b.astype(jnp.int32))


def commit(cache: KVCache, new_k, new_v, src_be, count_b) -> KVCache:
    """Append selected new tokens' K/V to each row at its own length.

    new_k, new_v  [L, B, T, K, Dh]  K/V of the tokens of one forward pass
    src_be        [B, E]            which of the T tokens to commit, in order
    count_b       [B]               how many of the E are real (0..E)

    Row b gets `new_k[:, b, src_be[b, j]]` at slot `lengths[b] + j` for every j < E;
    only the first `count_b[b]` of them lie below the new length, the rest are
    the garbage past the length that the class docstring allows. The caller
    guarantees `lengths + E <= S` (a clamped slice would overwrite real K/V).
    """
    # Garbage slots are multiplied by zero attention weights, so they must stay finite:
    # clip (never fill with NaN) any index a caller computes for an unused slot.
    idx = src_be[None, :, :, None, None]
    take = lambda x: jnp.take_along_axis(x, idx, axis=2, mode="clip")  # noqa: E731
    sel_k = take(new_k).astype(cache.k.dtype)  # [L, B, E, K, Dh]
    sel_v = take(new_v).astype(cache.v.dtype)

    def write_row(dst, src, start):  # dst [L, S, K, Dh], src [L, E, K, Dh]
        return jax.lax.dynamic_update_slice_in_dim(dst, src, start, axis=1)

    write = jax.vmap(write_row, in_axes=(1, 1, 0), out_axes=1)
    return KVCache(
        k=write(cache.k, sel_k, cache.lengths),
        v=write(cache.v, sel_v, cache.lengths),
        lengths=cache.lengths + count_b.astype(jnp.int32),
    )
