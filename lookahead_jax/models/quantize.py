"""Weight-only int8: every matrix of the model stored as int8 with one float scale per
output channel, activations and accumulation in the model's float dtype.

    w[..., i, o] ≈ q[..., i, o] * scale[..., o]      (i: the contraction axes, o: the rest)
    x @ w ≈ (x @ q) * scale                           (the scale leaves the sum)

so a matmul reads the int8 bytes, converts them inside the jitted program and scales its
output: a decode step streams a quarter of float32's weight bytes. Scales are symmetric
(max |w| over the contraction axes / 127), so an all-zero channel is exact and every other
weight is within half a step (max |w| / 254) of its float value.

Which axes a matrix contracts is declared once, in `CONTRACTED`, by the logical axis
names of llama_params.param_specs: a `[L, D, H, Dh]` wq contracts `embed` and its scale is
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
import math

import jax
import jax.numpy as jnp

from lookahead_jax.errors import UserInputError

WEIGHTS = ("float", "int8", "q8_0")  # the choices of load(weights=...) and --weights
BLOCKS = {"int8": 0, "q8_0": 32}  # values per scale along the contraction (0: all of it)

# The logical axes each quantized matrix contracts over (llama_params.param_specs' axis names).
# They are adjacent in every weight; in llama.cpp's [out, in] layout they are its `in`.
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
    """A weight-only int8 matrix: `q` int8 in the weight's own shape and `scale` float.

    block == 0 (--weights int8): one scale per output channel, `scale` is q's shape
    without the contraction axes.
    block == B (--weights q8_0, B = 32): one scale per B consecutive values of the
    contraction axes flattened in order (llama.cpp's Q8_0 blocks along a row's inputs):
    `scale` is q's shape with the contraction axes replaced by one axis of size
    (their product) / B. `contracted` names the contraction axes by negative position
    (the same in a stacked [L, ...] weight and in one layer's slice of it)."""

    q: jax.Array
    scale: jax.Array
    contracted: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    block: int = dataclasses.field(default=0, metadata=dict(static=True))

    @property
    def dtype(self):
        """The compute dtype (the scales'): what the float weight's dtype was."""
        return self.scale.dtype

    @property
    def shape(self):
        return self.q.shape

    def blocked_shape(self) -> tuple[int, ...]:
        """q's shape with the contraction axes as [n blocks, block] (block mode)."""
        return _blocked_shape(self.q.shape, self.contracted, self.block)

    def scale_axis(self, axis: int) -> int:
        """Where q's output axis `axis` (>= 0) sits in `scale`."""
        first, last = _span(self.contracted, self.q.ndim)
        assert not first <= axis <= last, "an output axis"
        return axis if axis < first else axis - self.q.ndim + self.scale.ndim


def _blocked_shape(shape, contracted: tuple[int, ...], block: int) -> tuple[int, ...]:
    first, last = _span(contracted, len(shape))
    k = math.prod(shape[first : last + 1])
    return shape[:first] + (k // block, block) + shape[last + 1 :]


def _span(contracted: tuple[int, ...], ndim: int) -> tuple[int, int]:
    """(first, last) non-negative position of the contraction axes."""
    return min(contracted) + ndim, max(contracted) + ndim


# On CPU a large int8 matrix is converted in chunks of about this many bytes (in the
# compute dtype); smaller ones (every layer matrix of SmolLM2) in one piece.
CHUNK_BYTES = 4 << 20


def einsum(spec: str, x, w, **kwargs):
    """jnp.einsum(spec, x, w) for a float or Int8Weight `w`. With per-channel int8, the
    einsum's output must end with w's output axes in w's order (true of every matmul in
    llama.forward): the scale then broadcasts onto it. Block scales multiply the int8
    values before the einsum (a block's scale varies along the sum).

    On CPU a large int8 matrix is converted and multiplied a chunk of its largest output
    axis at a time (a loop in the program): XLA:CPU converts SmolLM2's whole 28M-value
    embedding for the LM head in 43 ms, and in 3.5 MB pieces in 2.5 (measured; float32
    takes 4.5). GPUs and TPUs convert at memory speed and get the plain einsum.
    """
    if not isinstance(w, Int8Weight):
        return jnp.einsum(spec, x, w, **kwargs)
    n, axis = _chunking(spec, w, x.dtype) if jax.default_backend() == "cpu" else (1, 0)
    if n == 1:
        y = jnp.einsum(spec, x, _matrix(w, x.dtype), **kwargs)
    else:
        y = _chunked_einsum(spec, x, w, axis, n, kwargs)
    return y if w.block else y * w.scale


def _matrix(w: Int8Weight, dtype) -> jax.Array:
    """The float matrix the einsum takes: q converted, times its block scales (block
    mode; per-channel scales are left for the einsum's output)."""
    if not w.block:
        return w.q.astype(dtype)
    first, _ = _span(w.contracted, w.q.ndim)
    blocks = w.q.reshape(w.blocked_shape()).astype(dtype)
    return (blocks * jnp.expand_dims(w.scale.astype(dtype), first + 1)).reshape(w.q.shape)


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


def _chunked_einsum(spec: str, x, w: Int8Weight, axis: int, n: int, kwargs):
    """The einsum over n contiguous chunks of w's output axis `axis`, one after another,
    the outputs put back in order: chunk j covers indices j * c .. (j + 1) * c - 1,
    c = size / n (block scales are cut with their values; per-channel ones are applied
    by the caller)."""
    operands, out_letters = spec.split("->")
    letter = operands.split(",")[1][axis]
    c = w.q.shape[axis] // n

    def one(j):
        q = jax.lax.dynamic_slice_in_dim(w.q, j * c, c, axis)
        scale = w.scale
        if w.block:
            scale = jax.lax.dynamic_slice_in_dim(scale, j * c, c, w.scale_axis(axis))
        chunk = dataclasses.replace(w, q=q, scale=scale)
        return jnp.einsum(spec, x, _matrix(chunk, x.dtype), **kwargs)

    ys = jax.lax.map(one, jnp.arange(n))  # [n, ...output with c at `letter`...]
    pos = out_letters.index(letter)
    ys = jnp.moveaxis(ys, 0, pos)  # [..., n, c, ...]
    return ys.reshape(ys.shape[:pos] + (n * c,) + ys.shape[pos + 2 :])


def merge_leading(w, n: int):
    """w with its first n axes merged into one: a float array, or an Int8Weight whose
    contraction axes they are (its scales stay as they are: per-channel scales lack those
    axes, block scales already run along them flattened). A matmul that contracts one
    axis reads its weight in place, where XLA:CPU copies and transposes a weight whose
    several contraction axes it must merge itself (wo's [H, Dh, D])."""
    if not isinstance(w, Int8Weight):
        return w.reshape(-1, *w.shape[n:])
    assert w.contracted == tuple(range(-w.q.ndim, -w.q.ndim + n)), "the contraction axes"
    q = w.q.reshape(-1, *w.q.shape[n:])
    return dataclasses.replace(w, q=q, contracted=(-q.ndim,))


def take_rows(w, ids):
    """w[ids] (an embedding lookup) for a float or Int8Weight `w` of rows [V, D]."""
    if not isinstance(w, Int8Weight):
        return w[ids]
    rows = dataclasses.replace(w, q=w.q[ids], scale=w.scale[ids])
    return _matrix(rows, w.dtype) if w.block else rows.q.astype(w.dtype) * rows.scale[..., None]


def quantize(w: jax.Array, contracted: tuple[int, ...], block: int = 0) -> Int8Weight:
    """Symmetric int8 of a float array over its `contracted` dims (adjacent): one scale
    per output channel (block 0) or per `block` consecutive contracted values, each
    max |value| / 127. A block that is already int8 times a scale (a Q8_0 GGUF's, read
    back exactly) comes back as those very int8 values and scale."""
    neg = tuple(sorted(d - w.ndim if d >= 0 else d for d in contracted))
    if not block:
        amax = jnp.max(jnp.abs(w), axis=contracted)
        scale = jnp.where(amax > 0, amax / 127, 1).astype(w.dtype)
        expanded = jnp.expand_dims(scale, contracted)
        q = jnp.clip(jnp.round(w / expanded), -127, 127).astype(jnp.int8)
        return Int8Weight(q=q, scale=scale, contracted=neg)
    first, _ = _span(neg, w.ndim)
    blocks = w.reshape(_blocked_shape(w.shape, neg, block))
    amax = jnp.max(jnp.abs(blocks), axis=first + 1)
    scale = jnp.where(amax > 0, amax / 127, 1).astype(w.dtype)
    q = jnp.round(blocks / jnp.expand_dims(scale, first + 1))
    q = jnp.clip(q, -127, 127).astype(jnp.int8).reshape(w.shape)
    return Int8Weight(q=q, scale=scale, contracted=neg, block=block)


def dequantize(w: Int8Weight) -> jax.Array:
    """The float array that `w` stands for (tests, comparisons)."""
    if w.block:
        return _matrix(w, w.dtype)
    return w.q.astype(w.dtype) * jnp.expand_dims(w.scale, w.contracted)


def contracted_dims(name: str, axes: tuple[str, ...]) -> tuple[int, ...]:
    """Positions of CONTRACTED[name] in a weight with these logical axes."""
    return tuple(i for i, a in enumerate(axes) if a in CONTRACTED[name])


def int8_specs(name: str, spec, weights: str = "int8"):
    """The Int8Weight of ParamSpecs for a float weight's ParamSpec (llama_params.ParamSpec):
    the scales carry the logical axes of what they scale, so they shard by the same rules
    (block mode: the merged contraction axes are named as the first of them)."""
    dims = contracted_dims(name, spec.axes)
    neg = tuple(d - len(spec.axes) for d in dims)
    block = BLOCKS[weights]
    if not block:
        keep = [i for i in range(len(spec.axes)) if i not in dims]
        shape, axes = tuple(spec.shape[i] for i in keep), tuple(spec.axes[i] for i in keep)
    else:
        first, last = dims[0], dims[-1]
        k = math.prod(spec.shape[first : last + 1])
        if k % block:
            inputs = " x ".join(spec.axes[first : last + 1])
            raise UserInputError(
                f"--weights {weights} cuts every matrix's inputs into blocks of {block}, but "
                f"{name}'s {inputs} is {k}; --weights int8 takes any shape"
            )
        shape = spec.shape[:first] + (k // block,) + spec.shape[last + 1 :]
        axes = spec.axes[: first + 1] + spec.axes[last + 1 :]
    scale = type(spec)(shape, axes)
    return Int8Weight(q=spec, scale=scale, contracted=neg, block=block)


def check_weights(weights: str) -> str:
    if weights not in WEIGHTS:
        raise UserInputError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    return weights
