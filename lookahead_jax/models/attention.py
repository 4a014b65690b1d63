"""Attention over a row's cache and the new tokens of a pass (`attention`), and over
ragged rows packed one after another in one pass (`segment_attention`: a ragged prefill,
decode_state.RaggedPrompts). The Llama forward (llama.py) calls them; nothing here knows
of a model's weights.

Shape letters: docs/architecture.md
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.models import cpu_kernel


def accum_dtype(dtype):
    """float32 for bfloat16/float32 params; float64 stays float64 (the exactness tests)."""
    return jnp.promote_types(dtype, jnp.float32)


NEG_INF = -1e30

# Cache positions one step of attention reads at a time: the attention runs over blocks of
# this many positions up to the batch's longest row, so a step costs what the live rows hold,
# not the cache's size S (a cache of at most this many positions is read whole). A block
# of 0 reads the whole cache at once, masked past each row's length (no loop).
ATTENTION_BLOCK = 64


def attention_block_for(platform: str) -> int:
    """How many cache positions the attention reads at a time on `platform` (a jax
    Device.platform): ATTENTION_BLOCK on the CPU, where a loop over blocks up to the
    longest row costs nothing per iteration; 0 (the whole cache) on GPU and TPU, where a
    loop whose trip count is known only on the device reads its predicate back to the
    host every iteration and splits the step's command buffer (CUDA graph), one loop per
    layer (issue 49). The price: every step reads the cache's whole capacity S, and the
    scores [B, K, T, Q, S] of a layer are whole (float32), not a block's."""
    return ATTENTION_BLOCK if platform == "cpu" else 0


def in_window(q_pos, k_pos, window: int):
    """Whether keys at positions `k_pos` are inside the sliding window of queries at
    `q_pos` (broadcast together): q - window < k."""
    return q_pos - k_pos < window


def attention(
    q_btkqe,
    k_new_bkue,
    v_new_bkue,
    self_mask_btu,
    cache_k_bkse=None,
    cache_v_bkse=None,
    cache_len_b=None,
    positions_bt=None,
    window: int = 0,
    block: int = ATTENTION_BLOCK,
    kernel: bool = False,
):
    """Softmax attention over [cache positions below each row's length] + [new tokens under mask].

    q          [B, T, K, Q, Dh]
    k/v_new    [B, K, U, Dh]     the new tokens' keys/values (U = T)
    self_mask  [B|1, T, U]       bool, which new tokens each new token sees
    cache_k/v  [B, K, S, Dh]     or None (prefill); entry s along S holds position s
    cache_len  [B]
    positions  [B, T]            the new tokens' positions (needed with a window)
    window     the sliding window in positions (0: this layer attends fully)
    block      cache positions per block (ATTENTION_BLOCK; 0: the whole cache, no loop)
    kernel     read the cache with the CPU kernel (cpu_kernel.cache_attention; float32)

    Returns [B, T, K, Q, Dh]. The softmax is computed online (flash-decoding): per query
    a running max `top` of the scores, `mass` = sum of exp(score - top) and `acc` = the
    values weighted by exp(score - top), over the new tokens first and then the cache,
    `block` positions at a time, as far as the longest row's length. A block past a row's
    length is masked whole for it, which leaves its top, mass and acc exactly as they were
    (its scores are NEG_INF: exp(NEG_INF - top) = 0 and the rescale is exp(0) = 1), so a
    row's output does not depend on the other rows' lengths. With `kernel` the cache's
    part is the CPU kernel's (top, mass, acc), merged into the new tokens' the same way.
    """
    scale = float(1.0 / np.sqrt(q_btkqe.shape[-1]))  # a Python float: weakly typed
    f32 = accum_dtype(q_btkqe.dtype)
    q_bktqe = jnp.swapaxes(q_btkqe, 1, 2)
    if window:
        near = in_window(positions_bt[:, :, None], positions_bt[:, None, :], window)
        self_mask_btu = self_mask_btu & near
    s_new = jnp.einsum("bktqe,bkue->bktqu", q_bktqe, k_new_bkue, preferred_element_type=f32)
    s_new = jnp.where(self_mask_btu[:, None, :, None, :], s_new * scale, NEG_INF)
    dtype = v_new_bkue.dtype
    if cache_k_bkse is None:
        p = jax.nn.softmax(s_new, axis=-1).astype(dtype)
        return jnp.einsum("bktqu,bkue->btkqe", p, v_new_bkue)
    # every token sees itself, so top is finite from here on
    top = jnp.max(s_new, axis=-1, keepdims=True)  # [B, K, T, Q, 1]
    p = jnp.exp(s_new - top)
    carry = (
        top,
        jnp.sum(p, axis=-1, keepdims=True),
        jnp.einsum("bktqu,bkue->bktqe", p.astype(dtype), v_new_bkue, preferred_element_type=f32),
    )
    cache = (cache_k_bkse, cache_v_bkse, cache_len_b)
    carry = fold_cache(carry, q_bktqe, cache, positions_bt, window, block, kernel, dtype)
    _, mass, acc = carry
    return jnp.swapaxes(acc / mass, 1, 2).astype(dtype)


def fold_cache(carry, q_bktqe, cache, positions_bt, window: int, block: int, kernel: bool, dtype):
    """The online softmax's (top, mass, acc) [B, K, T, Q, 1 | Dh] with the cache's
    positions below each row's length folded in (cache: K/V [B, K, S, Dh], lengths [B]),
    `block` positions at a time as far as the longest row (0: all S at once), or by the
    CPU kernel (`kernel`). Every query's top must be finite already (it saw a key)."""
    cache_k_bkse, cache_v_bkse, cache_len_b = cache
    scale = float(1.0 / np.sqrt(q_bktqe.shape[-1]))
    f32 = accum_dtype(q_bktqe.dtype)

    def absorb(carry, k_bkse, v_bkse, at_s, fresh_s):
        """Fold the cache positions `at_s` (K/V [B, K, S', Dh], S' positions of the cache)
        into (top, mass, acc); positions where `fresh_s` is False were folded in already."""
        s = jnp.einsum("bktqe,bkse->bktqs", q_bktqe, k_bkse, preferred_element_type=f32)
        visible = fresh_s[None, None, :] & (at_s[None, None, :] < cache_len_b[:, None, None])
        if window:
            visible = visible & in_window(positions_bt[:, :, None], at_s[None, None, :], window)
        s = jnp.where(visible[:, None, :, None, :], s * scale, NEG_INF)  # [B, K, T, Q, S']
        return online_fold(carry, s, v_bkse, "bktqs,bkse->bktqe", dtype)

    S = cache_k_bkse.shape[2]
    if kernel:
        carry = _kernel_cache_part(carry, q_bktqe, cache, positions_bt, window, scale)
    elif block == 0 or block >= S:
        at = jnp.arange(S)
        carry = absorb(carry, cache_k_bkse, cache_v_bkse, at, at >= 0)
    else:

        def one_block(j, carry):
            # the last block is moved back to end at S; its positions below j * block
            # belong to the block before and are not folded in twice
            start = jnp.minimum(j * block, S - block)
            k = jax.lax.dynamic_slice_in_dim(cache_k_bkse, start, block, axis=2)
            v = jax.lax.dynamic_slice_in_dim(cache_v_bkse, start, block, axis=2)
            at = start + jnp.arange(block)
            return absorb(carry, k, v, at, at >= j * block)

        n_blocks = (jnp.max(cache_len_b) + block - 1) // block
        carry = jax.lax.fori_loop(0, n_blocks, one_block, carry)
    return carry


def online_fold(carry, s, v, pv_spec: str, dtype):
    """The online softmax's (top, mass, acc) with more keys folded in: `s` their masked,
    scaled scores (keys on the last axis; NEG_INF where hidden), `v` their values, and
    pv_spec the einsum of the weights (cast to `dtype`, the new tokens' values') with `v`
    into acc's shape. top and mass are
    rescaled to the new running max; a key hidden from a query adds exp(NEG_INF - top) =
    0 there (once its top is finite: a query's first fold must hold a key it sees)."""
    top, mass, acc = carry
    new_top = jnp.maximum(top, jnp.max(s, axis=-1, keepdims=True))
    rescale = jnp.exp(top - new_top)
    p = jnp.exp(s - new_top)
    f32 = acc.dtype
    acc = acc * rescale + jnp.einsum(pv_spec, p.astype(dtype), v, preferred_element_type=f32)
    return new_top, mass * rescale + jnp.sum(p, axis=-1, keepdims=True), acc


def _kernel_cache_part(carry, q_bktqe, cache, positions_bt, window: int, scale: float):
    """attention's (top, mass, acc) with the cache's part folded in by the CPU kernel
    (cpu_kernel.cache_attention): its own (top, mass, acc) over the cache (K/V [B, K, S,
    Dh], lengths [B]), merged with the new tokens' by the same rescaling."""
    cache_k_bkse, cache_v_bkse, cache_len_b = cache
    B, K, T, Q, Dh = q_bktqe.shape
    if positions_bt is None:  # only a window reads them
        assert not window, "a sliding window needs the tokens' positions"
        positions_bt = jnp.zeros((B, T), jnp.int32)
    parts = cpu_kernel.cache_attention(
        q_bktqe.reshape(B, K, T * Q, Dh),
        cache_k_bkse,
        cache_v_bkse,
        cache_len_b,
        positions_bt,
        window,
        scale,
    )
    top_c, mass_c, acc_c = (x.reshape(B, K, T, Q, -1) for x in parts)
    top, mass, acc = carry
    new_top = jnp.maximum(top, top_c)
    mine, theirs = jnp.exp(top - new_top), jnp.exp(top_c - new_top)
    return new_top, mass * mine + mass_c * theirs, acc * mine + acc_c * theirs


# Query positions of a ragged pass that segment_attention takes at a time
SEGMENT_BLOCK = 128


def segment_attention(
    q_btkqe, k_bkue, v_bkue, first_bt, window: int = 0, block=SEGMENT_BLOCK, prefix=None,
    segments_kernel: bool = False,
):  # fmt: skip
    """Causal attention among rows packed one after another in a pass of T tokens (a
    ragged prefill, decode_state.RaggedPrompts): token t sees the tokens u with
    first[b, t] <= u <= t, its own row's up to itself, and, with `prefix`, the cache
    positions every row of the pass shares (a ragged pass after a cached prefix,
    decode_state.SharedPrefix).

    q          [B, T, K, Q, Dh]
    k/v        [B, K, U, Dh]     (U = T)
    first      [B, T] int32      the index of each token's row's first token (non-decreasing
                                 in t; a padding token's is its own index: it sees itself)
    window     the sliding window in positions (0: none); within a row, t - u is the
               positions' distance, so t - u < window
    block      query positions a block
    prefix     (cache K/V [B, K, S, Dh], lengths [B], positions [B, T], attention block,
               kernel) or None: every token also sees the cache's positions below the
               length, folded in as `attention` folds a cache (fold_cache), after the
               pass's own keys (each query's top is finite by then)
    segments_kernel  the pass's own part by the CPU kernel (cpu_kernel.cache_attention's
               segments; float32): each query reads only its row's keys, 16 positions at a
               time, where the blocks below fold every block's whole square (`prefix`'s
               own `kernel` is the cache's)

    Returns [B, T, K, Q, Dh]. The T tokens are cut into blocks of `block` queries. Query
    block j's keys lie in key blocks first[j * block] // block .. j, so step d folds key
    block j - d into query block j, for every j at once, with `attention`'s online softmax
    (d = 0 first: every query sees itself there, so its running max is finite from then
    on); there are as many steps as the farthest block reaches back, the longest row's
    blocks + 1. A pass costs T x (the longest row + block) scores, where one padded row
    a prompt costs rows x side^2.

    Worked example (block 4; rows of 3, 6 and 2 tokens, then 1 padding token; T = 12):
        first = [0 0 0 3 3 3 3 3 3 9 9 11]
        query block 0 (t 0-3) reaches back to key block 0 (first[0] = 0): d = 0
        query block 1 (t 4-7) to key block 0 (first[4] = 3): d = 0, 1
        query block 2 (t 8-11) to key block 0 (first[8] = 3): d = 0, 1, 2 -> 3 steps
    """
    if segments_kernel:
        return _kernel_segments(q_btkqe, k_bkue, v_bkue, first_bt, window, prefix)
    B, T, K, Q, Dh = q_btkqe.shape
    C = min(block, T)
    n = -(-T // C)
    pad = n * C - T
    scale = float(1.0 / np.sqrt(Dh))
    f32, dtype = accum_dtype(q_btkqe.dtype), v_bkue.dtype
    t_all = jnp.arange(n * C, dtype=jnp.int32)
    if pad:  # padding queries and keys past T: each its own row
        q_btkqe = jnp.pad(q_btkqe, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
        k_bkue, v_bkue = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k_bkue, v_bkue))
        first_bt = jnp.concatenate([first_bt, jnp.broadcast_to(t_all[T:], (B, pad))], axis=1)
    q_bkncqe = q_btkqe.reshape(B, n, C, K, Q, Dh).transpose(0, 3, 1, 2, 4, 5)
    k_bknue, v_bknue = (x.reshape(B, K, n, C, Dh) for x in (k_bkue, v_bkue))
    first_bnc = first_bt.reshape(B, n, C)
    t_nc = t_all.reshape(n, C)

    def fold(d, carry):
        """Key block j - d into every query block j (none where j - d < 0)."""
        src_n = jnp.arange(n) - d
        at_n = jnp.maximum(src_n, 0)
        k_blk, v_blk = (jnp.take(x, at_n, axis=2) for x in (k_bknue, v_bknue))
        u_nu = at_n[:, None] * C + jnp.arange(C)[None]
        t, u = t_nc[None, :, :, None], u_nu[None, :, None, :]  # [1, n, C, 1], [1, n, 1, C]
        visible = (u <= t) & (u >= first_bnc[..., None]) & (src_n >= 0)[None, :, None, None]
        if window:  # (within a row, t - u is the positions' distance)
            visible = visible & in_window(t, u, window)
        s = jnp.einsum("bkncqe,bknue->bkncqu", q_bkncqe, k_blk, preferred_element_type=f32)
        s = jnp.where(visible[:, None, :, :, None, :], s * scale, NEG_INF)
        return online_fold(carry, s, v_blk, "bkncqu,bknue->bkncqe", dtype)

    reach = jnp.max(jnp.arange(n)[None] - first_bnc[:, :, 0] // C) + 1
    shape = (B, K, n, C, Q, 1)
    acc = jnp.zeros((*shape[:-1], Dh), f32)
    carry = (jnp.full(shape, NEG_INF, f32), jnp.zeros(shape, f32), acc)
    carry = jax.lax.fori_loop(0, reach, fold, carry)
    if prefix is not None:  # [B, K, n * C, Q, ...] as attention's carry, the pass's tail too
        flat = lambda x: x.reshape(B, K, n * C, Q, -1)  # noqa: E731
        q_bktqe = q_bkncqe.reshape(B, K, n * C, Q, Dh)
        carry = _fold_prefix(tuple(map(flat, carry)), q_bktqe, prefix, window, dtype, pad)
        carry = tuple(x.reshape(*shape[:-1], -1) for x in carry)
    _, mass, acc = carry
    out = (acc / mass).astype(dtype).transpose(0, 2, 3, 1, 4, 5)  # [B, n, C, K, Q, Dh]
    return out.reshape(B, n * C, K, Q, Dh)[:, :T]


def _kernel_segments(q_btkqe, k_bkue, v_bkue, first_bt, window: int, prefix):
    """segment_attention with the pass's own part by the CPU kernel (float32), the
    prefix's (where there is one) folded in after it as fold_cache folds a cache. Fifteen
    rows of 40-94 tokens in a pass of 1,024, SmolLM2's 30 layers: 105-113 ms, where XLA's
    blocks of 128 take 378-408 ms (a 2-core Intel Xeon, family 6 model 167:
    benchmarks/cpu/ragged_segments_xeon_167_s86.md)."""
    assert q_btkqe.dtype == jnp.float32, "the CPU kernel's attention is float32 only"
    B, T, K, Q, Dh = q_btkqe.shape
    q_bktqe = jnp.swapaxes(q_btkqe, 1, 2)
    scale = float(1.0 / np.sqrt(Dh))
    lengths_b = jnp.full((B,), T, jnp.int32)
    parts = cpu_kernel.cache_attention(
        q_bktqe.reshape(B, K, T * Q, Dh), k_bkue, v_bkue, lengths_b, first_bt, window, scale,
        segments=True,
    )  # fmt: skip
    carry = tuple(x.reshape(B, K, T, Q, -1) for x in parts)  # (each token saw itself)
    if prefix is not None:
        carry = _fold_prefix(carry, q_bktqe, prefix, window, v_bkue.dtype)
    _, mass, acc = carry
    return jnp.swapaxes(acc / mass, 1, 2).astype(v_bkue.dtype)


def _fold_prefix(carry, q_bktqe, prefix, window: int, dtype, pad: int = 0):
    """segment_attention's carry [B, K, T', Q, 1 | Dh] with the cache positions of its
    `prefix` folded in (fold_cache); the prefix's positions [B, T] padded by `pad` to T'
    (XLA's blocks run the pass's tail too)."""
    cache_k, cache_v, cache_len_b, positions_bt, cache_block, kernel = prefix
    positions_bt = jnp.pad(positions_bt, ((0, 0), (0, pad)))
    cache = (cache_k, cache_v, cache_len_b)
    return fold_cache(carry, q_bktqe, cache, positions_bt, window, cache_block, kernel, dtype)
