"""Hugging Face tensor names (Llama, Mistral, Qwen2, Qwen3) -> this project's params, with a
shape check per tensor.

Hugging Face stores linear weights as [out, in]; the params keep [in, out] with
the head axes split out (see lookahead_jax.models.llama_params.param_specs; flat names as in
model.flat_names). Both converters
(hf.py, gguf.py) produce Hugging Face named, Hugging Face shaped numpy arrays
and hand them to `to_params` one by one, so each tensor is checked and reshaped
in exactly one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np

from lookahead_jax.errors import UserInputError
from lookahead_jax.models.config import LlamaConfig
from lookahead_jax.models.llama_params import flat_names, param_specs

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# HF per-layer suffix -> (param name, transform from the HF [out, in] matrix)
_LAYER_KEYS: dict[str, tuple[str, Callable[[np.ndarray, LlamaConfig], np.ndarray]]] = {
    "input_layernorm.weight": ("attn_norm", lambda w, c: w),
    "post_attention_layernorm.weight": ("mlp_norm", lambda w, c: w),
    "self_attn.q_proj.weight": (
        "wq",
        lambda w, c: w.T.reshape(c.hidden_size, c.num_heads, c.head_dim),
    ),
    "self_attn.k_proj.weight": (
        "wk",
        lambda w, c: w.T.reshape(c.hidden_size, c.num_kv_heads, c.head_dim),
    ),
    "self_attn.v_proj.weight": (
        "wv",
        lambda w, c: w.T.reshape(c.hidden_size, c.num_kv_heads, c.head_dim),
    ),
    "self_attn.o_proj.weight": (
        "wo",
        lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
    ),
    "mlp.gate_proj.weight": ("w_gate", lambda w, c: w.T),
    "mlp.up_proj.weight": ("w_up", lambda w, c: w.T),
    "mlp.down_proj.weight": ("w_down", lambda w, c: w.T),
    # only in configs that have them (LlamaConfig.qkv_bias, o_bias, qk_norm, mlp_bias)
    "self_attn.q_proj.bias": ("bq", lambda b, c: b.reshape(c.num_heads, c.head_dim)),
    "self_attn.k_proj.bias": ("bk", lambda b, c: b.reshape(c.num_kv_heads, c.head_dim)),
    "self_attn.v_proj.bias": ("bv", lambda b, c: b.reshape(c.num_kv_heads, c.head_dim)),
    "self_attn.o_proj.bias": ("bo", lambda b, c: b),
    "self_attn.q_norm.weight": ("q_norm", lambda w, c: w),
    "self_attn.k_norm.weight": ("k_norm", lambda w, c: w),
    "mlp.gate_proj.bias": ("b_gate", lambda b, c: b),
    "mlp.up_proj.bias": ("b_up", lambda b, c: b),
    "mlp.down_proj.bias": ("b_down", lambda b, c: b),
}

# Tensors a Llama checkpoint may carry that the forward does not use.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.rotary_emb\.)")


def _layer_suffixes(cfg: LlamaConfig) -> list[str]:
    """The per-layer HF tensor suffixes this config's params hold."""
    params = flat_names(param_specs(cfg))
    return [suffix for suffix, (name, _) in _LAYER_KEYS.items() if f"layers/{name}" in params]


def expected_hf_names(cfg: LlamaConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    suffixes = _layer_suffixes(cfg)
    for i in range(cfg.num_layers):
        names += [f"model.layers.{i}.{suffix}" for suffix in suffixes]
    return names


def to_params(
    cfg: LlamaConfig, tensors: Iterable[tuple[str, np.ndarray]], dtype, progress=None
) -> dict[str, np.ndarray]:
    """Consume (hf_name, array) pairs; return flat params {'layers/wq': [L, ...], ...}.

    Raises UserInputError naming the tensor on a wrong shape, an unknown name or
    a missing tensor.
    """
    specs = flat_names(param_specs(cfg))
    flat: dict[str, np.ndarray] = {}
    stacked = {
        path: np.empty(spec.shape, dtype)
        for path, spec in specs.items()
        if path.startswith("layers/")
    }
    seen: set[str] = set()
    arch = cfg.architecture
    for name, array in tensors:
        if progress is not None:
            progress.update(1)
        if _IGNORED.search(name):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: some exports still write the (identical) head
        seen.add(name)
        m = _LAYER.match(name)
        if m:
            layer, suffix = int(m.group(1)), m.group(2)
            if suffix not in _LAYER_KEYS or layer >= cfg.num_layers:
                raise UserInputError(
                    f"unexpected tensor {name!r} in a {cfg.architecture} checkpoint"
                )
            param, transform = _LAYER_KEYS[suffix]
            if f"layers/{param}" not in specs:
                raise UserInputError(
                    f"unexpected tensor {name!r}: the config ({cfg.architecture}) has no {param}"
                )
            spec = specs[f"layers/{param}"]
            value = transform(_check(name, array, _hf_shape(spec.shape[1:], param)), cfg)
            stacked[f"layers/{param}"][layer] = value
        elif name == "model.embed_tokens.weight":
            flat["embed"] = _check(name, array, specs["embed"].shape).astype(dtype)
        elif name == "model.norm.weight":
            flat["final_norm"] = _check(name, array, specs["final_norm"].shape).astype(dtype)
        elif name == "lm_head.weight":
            v, d = cfg.vocab_size, cfg.hidden_size
            flat["lm_head"] = _check(name, array, (v, d)).T.astype(dtype)
        else:
            raise UserInputError(f"unexpected tensor {name!r} in a {arch} checkpoint")
    missing = [n for n in expected_hf_names(cfg) if n not in seen]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise UserInputError(f"checkpoint is missing {len(missing)} tensor(s): {shown}")
    flat.update(stacked)
    return flat


def _hf_shape(param_shape: tuple[int, ...], param: str) -> tuple[int, ...]:
    """The HF [out, in] shape of one layer's tensor, from the param's shape."""
    if param in ("attn_norm", "mlp_norm", "q_norm", "k_norm", "bo", "b_gate", "b_up", "b_down"):
        return param_shape
    if param in ("bq", "bk", "bv"):  # [heads, Dh] <- [heads*Dh]
        h, e = param_shape
        return (h * e,)
    if param in ("wq", "wk", "wv"):  # [D, heads, Dh] <- [heads*Dh, D]
        d, h, e = param_shape
        return (h * e, d)
    if param == "wo":  # [H, Dh, D] <- [D, H*Dh]
        h, e, d = param_shape
        return (d, h * e)
    a, b = param_shape  # w_gate/w_up [D, F] <- [F, D]; w_down [F, D] <- [D, F]
    return (b, a)


def _check(name: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if tuple(array.shape) != tuple(shape):
        raise UserInputError(
            f"tensor {name!r} has shape {tuple(array.shape)}, expected {tuple(shape)} "
            "from config.json"
        )
    return array
