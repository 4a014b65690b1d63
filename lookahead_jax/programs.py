"""Compiled decoding programs, kept per process and shape.

`programs(model, spec, cap, start_args, loop)` returns the `Programs` for one decode:
`start` and the loop it runs (`step` for the host loop, `run_loop` for the device
loop), compiled ahead of time once per (spec, budget, mesh, argument shapes) in this
process — and, through JAX's persistent compilation cache, across processes.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from lookahead_jax import decoding
from lookahead_jax.decode_state import DecodeSpec

_JITTED: dict = {}  # program key -> (decoding.Jitted, state shape)
_COMPILED: dict = {}  # (program key, entry point) -> compiled executable


@dataclasses.dataclass(frozen=True)
class Programs:
    start: object  # compiled decoding.start
    loop: object  # compiled decoding.step or decoding.run_loop
    compile_s: float  # seconds spent compiling now (0 when all were cached)


def clear() -> None:
    """Forget every compiled program (tests that patch the step use this)."""
    _JITTED.clear()
    _COMPILED.clear()


def _key(model, spec: DecodeSpec, cap: int, start_args):
    leaves, tree = jax.tree.flatten(start_args)
    shapes = tuple((a.shape, str(a.dtype), getattr(a, "sharding", None)) for a in leaves)
    return (spec, cap, model.mesh, tree, shapes)


def compiled(model, spec: DecodeSpec, cap: int, start_args, name: str):
    """(executable, seconds spent compiling) of entry point `name`: 'start', 'step' or
    'run_loop'."""
    key = _key(model, spec, cap, start_args)
    if (key, name) in _COMPILED:
        return _COMPILED[(key, name)], 0.0
    t = time.perf_counter()
    if key not in _JITTED:
        fns = decoding.jitted(spec, cap, model.mesh, start_args)
        state = jax.eval_shape(
            functools.partial(decoding.start, spec=spec, max_new_cap=cap), *start_args
        )
        _JITTED[key] = (fns, state)
    fns, state = _JITTED[key]
    lower_args = {
        "start": start_args,
        "step": (model.params, state),
        "run_loop": (model.params, state, jnp.int32(0)),
    }[name]
    exe = getattr(fns, name).lower(*lower_args).compile()
    _COMPILED[(key, name)] = exe
    return exe, time.perf_counter() - t


def programs(model, spec: DecodeSpec, cap: int, start_args, loop: str) -> Programs:
    """Start and `loop` ('step' or 'run_loop'), compiled (or taken from the cache)."""
    start, a = compiled(model, spec, cap, start_args, "start")
    loop_exe, b = compiled(model, spec, cap, start_args, loop)
    return Programs(start=start, loop=loop_exe, compile_s=a + b)
