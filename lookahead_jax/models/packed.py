"""Weights packed in panels for the CPU's small-M kernel (cpu_kernel/), and the matmul
entry points the forward calls for any weight: float, Int8Weight or PackedWeight.

A matrix the forward multiplies by — a weight whose `contracted` axes (quantize.CONTRACTED)
are summed over, the rest kept — is, as a plain matrix, W[K, N]: the contracted axes
moved first and merged into K, the kept ones merged into N in order. Packed, it is
`panels[P, K, 16]` with N = 16 P and

    W[k, 16 p + j] = panels[p, k, j]

so each panel of 16 output columns is K x 64 contiguous bytes, which the kernel streams
once per step. Worked example, the tied embedding E [V, D] as the LM head (contracted
axis D, kept axis V): W = E.T is [D, V] and E[v, d] = panels[v // 16, d, v % 16]; the
embedding lookup reads its rows straight from the panels (`take_rows`), so the packed
model holds one copy of E.

Packing happens once, at load (`pack_params`), where the decode programs run on one CPU
device in float32 and the kernel is available (`wanted`). Float64 (the exactness tests),
bfloat16, Q8_0's block scales, meshes and other platforms keep the weights as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from lookahead_jax.models import cpu_kernel, llama_params, quantize
from lookahead_jax.models.quantize import Int8Weight

PANEL = cpu_kernel.PANEL


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PackedWeight:
    """A matrix in panels (module docstring): `panels` [P, K, 16] float32 or int8, with
    `scale` [N] float32 (one per output column) for int8. `shape` is the weight's own
    shape and `contracted` its summed axes, both static: the einsums and the lookup read
    them. Unlike Int8Weight.contracted (negative positions, the same in a stacked and a
    per-layer weight), these are non-negative positions in `shape`: a packed weight is
    always one layer's."""

    panels: jax.Array
    scale: jax.Array | None = None
    shape: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    contracted: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @property
    def dtype(self):
        """The compute dtype: float32."""
        return jnp.dtype(jnp.float32)

    @property
    def kept(self) -> tuple[int, ...]:
        """The kept (output) axes' positions, in order."""
        return tuple(i for i in range(len(self.shape)) if i not in self.contracted)


def is_packed(params) -> bool:
    """Whether any matrix of `params` is packed (the model runs the CPU kernel)."""
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, PackedWeight))
    return any(isinstance(x, PackedWeight) for x in leaves)


def _packable(dtype, weights: str, mesh) -> bool:
    """float32 compute, float or per-channel int8 weights, one device, a CPU."""
    return (
        jnp.dtype(dtype) == jnp.float32
        and weights in ("float", "int8")
        and mesh is None
        and jax.default_backend() == "cpu"
    )


def build_kernel_soon(dtype, weights: str, mesh) -> None:
    """Where `wanted` may hold, start building the kernel now (cpu_kernel.build_soon), so
    that `lj.load` reads the weights meanwhile."""
    if _packable(dtype, weights, mesh):
        cpu_kernel.build_soon()


def wanted(dtype, weights: str, mesh) -> bool:
    """Whether `lj.load` packs: float32 compute, float or per-channel int8 weights, one
    device, a CPU, and the kernel built here."""
    return _packable(dtype, weights, mesh) and cpu_kernel.available()


def pack(w, contracted: tuple[int, ...]):
    """A float32 array or per-channel Int8Weight -> its PackedWeight; returned as it is
    where it cannot be packed (N not a multiple of 16, block scales, not float32)."""
    out = pack_group((w,), contracted)
    return w if out is None else out


def pack_group(ws: tuple, contracted: tuple[int, ...]) -> PackedWeight | None:
    """Weights of one contraction and form (float32 arrays, or per-channel Int8Weights)
    packed as one matrix, in one program: one weight's PackedWeight, or several as their
    outputs one after another along their first kept axis (fused.py's Q/K/V and gate/up:
    a matrix's panels are its output columns 16 at a time, so the fused matrix's panels
    are its parts' panels in turn, and its int8 scales their scales). None where any
    cannot be packed (N not a multiple of 16, block scales, not float32)."""
    values = tuple(w.q if isinstance(w, Int8Weight) else w for w in ws)
    int8 = isinstance(ws[0], Int8Weight)
    for w in ws:
        if isinstance(w, Int8Weight) != int8 or w.dtype != jnp.float32:
            return None
        if int8 and w.block:
            return None
    contracted = tuple(sorted(d % values[0].ndim for d in contracted))
    kept = tuple(i for i in range(values[0].ndim) if i not in contracted)
    K = math.prod(values[0].shape[i] for i in contracted)
    Ns = tuple(math.prod(v.shape[i] for i in kept) for v in values)
    if any(N % PANEL for N in Ns):
        return None
    panels = _panels(values, contracted + kept, K, Ns)
    scale = None
    if int8:
        scales = [w.scale.reshape(N) for w, N in zip(ws, Ns, strict=True)]
        scale = scales[0] if len(scales) == 1 else jnp.concatenate(scales)
    shape = list(values[0].shape)
    shape[kept[0]] = sum(v.shape[kept[0]] for v in values)
    return PackedWeight(panels, scale, tuple(shape), contracted)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _panels(values: tuple, order: tuple[int, ...], K: int, Ns: tuple[int, ...]):
    """Each weight's axes in `order` (contracted first) as W [K, N], cut into panels
    [N / 16, K, 16], the weights' panels one after another [P = sum N / 16, K, 16]."""
    parts = [
        jnp.transpose(v, order).reshape(K, N // PANEL, PANEL).transpose(1, 0, 2)
        for v, N in zip(values, Ns, strict=True)
    ]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def pack_params(params, cfg, free: bool = False, fuse_layer=None):
    """Per-layer LlamaParams with every matrix of quantize.CONTRACTED packed (what can
    be). `free`: delete each original array once its panels are made (lj.load owns them),
    so packing holds one matrix twice at a time, not the whole model — but where the
    layers are views of stacked arrays (lj.load on a CPU), those live until the last
    layer is packed: the model twice at the peak, as when the layers were copies (peak
    RSS 1.21 GB loading SmolLM2-135M, 1.26 GB with copies; 2-core Intel Xeon).

    fuse_layer: fused.fuse_layer, to pack each layer's Q/K/V and gate/up as one matrix
    each (`pack_group`), a FusedLayer: one kernel call where three and two ran, the same
    bits (the kernel sums each output column over K alone). SmolLM2-135M's matmuls
    alone, 2-core Intel Xeon: 20.6 -> 19.5 ms at one row, 30.4 -> 28.9 ms at 16. A layer
    whose groups cannot be packed stays unfused. (Given, not imported: fused.py imports
    llama_params.py, which imports this module.)"""
    specs = llama_params.flat_names(
        llama_params.param_specs(cfg)
    )  # stacked: layer weights lead with L

    def dims(name: str) -> tuple[int, ...]:
        axes = specs[name].axes[1:] if name.startswith("layers/") else specs[name].axes
        return quantize.contracted_dims(name, axes)

    def freed(ws, out):
        if free and out is not None and out is not ws[0]:  # (an int8 scale may live on)
            for w in ws:
                (w.q if isinstance(w, Int8Weight) else w).delete()
        return out

    def pack_named(name: str, w):
        return None if w is None else freed((w,), pack(w, dims(name)))

    def pack_layer(lp):
        names = [
            f.name for f in dataclasses.fields(lp) if f"layers/{f.name}" in quantize.CONTRACTED
        ]
        if fuse_layer is not None:
            qkv, gate_up = (lp.wq, lp.wk, lp.wv), (lp.w_gate, lp.w_up)
            wqkv = pack_group(qkv, dims("layers/wq"))
            w_gate_up = pack_group(gate_up, dims("layers/w_gate"))
            if wqkv is not None and w_gate_up is not None:
                freed(qkv, wqkv)
                freed(gate_up, w_gate_up)
                rest = {n: pack_named(f"layers/{n}", getattr(lp, n)) for n in ("wo", "w_down")}
                return fuse_layer(dataclasses.replace(lp, **rest), wqkv, w_gate_up)
        return dataclasses.replace(
            lp, **{n: pack_named(f"layers/{n}", getattr(lp, n)) for n in names}
        )

    return dataclasses.replace(
        params,
        embed=pack_named("embed", params.embed),
        lm_head=pack_named("lm_head", params.lm_head),
        layers=tuple(map(pack_layer, params.layers)),
    )


def einsum(spec: str, x, w, **kwargs):
    """jnp.einsum(spec, x, w) for a float, Int8Weight or PackedWeight `w`. For a
    PackedWeight the spec must contract x's last axes with w's contracted axes (in w's
    order) and give x's other axes then w's kept axes: every matmul of llama.forward."""
    if not isinstance(w, PackedWeight):
        return quantize.einsum(spec, x, w, **kwargs)
    operands, out = spec.split("->")
    x_letters, w_letters = operands.split(",")
    summed = "".join(w_letters[i] for i in w.contracted)
    kept = "".join(w_letters[i] for i in w.kept)
    lead = x_letters[: len(x_letters) - len(summed)]
    if x_letters[len(lead) :] != summed or out != lead + kept:
        raise ValueError(f"a packed weight cannot take the einsum {spec!r}")
    if kwargs.get("preferred_element_type", jnp.float32) != jnp.float32:
        raise ValueError("the CPU kernel accumulates and returns float32")
    K = w.panels.shape[1]
    y_mn = cpu_kernel.matmul(x.reshape(-1, K).astype(jnp.float32), w.panels, w.scale)
    return y_mn.reshape(x.shape[: len(lead)] + tuple(w.shape[i] for i in w.kept))


def take_rows(w, ids):
    """w[ids] (an embedding lookup) for a float, Int8Weight or PackedWeight `w` of rows
    [V, D] (contracted D): row v is panels[v // 16, :, v % 16] (times scale[v])."""
    if not isinstance(w, PackedWeight):
        return quantize.take_rows(w, ids)
    assert w.contracted == (1,), "rows of a [V, D] weight contracted over D"
    rows = w.panels[ids // PANEL, :, ids % PANEL]  # [..., D]
    if w.scale is None:
        return rows
    return rows.astype(jnp.float32) * w.scale[ids][..., None]


def merge_leading(w, n: int):
    """quantize.merge_leading for any weight; a PackedWeight is a [K, N] matrix already,
    so only its recorded shape changes (its first n axes, all contracted, as one)."""
    if not isinstance(w, PackedWeight):
        return quantize.merge_leading(w, n)
    assert w.contracted == tuple(range(len(w.contracted))) and n <= len(w.contracted)
    shape = (math.prod(w.shape[:n]), *w.shape[n:])
    contracted = tuple(range(len(w.contracted) - n + 1))
    return dataclasses.replace(w, shape=shape, contracted=contracted)
