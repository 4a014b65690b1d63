"""Device meshes and the partition rules that place params and decode state on them.

A mesh has two axes: `data` (batch rows) and `model` (Megatron-style tensor
parallelism). Every weight declares logical axis names (models/llama.py: param_specs); this
table maps them to mesh axes:

    logical axis   mesh axis   what it splits
    ------------   ---------   ----------------------------------------------
    batch          data        rows of the batch (prompts, cache, pool, window)
    vocab          model       embedding rows and LM-head columns
    heads          model       query heads (wq columns, wo rows)
    kv_heads       model       K/V heads (wk, wv and the KV cache)
    mlp            model       the MLP hidden units (gate/up columns, down rows)
    (anything else)            replicated: embed, head_dim, layers

A dimension is split only when the mesh axis divides it; otherwise that
weight is replicated along the axis (SmolLM2 has 9 query and 3 K/V heads, so
on model=2 or model=4 its attention weights and KV cache are replicated while
its MLP and vocabulary are split). Results are identical either way; only
memory and speed differ.

jit places arrays with `in_shardings`/`out_shardings` built from these rules
(see decoding.jitted); XLA's SPMD partitioner inserts the collectives.
"""

from __future__ import annotations

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from lookahead_jax.errors import UserInputError

DATA, MODEL = "data", "model"

RULES: dict[str, str] = {
    "batch": DATA,
    "vocab": MODEL,
    "heads": MODEL,
    "kv_heads": MODEL,
    "mlp": MODEL,
}


def make_mesh(data: int | None = None, model: int | None = None, devices=None) -> Mesh:
    """A (data, model) mesh over the first data*model devices.

    With neither size given: data=1, model=all devices. With one given, the other
    takes the rest of the devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    for name, v in (("data", data), ("model", model)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UserInputError(f"mesh {name} size must be a positive integer, got {v!r}")
    if data is None and model is None:
        data, model = 1, n
    elif data is None:
        data = max(n // model, 1)
    elif model is None:
        model = max(n // data, 1)
    if data * model > n:
        raise UserInputError(
            f"mesh data={data} x model={model} needs {data * model} devices, "
            f"but only {n} are available ({devices[0].platform})"
        )
    return jax.make_mesh(
        (data, model),
        (DATA, MODEL),
        axis_types=(AxisType.Auto, AxisType.Auto),
        devices=devices[: data * model],
    )


def default_mesh(params_bytes: int):
    """None (one device) unless the params would not fit in one local device's memory;
    then data=1, model=all local devices. (Memory is known on GPU/TPU; on CPU the
    host memory is shared, so one device is always used.)"""
    devices = jax.local_devices()
    if len(devices) == 1:
        return None
    stats = devices[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    if limit is None or params_bytes < 0.7 * limit:
        return None
    return make_mesh(data=1, model=len(devices), devices=devices)


def parse_mesh(text: str) -> dict[str, int]:
    """'data=2,model=4' -> {'data': 2, 'model': 4} (either key may be left out)."""
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in (DATA, MODEL) or key in out:
            raise UserInputError(f"--mesh must look like data=2,model=4, got {text!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise UserInputError(f"--mesh sizes must be integers, got {text!r}") from None
    return out


def spec_for(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec for a tensor with these logical axes under RULES."""
    used: set[str] = set()
    parts = []
    for axis, dim in zip(axes, shape, strict=True):
        target = RULES.get(axis)
        size = mesh.shape[target] if target is not None else 1
        if size == 1 or target in used or dim % size:
            parts.append(None)
        else:
            parts.append(target)
            used.add(target)
    return PartitionSpec(*parts)


def shardings_for(specs, mesh: Mesh | None):
    """A Sharding per weight of a params-shaped tree of ParamSpec (models/llama.py: param_specs):
    one device without a mesh, else the RULES applied to its logical axes."""
    is_spec = lambda x: hasattr(x, "axes") and hasattr(x, "shape")  # noqa: E731
    if mesh is None:
        single = SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda s: single, specs, is_leaf=is_spec)
    return jax.tree.map(
        lambda s: NamedSharding(mesh, spec_for(s.axes, s.shape, mesh)), specs, is_leaf=is_spec
    )


KV_CACHE_AXES = ("batch", "kv_heads", "positions", "head_dim")  # each layer's [B, K, S, Dh]


def batch_major(x, mesh: Mesh) -> NamedSharding:
    """An array [B, ...] split over data along B (replicated where B does not divide,
    e.g. the engine's one-row prefill)."""
    return NamedSharding(mesh, spec_for(("batch",) + ("_",) * (x.ndim - 1), x.shape, mesh))


def state_shardings(state_shape, mesh: Mesh):
    """Shardings for a DecodeState (given as shapes): batch-major leaves over data, each
    layer's K/V buffer [B, K, S, Dh] by KV_CACHE_AXES (K/V heads over model when divisible)."""
    import dataclasses

    out = jax.tree.map(lambda x: batch_major(x, mesh), state_shape)
    kv = [NamedSharding(mesh, spec_for(KV_CACHE_AXES, x.shape, mesh)) for x in state_shape.cache.k]
    cache = dataclasses.replace(out.cache, k=tuple(kv), v=tuple(kv))
    return dataclasses.replace(out, cache=cache)


def check_batch(mesh: Mesh | None, batch: int) -> None:
    if mesh is not None and batch % mesh.shape[DATA]:
        raise UserInputError(
            f"the batch of {batch} prompt(s) does not divide over the mesh's data axis of "
            f"size {mesh.shape[DATA]}; use a batch that is a multiple of it or a smaller data axis"
        )
