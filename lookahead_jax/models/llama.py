"""The Llama-family forward pass (Hugging Face `LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM`) as a pure JAX function. What the families add —
projection biases, per-head q/k RMSNorm, sliding-window attention per layer — is read
from the config (config.py); a plain Llama's params and program are unchanged by it.

Shape letters: docs/architecture.md

The params (`LlamaParams`, declared once by `param_specs`, stacked or per layer) are
llama_params.py's. The forward unrolls its layers and reads each layer's weights and K/V
cache buffers where they lie: under a `lax.scan` over stacked weights XLA:CPU copies
every layer's slice of every weight matrix out of the stack at every step, and of the
cache as well, so a step moved its weights three times and its cache several
(benchmarks/cpu/step_cost.md). The cost is compile time, which grows with depth
(MaxText's `scan_layers=False` makes the same trade for serving).

The forward knows nothing about lookahead: it takes explicit positions and a boolean
mask among the new tokens, and attends to a row's cache positions below its length
(attention.py; or, in a ragged pass, rows packed one after another: `apply_ragged`). A
sliding window is applied there, from positions (a token at position p sees keys at
positions p - window < k; the cache's entry s along S holds position s), so every
caller — prefill, plain steps, each lookahead window and draft-tree node — gets it
without knowing of it. A lookahead step is just a particular (tokens, positions, mask).
`LlamaLM` wraps it in the model seam (seam.py).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from lookahead_jax.distributed import sharding
from lookahead_jax.models import fused, kv_cache, packed, seam
from lookahead_jax.models.attention import (  # noqa: F401  (attention_block_for re-exported)
    ATTENTION_BLOCK,
    accum_dtype,
    attention,
    attention_block_for,
    segment_attention,
)
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.kv_cache import KVCache
from lookahead_jax.models.llama_params import LlamaParams, param_specs, per_layer, split_layers
from lookahead_jax.models.packed import einsum
from lookahead_jax.models.rope import apply_rope, rope_cos_sin


def rms_norm(x, weight, eps: float):
    """HF LlamaRMSNorm: normalise in float32, cast back, then scale."""
    xf = x.astype(accum_dtype(x.dtype))
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def head_rows_for(platform: str) -> int:
    """The rows a lone row's LM head matmul is given on `platform` (LlamaLM.head_rows): 2 on
    GPUs, 1 elsewhere. For one row XLA:GPU turns the bf16 x bf16 -> float32 product into a
    float32 copy of the whole head and a float32 gemv; two rows are a GEMM reading the bf16
    head (H200, llama3-8b's [4096, 128256] head: 1.29 -> 0.26 ms; its B = 1 step 6.08 ->
    5.12 ms: benchmarks/gpu/step_report_h200/step_report_head.md). The CPU's kernel reads
    the head once for any row count up to its tile, so one row costs no more there."""
    return 2 if platform == "gpu" else 1


def forward(
    params: LlamaParams,
    cfg: LlamaConfig,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    self_mask_btu: jax.Array | None,
    cache: KVCache | None = None,
    logits_rows_br: jax.Array | None = None,
    attention_block: int = ATTENTION_BLOCK,
    layer_passes: int = 1,
    head_rows: int = 1,
    first_bt: jax.Array | None = None,
):
    """One pass over T new tokens per row.

    tokens, positions  [B, T] int32
    self_mask          [B or 1, T, T] bool: new token t may attend to new token u; None
                       with `first` None: t sees u <= t (a causal pass, apply_causal)
    cache              attended up to each row's length; not modified here
    logits_rows        [B, R] indices into T of the tokens whose logits are needed
                       (None: all T). Skipping rows skips their share of the LM head.
    layer_passes       how many times the hidden state goes through the layers (1; more
                       only for autotune's probes, LlamaLM.first_layers)
    head_rows          the rows the LM head's matmul is given for a lone row (B = R = 1;
                       head_rows_for): it is padded with zero rows, their logits dropped
    first              [B, T] int32, or None: a ragged pass (self_mask unused): rows
                       packed one after another, token t seeing the tokens first[b, t]
                       .. t (attention.segment_attention) and, with a cache, the cache's
                       positions below its length (a prefix the rows packed in it share)

    Returns logits [B, R, V] (float32; float64 for float64 params) and the new tokens'
    K/V, each L arrays [B, K, T, Dh] (keys after RoPE; kv_cache.py's layout; of the last
    pass), for the caller to commit as it chooses.

    The layers run one after another, unrolled (a Python loop, not a scan), each reading
    its own weights and cache buffers in place (see `per_layer`); passes after the
    first go round them in a fori_loop.
    """
    x_btd = packed.take_rows(params.embed, tokens_bt)
    cos, sin = rope_cos_sin(positions_bt, cfg.rope_inv_freq(), params.embed.dtype)
    masks = (self_mask_btu, first_bt)
    layers = functools.partial(
        _layers, params, cfg, positions_bt, masks, cache, (cos, sin), attention_block
    )
    if layer_passes > 1:  # the passes before the last, whose K/V are not returned
        x_btd = jax.lax.fori_loop(0, layer_passes - 1, lambda _, x: layers(x)[0], x_btd)
    x_btd, new_k, new_v = layers(x_btd)
    if logits_rows_br is not None:
        x_btd = jnp.take_along_axis(x_btd, logits_rows_br[:, :, None], axis=1)  # [B, R, D]
    h = rms_norm(x_btd, params.final_norm, cfg.rms_norm_eps)
    R = h.shape[1]
    if h.shape[:2] == (1, 1) and head_rows > 1:  # a lone row: [1, head_rows, D], zeros after it
        h = jnp.pad(h, ((0, 0), (0, head_rows - 1), (0, 0)))
    acc = accum_dtype(params.embed.dtype)
    if params.lm_head is None:
        logits = einsum("brd,vd->brv", h, params.embed, preferred_element_type=acc)
    else:
        logits = einsum("brd,dv->brv", h, params.lm_head, preferred_element_type=acc)
    return logits[:, :R], new_k, new_v


def _layers(params, cfg, positions_bt, masks, cache, rope, attention_block, x_btd):
    """forward's layers over the hidden state x [B, T, D]: (x, new K, new V). masks:
    (the new tokens' self mask [B|1, T, T], a ragged pass's `first` [B, T] or None; both
    None: a causal pass, run as a ragged pass of one prompt a row where the CPU kernel
    runs it, else under the lower-triangular mask)."""
    self_mask_btu, first_bt = masks
    B, T = positions_bt.shape
    K, Q, Dh = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    kernel = cache is not None and _attention_kernel(params, cache.k[0].dtype, Dh)
    segments_kernel = _attention_kernel(params, x_btd.dtype, Dh)  # (a ragged pass's own part)
    if self_mask_btu is None and first_bt is None:  # a causal pass (LlamaLM.apply_causal)
        if segments_kernel:  # a ragged pass of one prompt a row: no T x T mask
            first_bt = jnp.zeros((B, T), jnp.int32)
        else:
            self_mask_btu = seam.causal_mask(T)
    cos, sin = rope
    eps = cfg.rms_norm_eps
    new_k, new_v = [], []
    for i, lp in enumerate(per_layer(params.layers)):
        window = cfg.attention_windows[i] if cfg.attention_windows else 0
        cached = () if cache is None else (cache.k[i], cache.v[i], cache.lengths)
        with jax.named_scope(f"layer_{i}"), jax.named_scope("attention"):
            h = rms_norm(x_btd, lp.attn_norm, eps)
            q, k, v = _qkv(h, lp, cfg.num_heads)
            if cfg.qk_norm:  # Qwen3: each head's q and k normalised over Dh
                q, k = rms_norm(q, lp.q_norm, eps), rms_norm(k, lp.k_norm, eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            k_bkte, v_bkte = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
            q = q.reshape(B, T, K, Q, Dh)
            if first_bt is not None:  # a ragged pass (after a shared prefix: the cache)
                shared = None if cache is None else (*cached, positions_bt, attention_block, kernel)
                o = segment_attention(
                    q, k_bkte, v_bkte, first_bt, window=window, prefix=shared,
                    segments_kernel=segments_kernel,
                )  # fmt: skip
            else:
                o = attention(
                    q,
                    k_bkte,
                    v_bkte,
                    self_mask_btu,
                    *cached,
                    positions_bt=positions_bt,
                    window=window,
                    block=attention_block,
                    kernel=kernel,
                )
            wo = packed.merge_leading(lp.wo, 2)  # [H * Dh, D]
            o = einsum("btf,fd->btd", o.reshape(B, T, K * Q * Dh), wo)
            x_btd = x_btd + _plus(o, lp.bo)
        with jax.named_scope(f"layer_{i}"), jax.named_scope("mlp"):
            h = rms_norm(x_btd, lp.mlp_norm, eps)
            gate, up = _gate_up(h, lp)
            gate = jax.nn.silu(gate)
            x_btd = x_btd + _plus(einsum("btf,fd->btd", gate * up, lp.w_down), lp.b_down)
        new_k.append(k_bkte)
        new_v.append(v_bkte)
    return x_btd, tuple(new_k), tuple(new_v)


def _qkv(h_btd, lp, H: int):
    """(q [B, T, H, Dh], k and v [B, T, K, Dh]): one matmul for a fused layer (fused.py),
    three for an unfused one."""
    if fused.is_fused(lp):
        qkv_bthe = _plus(einsum("btd,dhe->bthe", h_btd, lp.wqkv), lp.bqkv)  # h: H + 2K heads
        K = (qkv_bthe.shape[2] - H) // 2
        return qkv_bthe[:, :, :H], qkv_bthe[:, :, H : H + K], qkv_bthe[:, :, H + K :]
    q = _plus(einsum("btd,dhe->bthe", h_btd, lp.wq), lp.bq)
    k = _plus(einsum("btd,dke->btke", h_btd, lp.wk), lp.bk)
    v = _plus(einsum("btd,dke->btke", h_btd, lp.wv), lp.bv)
    return q, k, v


def _gate_up(h_btd, lp):
    """(gate, up) [B, T, F] before the activation: one matmul fused, two unfused."""
    if fused.is_fused(lp):
        gate_up_btf = _plus(einsum("btd,df->btf", h_btd, lp.w_gate_up), lp.b_gate_up)  # f: 2F
        F = gate_up_btf.shape[-1] // 2
        return gate_up_btf[..., :F], gate_up_btf[..., F:]
    gate = _plus(einsum("btd,df->btf", h_btd, lp.w_gate), lp.b_gate)
    return gate, _plus(einsum("btd,df->btf", h_btd, lp.w_up), lp.b_up)


def _attention_kernel(params: LlamaParams, dtype, head_dim: int) -> bool:
    """Whether attention over keys of `dtype` runs the CPU kernel (the cache's, a ragged
    pass's own): where the matmuls do (packed params: float32 on one CPU device with the
    kernel built, packed.wanted), over float32 keys, for a head dimension of whole AVX
    registers."""
    return packed.is_packed(params) and dtype == jnp.float32 and head_dim % 8 == 0


def _plus(x, bias):
    """x + bias (broadcast over the leading axes), or x where the model has no bias."""
    return x if bias is None else x + bias


@dataclasses.dataclass(frozen=True)
class LlamaLM:
    """The Llama forward behind the model seam (seam.CausalLM): hashable, a jit static.
    `weights` says how the params hold their matrices: "float", "int8" or "q8_0"
    (quantize.py); `attention_block` how many cache positions the attention reads at a time
    (attention_block_for the platform: lj.load sets it). Its params are per layer
    (split_layers)."""

    cfg: LlamaConfig
    weights: str = "float"
    attention_block: int = ATTENTION_BLOCK
    layer_passes: int = 1  # > 1 only in autotune's probes (first_layers)
    head_rows: int = 1  # the rows a lone row's LM head matmul is given (head_rows_for)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_context(self) -> int:
        return self.cfg.max_position_embeddings

    def apply(self, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br=None):
        return self._forward(params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br)

    def apply_ragged(self, params, tokens_bt, positions_bt, first_bt, logits_rows_br, cache=None):
        """`apply` of a ragged pass (seam.apply_ragged): rows packed one after another,
        token t seeing the tokens first[b, t] .. t, and the cache's positions below its
        length where there is one (a prefix the rows share)."""
        return self._forward(params, tokens_bt, positions_bt, None, cache, logits_rows_br, first_bt)

    def apply_causal(self, params, tokens_bt, positions_bt, cache=None, logits_rows_br=None):
        """`apply` under the lower-triangular mask (seam.apply_causal): where the CPU kernel
        runs the attention (packed float32 params), as a ragged pass of one prompt a row,
        each query reading its keys up to itself, not a T x T mask's every score (a [16,
        256] prompt prefill 6.99 -> 5.75 s, [1, 512] 1.05 -> 0.84 s, medians: SmolLM2, a
        2-core Intel Xeon, family 6 model 167, benchmarks/cpu/causal_prefill_xeon_167_s87.md);
        wherever the params are not packed (GPU, TPU, a mesh, float64, bfloat16, Q8_0)
        `apply` under the mask."""
        return self._forward(params, tokens_bt, positions_bt, None, cache, logits_rows_br)

    def _forward(
        self, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br, first_bt=None
    ):
        """`forward` with this model's settings: the three passes above."""
        return forward(
            params,
            self.cfg,
            tokens_bt,
            positions_bt,
            mask_btu,
            cache,
            logits_rows_br,
            self.attention_block,
            self.layer_passes,
            self.head_rows,
            first_bt,
        )

    def first_layers(self, params, n: int):
        """(lm, params): this model cut to its first `n` layers, sharing the weights. With
        `layer_passes` = L / n, what autotune's probes time: a step's work at the full
        depth, compiled for n layers (cost_curve.probe_model)."""
        windows = self.cfg.attention_windows[:n]
        cfg = dataclasses.replace(self.cfg, num_layers=n, attention_windows=windows)
        layers = per_layer(params.layers)[:n]
        return dataclasses.replace(self, cfg=cfg), dataclasses.replace(params, layers=layers)

    def init_cache(self, batch: int, positions: int, dtype) -> KVCache:
        c = self.cfg
        return kv_cache.init_cache(
            c.num_layers, batch, positions, c.num_kv_heads, c.head_dim, dtype
        )

    def param_shardings(self, mesh: Mesh | None):
        """One Sharding per array of the per-layer params."""
        return sharding.shardings_for(split_layers(param_specs(self.cfg, self.weights)), mesh)
