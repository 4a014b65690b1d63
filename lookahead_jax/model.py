"""The Llama forward pass (Hugging Face `LlamaForCausalLM`) as a pure JAX function.

Shape legend, used in names (`x_btd`) and einsum strings:

    B batch          T new tokens in this pass     S cache slots
    D model dim      H query heads                 K kv heads
    Q = H/K query heads per kv head (GQA group)    E head dim (Dh)
    F MLP hidden     V vocab                       L layers
    R rows whose logits are wanted                 U new tokens, as keys

Params are a nested dict of arrays; `param_specs` declares every weight once
with its shape and logical axis names (used by conversion shape checks and by
the sharding rules). Layers are stacked on a leading L axis and run with
`lax.scan`, so compile time does not grow with depth.

The forward knows nothing about lookahead: it takes explicit positions and a
boolean mask among the new tokens, and attends to a row's cache slots below
its length. A lookahead step is just a particular (tokens, positions, mask).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.config import LlamaConfig
from lookahead_jax.kv_cache import KVCache
from lookahead_jax.rope import apply_rope, rope_cos_sin

Params = dict  # nested dict of arrays, layout given by param_specs


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str, ...]  # logical axis names, one per dim


def param_specs(cfg: LlamaConfig) -> dict[str, ParamSpec]:
    """Every weight, by '/'-joined path: its shape and logical axes."""
    L, D, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed")),
        "layers/attn_norm": ParamSpec((L, D), ("layers", "embed")),
        "layers/wq": ParamSpec((L, D, H, E), ("layers", "embed", "heads", "head_dim")),
        "layers/wk": ParamSpec((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim")),
        "layers/wv": ParamSpec((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim")),
        "layers/wo": ParamSpec((L, H, E, D), ("layers", "heads", "head_dim", "embed")),
        "layers/mlp_norm": ParamSpec((L, D), ("layers", "embed")),
        "layers/w_gate": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "layers/w_up": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "layers/w_down": ParamSpec((L, F, D), ("layers", "mlp", "embed")),
        "final_norm": ParamSpec((D,), ("embed",)),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((D, V), ("embed", "vocab"))
    return specs


def unflatten(flat: dict[str, object]) -> Params:
    """{'layers/wq': x, ...} -> {'layers': {'wq': x}, ...}"""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def flatten(params: Params, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in params.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, path + "/"))
        else:
            out[path] = v
    return out


def init_params(cfg: LlamaConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02) -> Params:
    """Random weights (normal, std `scale`; norms around 1) — for tests and timing."""
    specs = param_specs(cfg)
    keys = jax.random.split(key, len(specs))
    flat = {}
    for (path, spec), k in zip(specs.items(), keys, strict=True):
        if path.endswith("norm"):
            flat[path] = (1.0 + 0.1 * jax.random.normal(k, spec.shape)).astype(dtype)
        else:
            flat[path] = (scale * jax.random.normal(k, spec.shape)).astype(dtype)
    return unflatten(flat)


def accum_dtype(dtype):
    """float32 for bfloat16/float32 params; float64 stays float64 (the exactness tests)."""
    return jnp.promote_types(dtype, jnp.float32)


def rms_norm(x, weight, eps: float):
    """HF LlamaRMSNorm: normalise in float32, cast back, then scale."""
    xf = x.astype(accum_dtype(x.dtype))
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


NEG_INF = -1e30


def attention(q_btkqe, k_new_bske, v_new_bske, self_mask_btu, cache_k, cache_v, cache_len_b):
    """Softmax attention over [cache slots below each row's length] + [new tokens under mask].

    q          [B, T, K, Q, E]
    k/v_new    [B, U, K, E]     the new tokens' keys/values (U = T)
    self_mask  [B|1, T, U]      bool, which new tokens each new token sees
    cache_k/v  [B, S, K, E]     or None (prefill)
    cache_len  [B]
    """
    scale = 1.0 / np.sqrt(q_btkqe.shape[-1])
    f32 = accum_dtype(q_btkqe.dtype)
    s_new = jnp.einsum("btkqe,buke->bkqtu", q_btkqe, k_new_bske, preferred_element_type=f32)
    s_new = jnp.where(self_mask_btu[:, None, None], s_new * scale, NEG_INF)
    if cache_k is None:
        p = jax.nn.softmax(s_new, axis=-1).astype(v_new_bske.dtype)
        return jnp.einsum("bkqtu,buke->btkqe", p, v_new_bske)
    s_cache = jnp.einsum("btkqe,bske->bkqts", q_btkqe, cache_k, preferred_element_type=f32)
    visible = jnp.arange(cache_k.shape[1])[None, :] < cache_len_b[:, None]  # [B, S]
    s_cache = jnp.where(visible[:, None, None, None, :], s_cache * scale, NEG_INF)
    p = jax.nn.softmax(jnp.concatenate([s_cache, s_new], axis=-1), axis=-1)
    p = p.astype(v_new_bske.dtype)
    n_cache = cache_k.shape[1]
    out = jnp.einsum("bkqts,bske->btkqe", p[..., :n_cache], cache_v)
    return out + jnp.einsum("bkqtu,buke->btkqe", p[..., n_cache:], v_new_bske)


def forward(
    params: Params,
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
    K/V, each [L, B, T, K, E] (keys after RoPE), for the caller to commit as it chooses.
    """
    dtype = params["embed"].dtype
    B, T = tokens_bt.shape
    K, Q, E = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    x_btd = params["embed"][tokens_bt]
    cos, sin = rope_cos_sin(positions_bt, cfg.rope_inv_freq(), dtype)
    cache_len = None if cache is None else cache.lengths

    def layer(x_btd, xs):
        lp, ck, cv = xs
        with jax.named_scope("attention"):
            h = rms_norm(x_btd, lp["attn_norm"], cfg.rms_norm_eps)
            q = apply_rope(jnp.einsum("btd,dhe->bthe", h, lp["wq"]), cos, sin)
            k = apply_rope(jnp.einsum("btd,dke->btke", h, lp["wk"]), cos, sin)
            v = jnp.einsum("btd,dke->btke", h, lp["wv"])
            o = attention(q.reshape(B, T, K, Q, E), k, v, self_mask_btu, ck, cv, cache_len)
            x_btd = x_btd + jnp.einsum("bthe,hed->btd", o.reshape(B, T, K * Q, E), lp["wo"])
        with jax.named_scope("mlp"):
            h = rms_norm(x_btd, lp["mlp_norm"], cfg.rms_norm_eps)
            gate = jax.nn.silu(jnp.einsum("btd,df->btf", h, lp["w_gate"]))
            up = jnp.einsum("btd,df->btf", h, lp["w_up"])
            x_btd = x_btd + jnp.einsum("btf,fd->btd", gate * up, lp["w_down"])
        return x_btd, (k, v)

    caches = (None, None) if cache is None else (cache.k, cache.v)
    x_btd, (new_k, new_v) = jax.lax.scan(layer, x_btd, (params["layers"], *caches))

    if logits_rows_br is not None:
        x_btd = jnp.take_along_axis(x_btd, logits_rows_br[:, :, None], axis=1)  # [B, R, D]
    h = rms_norm(x_btd, params["final_norm"], cfg.rms_norm_eps)
    acc = accum_dtype(dtype)
    if cfg.tie_word_embeddings:
        logits = jnp.einsum("brd,vd->brv", h, params["embed"], preferred_element_type=acc)
    else:
        logits = jnp.einsum("brd,dv->brv", h, params["lm_head"], preferred_element_type=acc)
    return logits, new_k, new_v


def causal_mask(t: int) -> jax.Array:
    """[1, T, T] lower-triangular mask for a plain causal pass."""
    return jnp.tril(jnp.ones((t, t), dtype=bool))[None]
