"""A small-M matmul for x86-64 CPUs, outside XLA: y[M, N] = x[M, K] @ W[K, N] reading W
from memory once, for the M = B x T rows of a decode step (small_m.cc is the kernel).

Why a kernel of our own (benchmarks/cpu/small_m.md): a decode step is bound by reading
its weights, and at M = 1 XLA:CPU's own matrix-vector kernel streams them once; at M > 1
jaxlib 0.10.2 sends the dot to YNNPACK (a `__ynn_fusion`), which at these shapes costs
1.5x (M = 2) to 4x (M = 16) the M = 1 time on the 2-core AMD EPYC, while the arithmetic
would allow ~1.3x. No other library here does better (Eigen with YNNPACK off, numpy's
OpenBLAS, PyTorch, XLA's XNNPACK and oneDNN options: measured in small_m.md), so
lookahead's T-token step and the engine's B-row step threw away most of what their
guesses won.

The kernel is built on first use with the machine's C++ compiler (g++ or $CXX) into the
cache directory, keyed by its source and jaxlib's version, and registered as an XLA FFI
target. `available()` is False where it cannot be: not x86-64, no AVX2 + FMA, no
compiler, or `LOOKAHEAD_JAX_CPU_KERNEL=0`; the model then keeps XLA's matmuls. The
weights it reads are packed in panels (packed.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

from lookahead_jax.cache_dir import cache_root, exclusive

PANEL = 16  # output columns per panel (small_m.cc's kPanel)
SOURCE = Path(__file__).with_name("small_m.cc")
TARGETS = {"float32": "lookahead_jax_small_m_f32", "int8": "lookahead_jax_small_m_int8"}
# AVX2 + FMA, not -march=native: a library in a shared cache directory may be loaded on
# another machine, and lj_small_m_supported() checks the CPU before it is registered
FLAGS = ("-O3", "-mavx2", "-mfma", "-std=c++17", "-shared", "-fPIC")
ENV = "LOOKAHEAD_JAX_CPU_KERNEL"  # "0" turns the kernel off


def _library_path() -> Path:
    import jaxlib

    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(" ".join((jaxlib.__version__, *FLAGS)).encode())
    return cache_root() / "cpu_kernel" / f"small_m-{key.hexdigest()[:16]}.so"


def _build(out: Path) -> None:
    """Compile small_m.cc into `out` (atomically: a half-written library is never seen)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise OSError("no C++ compiler (g++, c++ or $CXX)")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"building {SOURCE.name} failed:\n{done.stderr[-2000:]}")
    os.replace(tmp, out)


_LOCK = threading.Lock()  # one build and registration per process


@functools.cache
def _load() -> ctypes.CDLL | None:
    """The built and registered library, or None where the kernel cannot run here (with
    a warning where it should have: the model then runs 1.5-4x slower steps)."""
    if os.environ.get(ENV) == "0" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    path = _library_path()
    try:
        with exclusive(path.with_suffix(".lock")):
            if not path.is_file():
                _build(path)
        lib = ctypes.cdll.LoadLibrary(str(path))
    except OSError as e:
        warnings.warn(
            f"the CPU kernel could not be built, XLA's matmuls are used instead "
            f"({ENV}=0 silences this): {e}",
            stacklevel=3,
        )
        return None
    if not lib.lj_small_m_supported():
        return None
    jax.ffi.register_ffi_target(TARGETS["float32"], jax.ffi.pycapsule(lib.LjSmallMF32), "cpu")
    jax.ffi.register_ffi_target(TARGETS["int8"], jax.ffi.pycapsule(lib.LjSmallMInt8), "cpu")
    return lib


def available() -> bool:
    """Whether the kernel runs here (builds and registers it on the first call)."""
    with _LOCK:
        return _load() is not None


def matmul(x_mk: jax.Array, panels_pkj: jax.Array, scale_n: jax.Array | None = None):
    """x [M, K] float32 @ W [K, N = P * 16], W given as its panels [P, K, 16] (float32, or
    int8 with `scale` [N] float32, one per output column) -> [M, N] float32."""
    assert available(), "the CPU kernel is not available here (cpu_kernel.available())"
    P, K, j = panels_pkj.shape
    assert j == PANEL and x_mk.shape[-1] == K and x_mk.dtype == jnp.float32, (x_mk, panels_pkj)
    out = jax.ShapeDtypeStruct((x_mk.shape[0], P * PANEL), jnp.float32)
    if scale_n is None:
        return jax.ffi.ffi_call(TARGETS["float32"], out)(x_mk, panels_pkj)
    return jax.ffi.ffi_call(TARGETS["int8"], out)(x_mk, panels_pkj, scale_n)
