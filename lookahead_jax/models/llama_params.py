"""The Llama family's weights: one declaration of every weight (`param_specs`: its shape
and logical axis names) in a registered dataclass pytree (`LlamaParams`, its per-layer
weights in `LayerParams`), and everything derived from it: random init, the flat names
of the on-disk checkpoint (`flat_names` / `from_flat`), the two forms of the same
params, and their int8 quantization.

Two forms: *stacked*, every layer's weights on a leading L axis (one `LayerParams` of
[L, ...] arrays: the checkpoint's form, what `param_specs`, `flat_names` and the
converters speak), and *per layer* (a tuple of L `LayerParams` of one layer's arrays:
what `lj.load` returns and decoding reads; `split_layers` / `stack_layers`). Why the
forward reads per-layer weights: llama.py.

Shape letters: docs/architecture.md
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.models import packed, quantize
from lookahead_jax.models.config import LlamaConfig


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One weight: its shape and a logical axis name per dimension (a pytree leaf)."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerParams:
    """The layers' weights: stacked, every layer's on a leading L axis (the shapes below),
    or one layer's (the same shapes without L)."""

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
    layers: LayerParams | tuple[LayerParams, ...]  # stacked, or one per layer
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
    'layers/wq/scale' unless `is_leaf` stops at the Int8Weight. Per-layer params (of
    arrays) are stacked first (stack_layers), as the checkpoint holds them."""
    if isinstance(tree, LlamaParams):
        if packed.is_packed(tree):
            raise ValueError(
                "packed params (the CPU kernel's layout, models/packed.py) have no checkpoint "
                "names: lj.load(..., cpu_kernel=False) gives the weights as stored"
            )
        if not isinstance(tree.layers, LayerParams) and any(
            not isinstance(lp, LayerParams) for lp in tree.layers
        ):  # models/fused.py's FusedLayer (not imported: it imports this module)
            raise ValueError(
                "fused params (q/k/v and gate/up as one matrix each, models/fused.py) have "
                "no checkpoint names: lj.load(..., fuse=False) gives the weights as stored"
            )
        tree = stack_layers(tree)
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
    """Random weights (normal, std `scale`; norms around 1), per layer — for tests and
    timing."""
    named = flat_names(param_specs(cfg))
    subkeys = jax.random.split(key, len(named))
    flat = {}
    for (name, spec), k in zip(named.items(), subkeys, strict=True):
        noise = jax.random.normal(k, spec.shape)
        flat[name] = (1.0 + 0.1 * noise if name.endswith("norm") else scale * noise).astype(dtype)
    return split_layers(from_flat(cfg, flat))


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def split_layers(params: LlamaParams) -> LlamaParams:
    """Stacked params (arrays, or ParamSpecs) -> the same with one LayerParams per layer,
    each leaf without its leading L axis. Per-layer params are returned as they are."""
    if not isinstance(params.layers, LayerParams):
        return params
    first = jax.tree.leaves(params.layers, is_leaf=_is_spec)[0]
    n = first.shape[0]
    host = jax.tree.map(_host_view, params.layers, is_leaf=_is_spec)

    def layer(i):
        def cut(x, h):
            if _is_spec(x):
                return ParamSpec(x.shape[1:], x.axes[1:])
            return x[i] if h is None else jax.device_put(h[i], x.sharding)

        return jax.tree.map(cut, params.layers, host, is_leaf=_is_spec)

    return dataclasses.replace(params, layers=tuple(layer(i) for i in range(n)))


def _host_view(x):
    """x as a numpy array sharing its memory, where x lives whole on one CPU device (else
    None): cut there, a layer is a view, put back without a compile. (Indexing the
    jax array runs a program per weight shape: SmolLM2-135M's 270 cuts took 0.70 s in
    a fresh process, 0.21 s in a warm one, against 0.02 s as views; 2-core Intel Xeon.)"""
    if (
        not isinstance(x, jax.Array)
        or isinstance(x, jax.core.Tracer)
        or not isinstance(x.sharding, jax.sharding.SingleDeviceSharding)  # (not a mesh's)
        or next(iter(x.devices())).platform != "cpu"
    ):
        return None
    return np.asarray(x)


def stack_layers(params: LlamaParams) -> LlamaParams:
    """Per-layer params -> stacked (the checkpoint's form). Stacked params are returned
    as they are."""
    if isinstance(params.layers, LayerParams):
        return params
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params.layers)
    return dataclasses.replace(params, layers=stacked)


def per_layer(layers) -> tuple[LayerParams, ...]:
    """One LayerParams per layer: `layers` as they are when per layer already, else cut out
    of the stacked arrays (inside a jitted program every cut is a copy: decoding keeps its
    params per layer; stacked params, e.g. in tests, still give the same results)."""
    if isinstance(layers, LayerParams):
        n = jax.tree.leaves(layers)[0].shape[0]
        return tuple(jax.tree.map(lambda a, i=i: a[i], layers) for i in range(n))
    return tuple(layers)


def quantize_params(params, cfg, shardings=None, weights: str = "int8"):
    """Float stacked LlamaParams -> the same params with every matrix of CONTRACTED an
    Int8Weight of `weights` ("int8" or "q8_0"), each placed by `shardings` (the quantized
    stacked params' shardings) when given. One jitted quantization per matrix, so the float
    originals can go one by one."""
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
