"""Fused layers: each layer's Q, K and V matrices as one, and its gate and up as one, so
that a step runs one matmul where it ran three and one where it ran two (fewer, larger
kernels: what a GPU step at small batch is short of, issue 49). The same products:
the fused matrix is the three concatenated along their output axes, and the forward
(llama.py `_qkv`, `_gate_up`) splits the result back.

    wqkv       [D, H + 2K, Dh]   Q's H heads, then K's K heads, then V's K heads
    w_gate_up  [D, 2F]           gate's F columns, then up's F
    bqkv       [H + 2K, Dh], b_gate_up [2F]: the biases likewise, where there are any

Worked example (SmolLM2-135M: D 576, H 9, K 3, Dh 64, F 1536): wq [576, 9, 64], wk and
wv [576, 3, 64] make wqkv [576, 15, 64]; a step's qkv [B, T, 15, 64] gives q = heads
0..8, k = 9..11, v = 12..14. w_gate and w_up [576, 1536] make w_gate_up [576, 3072].

int8 weights (quantize.Int8Weight) fuse the same way: their values along the same axes,
and their scales too (per output channel, or per block of inputs: either way the output
axes are the scales' last ones). Checkpoints keep the unfused form: `lj.load` fuses at
load, on GPUs and TPUs with one device, and where the CPU kernel runs its panels
(packed.pack_group, through `fuse_layer`); on a mesh, the heads are sharded over `model`
and a fused matrix would mix shards: FusedLayer declares no ParamSpec, so no sharding
rule. Fused params have no checkpoint names
(llama_params.flat_names refuses them): training loads with fuse=False.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lookahead_jax.models.llama_params import LayerParams, LlamaParams, per_layer
from lookahead_jax.models.quantize import Int8Weight


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FusedLayer:
    """One layer's weights with Q/K/V and gate/up fused (module docstring)."""

    attn_norm: jax.Array  # [D]
    wqkv: jax.Array  # [D, H + 2K, Dh]
    wo: jax.Array  # [H, Dh, D]
    mlp_norm: jax.Array  # [D]
    w_gate_up: jax.Array  # [D, 2F]
    w_down: jax.Array  # [F, D]
    bqkv: jax.Array | None = None  # [H + 2K, Dh]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [Dh]
    k_norm: jax.Array | None = None  # [Dh]
    b_gate_up: jax.Array | None = None  # [2F]
    b_down: jax.Array | None = None  # [D]


def fuse_layers(params: LlamaParams, free: bool = False) -> LlamaParams:
    """The params with every layer a FusedLayer (already fused ones kept). `free`: delete
    each layer's unfused matrices once its fused ones are made (lj.load owns them), so
    that the fused copy costs one layer's memory, not the model's."""
    layers = []
    for lp in per_layer(params.layers):
        if isinstance(lp, FusedLayer):
            layers.append(lp)
            continue
        fused = fuse_layer(lp, _concat((lp.wq, lp.wk, lp.wv), axis=-2))
        if free:
            for w in (lp.wq, lp.wk, lp.wv, lp.w_gate, lp.w_up):
                for x in (w.q, w.scale) if isinstance(w, Int8Weight) else (w,):
                    x.delete()
        layers.append(fused)
    return dataclasses.replace(params, layers=tuple(layers))


def fuse_layer(lp: LayerParams, wqkv, w_gate_up=None) -> FusedLayer:
    """`lp` as a FusedLayer with these fused matrices (w_gate_up None: lp's gate and up
    concatenated), its biases fused likewise and its other fields as they are."""
    return FusedLayer(
        attn_norm=lp.attn_norm,
        wqkv=wqkv,
        wo=lp.wo,
        mlp_norm=lp.mlp_norm,
        w_gate_up=_concat((lp.w_gate, lp.w_up), axis=-1) if w_gate_up is None else w_gate_up,
        w_down=lp.w_down,
        bqkv=None if lp.bq is None else _concat((lp.bq, lp.bk, lp.bv), axis=-2),
        bo=lp.bo,
        q_norm=lp.q_norm,
        k_norm=lp.k_norm,
        b_gate_up=None if lp.b_gate is None else _concat((lp.b_gate, lp.b_up), axis=-1),
        b_down=lp.b_down,
    )


def is_fused(layer: LayerParams | FusedLayer) -> bool:
    return isinstance(layer, FusedLayer)


def has_fused(params) -> bool:
    """Whether a model's params (LlamaParams, or another seam's) hold fused layers."""
    layers = getattr(params, "layers", ())
    return isinstance(layers, tuple) and any(map(is_fused, layers))


def fuse_where_it_pays(platform: str, mesh) -> bool:
    """lj.load's default: fused on GPUs and TPUs with one device (module docstring)."""
    return platform in ("gpu", "tpu") and mesh is None


def _concat(ws, axis: int):
    """Weights (arrays, or Int8Weights of one form) concatenated along output `axis`."""
    if isinstance(ws[0], Int8Weight):
        return Int8Weight(
            _concat([w.q for w in ws], axis),
            _concat([w.scale for w in ws], axis),
            ws[0].contracted,
            ws[0].block,
        )
    return jnp.concatenate(ws, axis=axis)  # eager: one small program per shape, shared by layers
