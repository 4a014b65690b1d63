"""Several processes (hosts), one global batch: each process passes its own rows and gets
them back.

On a multi-host TPU slice or GPU cluster every process runs the same program
with its own prompts; the global batch is the processes' rows in process order,
laid out over the mesh's `data` axis. These helpers are no-ops with one process.

    initialize()             jax.distributed.initialize (auto-detected on TPU, SLURM,
                             Open MPI, ...; or coordinator/num_processes/process_id)
    agree_max(x)             the maximum of x over all processes
    every_process_rows(ids)  every process's rows of token ids, in process order
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


def every_process_rows(local: list[list[int]]) -> tuple[list[list[int]], int]:
    """(every process's rows of token ids, process p's after process p - 1's; the index
    of this process's first row). Each process passes as many rows. One process: its
    own, 0."""
    if not is_multiprocess():
        return local, 0
    from jax.experimental import multihost_utils

    agree(len(local), "number of prompts")
    longest = agree_max(max(len(row) for row in local))
    padded = np.full((len(local), longest), -1, np.int32)
    for b, row in enumerate(local):
        padded[b, : len(row)] = row
    every = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, longest)
    return [row[row >= 0].tolist() for row in every], len(local) * jax.process_index()


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
