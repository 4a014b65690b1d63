"""Several processes (hosts), one global batch: each process feeds and reads its own rows.

On a multi-host TPU slice or GPU cluster every process runs the same program
with its own prompts; the global batch is the processes' rows in process order,
laid out over the mesh's `data` axis. These helpers are no-ops with one process.

    initialize()             jax.distributed.initialize (auto-detected on TPU, SLURM,
                             Open MPI, ...; or coordinator/num_processes/process_id)
    agree_max(x)             the maximum of x over all processes
    global_rows(mesh, a)     a global [B, ...] array from this process's rows
    local_rows(arr)          this process's rows of a global [B, ...] array, as numpy
    all_rows(arr)            every row of a global array, as numpy, on every process
    replicated(mesh, a)      a global array holding the same `a` on every device
    agree(value, what)       raise unless every process passed the same int
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    bind_address: str | None = None,
) -> None:
    """Join the multi-process runtime. Call before anything else touches JAX devices."""
    # CPU processes exchange collectives over gloo; GPU/TPU backends ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=bind_address,
    )


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def agree_max(value: int) -> int:
    if not is_multiprocess():
        return int(value)
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray([value], np.int64))))


def global_rows(mesh, local: np.ndarray) -> jax.Array:
    """A batch-major array whose rows are every process's `local` rows, in process order."""
    if mesh is None or not is_multiprocess():
        return jnp.asarray(local)
    sharding = NamedSharding(mesh, PartitionSpec("data", *([None] * (local.ndim - 1))))
    global_shape = (local.shape[0] * jax.process_count(), *local.shape[1:])
    return jax.make_array_from_process_local_data(sharding, local, global_shape)


def local_rows(arr: jax.Array) -> np.ndarray:
    """This process's rows (in order) of a batch-major array sharded over `data` only."""
    if arr.is_fully_addressable:
        return np.asarray(arr)
    blocks: dict[int, np.ndarray] = {}
    for shard in arr.addressable_shards:
        start = shard.index[0].start or 0
        blocks.setdefault(start, np.asarray(shard.data))  # replicas along `model` repeat
    return np.concatenate([blocks[k] for k in sorted(blocks)])


def all_rows(arr: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-process) array, as numpy, on every process."""
    if arr.is_fully_addressable:
        return np.asarray(arr)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(arr, tiled=True))


def replicated(mesh, value: np.ndarray, sharding=None) -> jax.Array:
    """`value` (the same on every process) on the mesh: on every device, or placed by
    `sharding` (e.g. its rows over `data`); on one device without a mesh."""
    if mesh is None:
        return jnp.asarray(value)
    sharding = sharding or NamedSharding(mesh, PartitionSpec())
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def agree(value: int, what: str) -> None:
    """Raise UserInputError naming `what` unless every process passed the same `value`
    (an int32: the gather goes through a device array)."""
    if agree_max(value) != value or agree_max(-value) != -value:
        from lookahead_jax.errors import UserInputError

        raise UserInputError(f"every process must pass the same {what}")


@jax.jit
def _all(x):
    return jnp.all(x)


def all_true(arr: jax.Array) -> bool:
    """jnp.all over a possibly multi-process array (the result is replicated)."""
    return (
        bool(np.asarray(_all(arr))) if not arr.is_fully_addressable else bool(np.asarray(arr).all())
    )
