"""Compiled decoding programs, kept per process and shape.

`compiled(model, spec, new_positions, start_args, name)` returns one entry point
of a decode (`start`, `run_loop` or `run_plain`) compiled ahead of time (`compile_soon`
traces, lowers and compiles it in a background thread), once per (spec, new_positions,
mesh, argument shapes) in this process — and, through JAX's persistent compilation cache,
across processes; `state_shape` the shapes of the state they pass, from the one trace of
`start` (under a lock: both threads trace).

At most `MAX_KEPT` executables are kept, the least recently used dropped first: each
compiled XLA:CPU executable holds memory mappings of its JIT code (SmolLM2: ~160 for a
plain program, ~420 for a lookahead one), and a process that compiles without bound
reaches Linux's vm.max_map_count (65530 by default), where the next compile segfaults
(seen in long-lived pytest workers). 64 lookahead programs: ~27k mappings.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp

from lookahead_jax import decoding
from lookahead_jax.decoding import program_caches
from lookahead_jax.decoding.decode_state import DecodeSpec
from lookahead_jax.decoding.loop import compiler_options  # noqa: F401  (re-exported)

MAX_KEPT = 64  # compiled executables kept per process (assign to change)
_JITTED: dict = {}  # program key -> (decoding.Jitted, state shape, `start` traced)
_TRACING = threading.Lock()  # held while _JITTED is read or filled (two threads trace)
_COMPILED = collections.OrderedDict()  # (program key, entry point) -> executable, LRU first
_PENDING: dict = {}  # (program key, entry point) -> Future of its executable (compile_soon)
_COMPILER_LOCK = threading.Lock()
_COMPILER: ThreadPoolExecutor | None = None  # the background compiles' thread (made at first use)


def _compiler() -> ThreadPoolExecutor:
    global _COMPILER
    with _COMPILER_LOCK:  # (one executor, whichever thread asks first)
        if _COMPILER is None:
            _COMPILER = ThreadPoolExecutor(1, thread_name_prefix="lookahead-jax-compile")
    return _COMPILER


def clear() -> None:
    """Forget every compiled program, these and every other cache of programs
    (program_caches.py; tests that patch the step use this)."""
    program_caches.clear()


def _clear_decode_programs() -> None:
    """This module's programs: a compilation already running is waited for, so that it
    writes nothing back afterwards."""
    for pending in _PENDING.values():
        if not pending.cancel():
            concurrent.futures.wait([pending])
    _PENDING.clear()
    with _TRACING:
        _JITTED.clear()
    _COMPILED.clear()


program_caches.register(_clear_decode_programs)


def matmul_precision(dtype) -> str | None:
    """The matmul precision programs for a model of `dtype` are traced with.

    The user's `jax_default_matmul_precision` if set; else 'highest' for float32 and
    float64 models, whose exactness rests on a T-token pass agreeing with 1-token passes
    to float32 rounding (on NVIDIA GPUs since Ampere XLA otherwise runs float32 matmuls
    in TF32, 10-bit mantissas: see benchmarks/gpu/); else the platform's default
    (bfloat16 models).
    """
    chosen = jax.config.jax_default_matmul_precision
    if chosen is not None:
        return chosen
    return "highest" if jnp.dtype(dtype).itemsize >= 4 else None


def precision_scope(dtype):
    """A context in which to trace programs for a model of `dtype` (matmul_precision)."""
    return _scope(matmul_precision(dtype))


def _scope(precision: str | None):
    """A context with this default matmul precision (None: as it is)."""
    if precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision)


def _key(model, spec: DecodeSpec, new_positions: int, start_args):
    """A program's identity: its spec, room, mesh, its arguments' structure, shapes and
    dtypes, and the matmul precision; on a mesh its arguments' shardings too. Without a
    mesh a program runs where the params live (the first argument: their device is in
    the key), and its other arguments go there, given as device arrays, host arrays or
    shapes: one program, one key. (The server's warm-up compiled its prefills from
    shapes and a served prefill passes the grammar tables as device arrays: keyed
    apart, a fresh server's first chats compiled those prefills again, 1.3-2.0 s each in
    the foreground; a 2-core AMD EPYC, SmolLM2-135M.)"""
    leaves, tree = jax.tree.flatten(start_args)
    # (dtypes as numpy's objects, compared and hashed in C: their names cost 12 ms a
    # prefill over SmolLM2's 282 leaves, five keys an admission)
    placed = model.mesh is not None
    shapes = tuple(
        (a.shape, a.dtype, getattr(a, "sharding", None) if placed else None) for a in leaves
    )
    home = None if placed or not leaves else getattr(leaves[0], "sharding", None)
    return (
        spec,
        new_positions,
        model.mesh,
        home,
        tree,
        shapes,
        matmul_precision(spec.cache_dtype),
    )


def _jitted(key, model, spec: DecodeSpec, new_positions: int, start_args):
    """(decoding.Jitted, the state's shapes, `start` traced) of a program key, traced
    once: tracing the prefill of a 30-layer model takes a second or more (SmolLM2 on a
    2-core CPU: 0.8-2 s), so the trace that gives the state's shapes is the one `start`
    is lowered from. Under _TRACING: the compile thread (compile_soon) and the caller may
    ask for the same key at once, and one trace serves both. The key's matmul precision
    is the caller's (matmul_precision), whichever thread traces."""
    with _TRACING:
        if key not in _JITTED:
            fns = decoding.jitted(spec, new_positions, model.mesh, start_args)
            with _scope(key[-1]):
                traced = fns.start.trace(*start_args)
            _JITTED[key] = (fns, traced.out_info, traced)
        return _JITTED[key]


def state_shape(model, spec: DecodeSpec, new_positions: int, start_args):
    """The shapes (jax.ShapeDtypeStruct leaves) of the DecodeState `start` gives."""
    key = _key(model, spec, new_positions, start_args)
    return _jitted(key, model, spec, new_positions, start_args)[1]


def compiled(model, spec: DecodeSpec, new_positions: int, start_args, name: str):
    """(executable, seconds spent compiling) of entry point `name`: 'start', 'run_loop'
    (decoding.run_loop: `step` runs inside it) or 'run_plain' (its plain steps over the
    same state). A compilation `compile_soon`
    started is waited for: its seconds are those waited here."""
    key = _key(model, spec, new_positions, start_args)
    _settle()
    t = time.perf_counter()
    if (key, name) in _PENDING:
        exe = _PENDING.pop((key, name)).result()
    elif (key, name) in _COMPILED:
        _COMPILED.move_to_end((key, name))
        return _COMPILED[(key, name)], 0.0
    else:
        exe = _lowered(key, model, spec, new_positions, start_args, name).compile()
    _COMPILED[(key, name)] = exe
    _forget_least_recent()
    return exe, time.perf_counter() - t


def compile_soon(model, spec: DecodeSpec, new_positions: int, start_args, name: str):
    """Start making what `compiled` would return in a background thread — tracing,
    lowering and compiling — so that the caller compiles another program meanwhile: XLA
    compiles mostly on one thread (two of auto's probe programs took 10.2 s one after the
    other, 6.9 s side by side on the 2-core CPU), and the engine compiles its loop beside
    its first prefill's program. Tracing a lookahead loop takes 1-1.7 s even when the
    persistent cache then holds its executable (Intel Xeon, SmolLM2): in the caller's
    thread it delayed the first prefill by that much. JAX's thread-local settings that
    tracing reads (x64; the matmul precision, part of the key) are the caller's."""
    key = _key(model, spec, new_positions, start_args)
    _settle()
    if (key, name) in _COMPILED or (key, name) in _PENDING:
        return
    x64 = bool(jax.config.jax_enable_x64)

    def make():
        with jax.enable_x64(x64):
            return _lowered(key, model, spec, new_positions, start_args, name).compile()

    _PENDING[(key, name)] = _compiler().submit(make)


def ready(model, spec: DecodeSpec, new_positions: int, start_args, name: str) -> bool:
    """Whether `compiled` would return this program without compiling or waiting."""
    _settle()
    return (_key(model, spec, new_positions, start_args), name) in _COMPILED


def _settle() -> None:
    """Move background compilations that finished into the kept executables (those that
    failed are dropped: `compiled` compiles again and raises), so that one started and
    never fetched (a decode whose rows all ended at the prefill) counts against
    MAX_KEPT like any other."""
    for entry, pending in list(_PENDING.items()):
        if pending.done():
            del _PENDING[entry]
            if pending.exception() is None:
                _COMPILED[entry] = pending.result()
    _forget_least_recent()


def _lowered(key, model, spec: DecodeSpec, new_positions: int, start_args, name: str):
    """Entry point `name` of the program `key`, traced and lowered (not compiled)."""
    fns, state, traced = _jitted(key, model, spec, new_positions, start_args)
    with _scope(key[-1]):
        if name == "start":
            return traced.lower()  # with jitted's compiler options
        return getattr(fns, name).lower(model.params, state, jnp.int32(0), jnp.bool_(False))


def _forget_least_recent() -> None:
    """Drop executables beyond MAX_KEPT, oldest use first, and the jitted functions no
    kept executable comes from (so that JAX's own caches let go of them too)."""
    while len(_COMPILED) > max(MAX_KEPT, 2):  # a decode needs its start and its loop
        (key, _), _ = _COMPILED.popitem(last=False)
        if all(kept != key for kept, _ in _COMPILED):
            with _TRACING:
                _JITTED.pop(key, None)
