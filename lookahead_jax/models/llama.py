"""The Llama-family forward pass (Hugging Face `LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM`) as a pure JAX function. What the families add —
projection biases, per-head q/k RMSNorm, sliding-window attention per layer — is read
from the config (config.py); a plain Llama's params and program are unchanged by it.

Shape letters: docs/architecture.md

Params are a registered dataclass pytree (`LlamaParams`, its per-layer weights in
`LayerParams`); `param_specs` declares every weight once — its shape and logical axis
names — in the same structure, and everything else derives from that one declaration:
the sharding rules (sharding.py), random init, the flat names of the on-disk checkpoint
(`flat_names`) and the converters' shape checks. Layers are stacked on a leading L axis
and run with `lax.scan`, so compile time does not grow with depth.

The forward knows nothing about lookahead: it takes explicit positions and a boolean
mask among the new tokens, and attends to a row's cache slots below its length. A
sliding window is applied here, from positions (a token at position p sees keys at
positions p - window < k; cache slot s holds position s), so every caller — prefill, plain
steps, each lookahead window and draft-tree node — gets it without knowing of it. A
lookahead step is just a particular (tokens, positions, mask). `LlamaLM` wraps it in
the model seam (seam.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from lookahead_jax.distributed import sharding
from lookahead_jax.models import kv_cache, quantize
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.kv_cache import KVCache
from lookahead_jax.models.quantize import einsum
from lookahead_jax.models.rope import apply_rope, rope_cos_sin


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One weight: its shape and a logical axis name per dimension (a pytree leaf)."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerParams:
    """Every layer's weights, stacked on a leading L axis."""

    attn_norm: jax.Array  # [L, D]
    wq: jax.Array  # [L, D, H, Dh]
    wk: jax.Array  # [L, D, K, Dh]
    wv: jax.Array  # [L, D, K, Dh]
    wo: jax.Array  # [L, H, Dh, D]
    mlp_norm: jax.Array  # [L, D]
    w_gate: jax.Array  # [L, D, F]
    w_up: jax.Array  # [L, D, F]
    w_down: jax.Array  # [L, F, D]
    # present only where the config has them (LlamaConfig.qkv_bias, o_bias, qk_norm,
    # mlp_bias); None leaves no trace in the pytree, so a plain Llama's is unchanged
    bq: jax.Array | None = None  # [L, H, Dh]
    bk: jax.Array | None = None  # [L, K, Dh]
    bv: jax.Array | None = None  # [L, K, Dh]
    bo: jax.Array | None = None  # [L, D]
    q_norm: jax.Array | None = None  # [L, Dh]
    k_norm: jax.Array | None = None  # [L, Dh]
    b_gate: jax.Array | None = None  # [L, F]
    b_up: jax.Array | None = None  # [L, F]
    b_down: jax.Array | None = None  # [L, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LlamaParams:
    embed: jax.Array  # [V, D]
    layers: LayerParams
    final_norm: jax.Array  # [D]
    lm_head: jax.Array | None = None  # [D, V]; None with tied embeddings

    @property
    def dtype(self):
        return self.embed.dtype


def param_specs(cfg: LlamaConfig, weights: str = "float") -> LlamaParams:
    """Every weight's ParamSpec, in the params' own structure. With weights="int8" or
    "q8_0" each matrix (quantize.CONTRACTED) is an Int8Weight of two ParamSpecs, its int8
    values and its scales (per output channel, or per block of 32 inputs)."""
    specs = _float_specs(cfg)
    if weights == "float":
        return specs
    quantize.check_weights(weights)
    flat = flat_names(specs)
    for name in quantize.CONTRACTED:
        if name in flat:
            flat[name] = quantize.int8_specs(name, flat[name], weights)
    return from_flat(cfg, flat)


def _float_specs(cfg: LlamaConfig) -> LlamaParams:
    L, D, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    spec = ParamSpec
    return LlamaParams(
        embed=spec((V, D), ("vocab", "embed")),
        layers=LayerParams(
            attn_norm=spec((L, D), ("layers", "embed")),
            wq=spec((L, D, H, Dh), ("layers", "embed", "heads", "head_dim")),
            wk=spec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim")),
            wv=spec((L, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim")),
            wo=spec((L, H, Dh, D), ("layers", "heads", "head_dim", "embed")),
            mlp_norm=spec((L, D), ("layers", "embed")),
            w_gate=spec((L, D, F), ("layers", "embed", "mlp")),
            w_up=spec((L, D, F), ("layers", "embed", "mlp")),
            w_down=spec((L, F, D), ("layers", "mlp", "embed")),
            # biases shard as their projection's output axis; q/k norms replicate
            **_if(
                cfg.qkv_bias,
                bq=spec((L, H, Dh), ("layers", "heads", "head_dim")),
                bk=spec((L, K, Dh), ("layers", "kv_heads", "head_dim")),
                bv=spec((L, K, Dh), ("layers", "kv_heads", "head_dim")),
            ),
            **_if(cfg.o_bias, bo=spec((L, D), ("layers", "embed"))),
            **_if(
                cfg.qk_norm,
                q_norm=spec((L, Dh), ("layers", "head_dim")),
                k_norm=spec((L, Dh), ("layers", "head_dim")),
            ),
            **_if(
                cfg.mlp_bias,
                b_gate=spec((L, F), ("layers", "mlp")),
                b_up=spec((L, F), ("layers", "mlp")),
                b_down=spec((L, D), ("layers", "embed")),
            ),
        ),
        final_norm=spec((D,), ("embed",)),
        lm_head=None if cfg.tie_word_embeddings else spec((D, V), ("embed", "vocab")),
    )


def _if(present: bool, **specs) -> dict:
    return specs if present else {}


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "name", getattr(k, "key", k))) for k in path)


def flat_names(tree, is_leaf=None) -> dict[str, object]:
    """{'layers/wq': leaf, ...}: the checkpoint's flat tensor names for a params-shaped
    tree (of arrays, specs or shardings); an int8 matrix's leaves are 'layers/wq/q' and
    'layers/wq/scale' unless `is_leaf` stops at the Int8Weight."""
    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_leaf)
    return {_path_name(p): leaf for p, leaf in leaves}


def from_flat(cfg: LlamaConfig, flat: dict[str, object]) -> LlamaParams:
    """The inverse of flat_names (of the float structure) for this config: `flat` maps each
    float weight's name to its leaf, which may itself be a pytree (an Int8Weight)."""
    specs = _float_specs(cfg)
    names = list(flat_names(specs))
    treedef = jax.tree_util.tree_structure(specs)
    return jax.tree_util.tree_unflatten(treedef, [flat[n] for n in names])


def init_params(cfg: LlamaConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02):
    """Random weights (normal, std `scale`; norms around 1) — for tests and timing."""
    named = flat_names(param_specs(cfg))
    subkeys = jax.random.split(key, len(named))
    flat = {}
    for (name, spec), k in zip(named.items(), subkeys, strict=True):
        noise = jax.random.normal(k, spec.shape)
        flat[name] = (1.0 + 0.1 * noise if name.endswith("norm") else scale * noise).astype(dtype)
    return from_flat(cfg, flat)


def accum_dtype(dtype):
    """float32 for bfloat16/float32 params; float64 stays float64 (the exactness tests)."""
    return jnp.promote_types(dtype, jnp.float32)


def rms_norm(x, weight, eps: float):
    """HF LlamaRMSNorm: normalise in float32, cast back, then scale."""
    xf = x.astype(accum_dtype(x.dtype))
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


NEG_INF = -1e30


def in_window(q_pos, k_pos, window):
    """Whether keys at positions `k_pos` are inside the sliding window of queries at
    `q_pos` (broadcast together): q - window < k. window: a traced int32 scalar, 0 = no window."""
    return (window <= 0) | (q_pos - k_pos < window)


def attention(
    q_btkqe,
    k_new_buke,
    v_new_buke,
    self_mask_btu,
    cache_k,
    cache_v,
    cache_len_b,
    positions_bt=None,
    window=None,
):
    """Softmax attention over [cache slots below each row's length] + [new tokens under mask].

    q          [B, T, K, Q, Dh]
    k/v_new    [B, U, K, Dh]     the new tokens' keys/values (U = T)
    self_mask  [B|1, T, U]      bool, which new tokens each new token sees
    cache_k/v  [B, S, K, Dh]     or None (prefill); slot s holds position s
    cache_len  [B]
    positions  [B, T]            the new tokens' positions (needed with `window`)
    window     int32 scalar or None: the sliding window (0: this layer attends fully)
    """
    scale = 1.0 / np.sqrt(q_btkqe.shape[-1])
    f32 = accum_dtype(q_btkqe.dtype)
    if window is not None:
        near = in_window(positions_bt[:, :, None], positions_bt[:, None, :], window)
        self_mask_btu = self_mask_btu & near
    s_new = jnp.einsum("btkqe,buke->bkqtu", q_btkqe, k_new_buke, preferred_element_type=f32)
    s_new = jnp.where(self_mask_btu[:, None, None], s_new * scale, NEG_INF)
    if cache_k is None:
        p = jax.nn.softmax(s_new, axis=-1).astype(v_new_buke.dtype)
        return jnp.einsum("bkqtu,buke->btkqe", p, v_new_buke)
    s_cache = jnp.einsum("btkqe,bske->bkqts", q_btkqe, cache_k, preferred_element_type=f32)
    slots = jnp.arange(cache_k.shape[1])
    visible = slots[None, None, :] < cache_len_b[:, None, None]  # [B, 1, S]
    if window is not None:
        visible = visible & in_window(positions_bt[:, :, None], slots[None, None, :], window)
    s_cache = jnp.where(visible[:, None, None], s_cache * scale, NEG_INF)  # [B,1,1,T|1,S]
    p = jax.nn.softmax(jnp.concatenate([s_cache, s_new], axis=-1), axis=-1)
    p = p.astype(v_new_buke.dtype)
    n_cache = cache_k.shape[1]
    out = jnp.einsum("bkqts,bske->btkqe", p[..., :n_cache], cache_v)
    return out + jnp.einsum("bkqtu,buke->btkqe", p[..., n_cache:], v_new_buke)


def forward(
    params: LlamaParams,
    cfg: LlamaConfig,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    self_mask_btu: jax.Array,
    cache: KVCache | None = None,
    logits_rows_br: jax.Array | None = None,
):
    """One pass over T new tokens per row.

    tokens, positions  [B, T] int32
    self_mask          [B or 1, T, T] bool: new token t may attend to new token u
    cache              attended up to each row's length; not modified here
    logits_rows        [B, R] indices into T of the tokens whose logits are needed
                       (None: all T). Skipping rows skips their share of the LM head.

    Returns logits [B, R, V] (float32; float64 for float64 params) and the new tokens'
    K/V, each [L, B, T, K, Dh] (keys after RoPE), for the caller to commit as it chooses.
    """
    dtype = params.embed.dtype
    B, T = tokens_bt.shape
    K, Q, Dh = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    x_btd = quantize.take_rows(params.embed, tokens_bt)
    cos, sin = rope_cos_sin(positions_bt, cfg.rope_inv_freq(), dtype)
    cache_len = None if cache is None else cache.lengths

    eps = cfg.rms_norm_eps

    def layer(x_btd, xs):
        lp, ck, cv, window = xs
        with jax.named_scope("attention"):
            h = rms_norm(x_btd, lp.attn_norm, eps)
            q = _plus(einsum("btd,dhe->bthe", h, lp.wq), lp.bq)
            k = _plus(einsum("btd,dke->btke", h, lp.wk), lp.bk)
            v = _plus(einsum("btd,dke->btke", h, lp.wv), lp.bv)
            if cfg.qk_norm:  # Qwen3: each head's q and k normalised over Dh
                q, k = rms_norm(q, lp.q_norm, eps), rms_norm(k, lp.k_norm, eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q = q.reshape(B, T, K, Q, Dh)
            o = attention(q, k, v, self_mask_btu, ck, cv, cache_len, positions_bt, window)
            o = einsum("bthe,hed->btd", o.reshape(B, T, K * Q, Dh), lp.wo)
            x_btd = x_btd + _plus(o, lp.bo)
        with jax.named_scope("mlp"):
            h = rms_norm(x_btd, lp.mlp_norm, eps)
            gate = jax.nn.silu(_plus(einsum("btd,df->btf", h, lp.w_gate), lp.b_gate))
            up = _plus(einsum("btd,df->btf", h, lp.w_up), lp.b_up)
            x_btd = x_btd + _plus(einsum("btf,fd->btd", gate * up, lp.w_down), lp.b_down)
        return x_btd, (k, v)

    caches = (None, None) if cache is None else (cache.k, cache.v)
    windows_l = jnp.asarray(cfg.layer_windows, jnp.int32) if cfg.layer_windows else None
    x_btd, (new_k, new_v) = jax.lax.scan(layer, x_btd, (params.layers, *caches, windows_l))

    if logits_rows_br is not None:
        x_btd = jnp.take_along_axis(x_btd, logits_rows_br[:, :, None], axis=1)  # [B, R, D]
    h = rms_norm(x_btd, params.final_norm, cfg.rms_norm_eps)
    acc = accum_dtype(dtype)
    if params.lm_head is None:
        logits = einsum("brd,vd->brv", h, params.embed, preferred_element_type=acc)
    else:
        logits = einsum("brd,dv->brv", h, params.lm_head, preferred_element_type=acc)
    return logits, new_k, new_v


def _plus(x, bias):
    """x + bias (broadcast over the leading axes), or x where the model has no bias."""
    return x if bias is None else x + bias


@dataclasses.dataclass(frozen=True)
class LlamaLM:
    """The Llama forward behind the model seam (seam.CausalLM): hashable, a jit static.
    `weights` says how the params hold their matrices: "float", "int8" or "q8_0"
    (quantize.py)."""

    cfg: LlamaConfig
    weights: str = "float"

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_context(self) -> int:
        return self.cfg.max_position_embeddings

    def apply(self, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br=None):
        return forward(params, self.cfg, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br)

    def init_cache(self, batch: int, slots: int, dtype) -> KVCache:
        c = self.cfg
        return kv_cache.init_cache(c.num_layers, batch, slots, c.num_kv_heads, c.head_dim, dtype)

    def param_shardings(self, mesh: Mesh | None):
        return sharding.shardings_for(param_specs(self.cfg, self.weights), mesh)


def quantize_params(params, cfg, shardings=None, weights: str = "int8"):
    """Float LlamaParams -> the same params with every matrix of CONTRACTED an Int8Weight
    of `weights` ("int8" or "q8_0"), each placed by `shardings` (the quantized params'
    shardings, LlamaLM.param_shardings) when given. One jitted quantization per matrix,
    so the float originals can go one by one."""
    specs = flat_names(param_specs(cfg))
    flat = flat_names(params)
    where = {} if shardings is None else flat_names(shardings, is_leaf=_is_int8)
    for name in quantize.CONTRACTED:
        if name not in flat:
            continue
        run = jax.jit(quantize.quantize, static_argnums=(1, 2), out_shardings=where.get(name))
        flat[name] = run(
            flat[name], quantize.contracted_dims(name, specs[name].axes), quantize.BLOCKS[weights]
        )
    return from_flat(cfg, flat)


def _is_int8(x) -> bool:
    return isinstance(x, quantize.Int8Weight)
