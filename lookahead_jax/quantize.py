"""Weight-only int8: every matrix of the model stored as int8 with one float scale per
output channel, activations and accumulation in the model's float dtype.

    w[..., i, o] ≈ q[..., i, o] * scale[..., o]      (i: the contraction axes, o: the rest)
    x @ w ≈ (x @ q) * scale                           (the scale leaves the sum)

so a matmul reads the int8 bytes, converts them inside the jitted program and scales its
output: a decode step streams a quarter of float32's weight bytes. Scales are symmetric
(max |w| over the contraction axes / 127), so an all-zero channel is exact and every other
weight is within half a step (max |w| / 254) of its float value.

Which axes a matrix contracts is declared once, in `CONTRACTED`, by the logical axis
names of model.param_specs: a `[L, D, H, Dh]` wq contracts `embed` and its scale is
`[L, H, Dh]`; the tied embedding `[V, D]` contracts `embed` too, so its per-row scale
serves both the token lookup and the LM head. Norms, biases and the KV cache stay float.
A quantized weight is an `Int8Weight` pytree (leaves `q` and `scale`), whose ParamSpecs
(`int8_specs`) give the scales their sharding by the same rules as the weights.

Worked example (one output channel, contraction over 4 inputs):

    w = [0.50, -1.27, 0.02, 0.00]   max |w| = 1.27 -> scale = 0.01
    q = [50, -127, 2, 0]            q * scale = [0.50, -1.27, 0.02, 0.00]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

WEIGHTS = ("float", "int8")  # the choices of load(weights=...) and --weights

# The logical axes each quantized matrix contracts over (model.param_specs' axis names).
CONTRACTED: dict[str, tuple[str, ...]] = {
    "embed": ("embed",),  # [V, D]: lookup rows and tied LM head rows
    "lm_head": ("embed",),  # [D, V]
    "layers/wq": ("embed",),  # [L, D, H, Dh]
    "layers/wk": ("embed",),
    "layers/wv": ("embed",),
    "layers/wo": ("heads", "head_dim"),  # [L, H, Dh, D]
    "layers/w_gate": ("embed",),  # [L, D, F]
    "layers/w_up": ("embed",),
    "layers/w_down": ("mlp",),  # [L, F, D]
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Weight:
    """A weight-only int8 matrix: `q` int8 in the weight's own shape, `scale` float in its
    shape without the contraction axes (one per output channel)."""

    q: jax.Array
    scale: jax.Array

    @property
    def dtype(self):
        """The compute dtype (the scales'): what the float weight's dtype was."""
        return self.scale.dtype

    @property
    def shape(self):
        return self.q.shape


# On CPU a large int8 matrix is converted in chunks of about this many bytes (in the
# compute dtype); smaller ones (every layer matrix of SmolLM2) in one piece.
CHUNK_BYTES = 4 << 20


def einsum(spec: str, x, w, **kwargs):
    """jnp.einsum(spec, x, w) for a float or Int8Weight `w`. With int8, the einsum's output
    must end with w's output axes in w's order (true of every matmul in model.forward):
    the scale then broadcasts onto it.

    On CPU a large int8 matrix is converted and multiplied a chunk of its largest output
    axis at a time (a loop in the program): XLA:CPU converts SmolLM2's whole 28M-value
    embedding for the LM head in 43 ms, and in 3.5 MB pieces in 2.5 (measured; float32
    takes 4.5). GPUs and TPUs convert at memory speed and get the plain einsum.
    """
    if not isinstance(w, Int8Weight):
        return jnp.einsum(spec, x, w, **kwargs)
    n, axis = _chunking(spec, w, x.dtype) if jax.default_backend() == "cpu" else (1, 0)
    if n == 1:
        return jnp.einsum(spec, x, w.q.astype(x.dtype), **kwargs) * w.scale
    return _chunked_einsum(spec, x, w.q, axis, n, kwargs) * w.scale


def _chunking(spec: str, w: Int8Weight, dtype) -> tuple[int, int]:
    """(number of chunks, weight axis to chunk): the weight's largest output axis (one
    whose letter the einsum keeps), split into a power of two of chunks that divides it
    and brings a chunk to at most about CHUNK_BYTES."""
    operands, out_letters = spec.split("->")
    w_letters = operands.split(",")[1]
    outputs = [i for i, c in enumerate(w_letters) if c in out_letters]
    axis = max(outputs, key=lambda i: w.q.shape[i])
    size = w.q.shape[axis]
    want = w.q.size * jnp.dtype(dtype).itemsize / CHUNK_BYTES
    n = 1
    while n < want and size % (2 * n) == 0:
        n *= 2
    return n, axis


def _chunked_einsum(spec: str, x, q, axis: int, n: int, kwargs):
    """The einsum over n contiguous chunks of q's `axis`, one after another, the outputs
    put back in order: chunk j covers indices j * c .. (j + 1) * c - 1, c = size / n."""
    operands, out_letters = spec.split("->")
    letter = operands.split(",")[1][axis]
    c = q.shape[axis] // n

    def one(j):
        q_chunk = jax.lax.dynamic_slice_in_dim(q, j * c, c, axis)
        return jnp.einsum(spec, x, q_chunk.astype(x.dtype), **kwargs)

    ys = jax.lax.map(one, jnp.arange(n))  # [n, ...output with c at `letter`...]
    pos = out_letters.index(letter)
    ys = jnp.moveaxis(ys, 0, pos)  # [..., n, c, ...]
    return ys.reshape(ys.shape[:pos] + (n * c,) + ys.shape[pos + 2 :])


def take_rows(w, ids):
    """w[ids] (an embedding lookup) for a float or Int8Weight `w` of rows [V, D]."""
    if isinstance(w, Int8Weight):
        return w.q[ids].astype(w.scale.dtype) * w.scale[ids][..., None]
    return w[ids]


def quantize(w: jax.Array, contracted: tuple[int, ...]) -> Int8Weight:
    """Symmetric per-output-channel int8 of a float array, over the `contracted` dims."""
    amax = jnp.max(jnp.abs(w), axis=contracted)
    scale = jnp.where(amax > 0, amax / 127, 1).astype(w.dtype)
    expanded = jnp.expand_dims(scale, contracted)
    q = jnp.clip(jnp.round(w / expanded), -127, 127).astype(jnp.int8)
    return Int8Weight(q=q, scale=scale)


def dequantize(w: Int8Weight, contracted: tuple[int, ...]) -> jax.Array:
    """The float array that `w` stands for (tests, comparisons)."""
    return w.q.astype(w.scale.dtype) * jnp.expand_dims(w.scale, contracted)


def contracted_dims(name: str, axes: tuple[str, ...]) -> tuple[int, ...]:
    """Positions of CONTRACTED[name] in a weight with these logical axes."""
    return tuple(i for i, a in enumerate(axes) if a in CONTRACTED[name])


def int8_specs(name: str, spec):
    """The Int8Weight of ParamSpecs for a float weight's ParamSpec (model.ParamSpec)."""
    keep = [i for i in range(len(spec.axes)) if i not in contracted_dims(name, spec.axes)]
    scale = type(spec)(tuple(spec.shape[i] for i in keep), tuple(spec.axes[i] for i in keep))
    return Int8Weight(q=spec, scale=scale)


def check_weights(weights: str) -> str:
    from lookahead_jax.errors import UserInputError

    if weights not in WEIGHTS:
        raise UserInputError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    return weights


def quantize_params(params, cfg, shardings=None):
    """Float LlamaParams -> the same params with every matrix of CONTRACTED an Int8Weight,
    each placed by `shardings` (the int8 params' shardings, LlamaLM.param_shardings) when
    given. One jitted quantization per matrix, so the float originals can go one by one."""
    from lookahead_jax.model import flat_names, from_flat, param_specs

    specs = flat_names(param_specs(cfg))
    flat = flat_names(params)
    where = {} if shardings is None else flat_names(shardings, is_leaf=_is_int8)
    for name in CONTRACTED:
        if name not in flat:
            continue
        run = jax.jit(quantize, static_argnums=1, out_shardings=where.get(name))
        flat[name] = run(flat[name], contracted_dims(name, specs[name].axes))
    return from_flat(cfg, flat)


def _is_int8(x) -> bool:
    return isinstance(x, Int8Weight)
