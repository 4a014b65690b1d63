"""Five kernels for x86-64 CPUs, outside XLA, for a decode step's work:

* `matmul` (small_m.cc): y[M, N] = x[M, K] @ W[K, N] reading W from memory once, for the
  M = B x T rows of a step (AVX2, or AVX-512 where the CPU has it, chosen at run time);
* `cache_attention` (cache_attention.cc): a step's queries over each row's K/V cache, as
  far as the row's length (AVX2, or AVX-512 for calls of 7 tokens and more, as the
  matmul, where a unit holds more than 6 queries or a pass's segments: the same bits
  either way);
* `first_max_index` (row_argmax.cc): jnp.argmax over the logits' rows in one pass (AVX2;
  XLA's two reductions took 1.5-1.8 ms of a 16-row step; sampling.first_max_index);
* `logsumexp` (row_logsumexp.cc): jax.nn.logsumexp over the logits' rows (AVX2 or
  AVX-512, the same bits; XLA's reduce of exp took 2.0-3.2 ms of a 16-token step, in token
  recycling's update; sampling.logsumexp);
* `threefry_bits` (threefry_bits.cc): jax.random.bits of a row of counters, for the
  Gumbel noise of sampling rows (XLA's loop over the hash took 4.4 ms of a 16-row step;
  sampling.gumbel_noise).

Why a kernel of our own (benchmarks/cpu/small_m.md): a decode step is bound by reading
its weights, and at M = 1 XLA:CPU's own matrix-vector kernel streams them once; at M > 1
jaxlib 0.10.2 sends the dot to YNNPACK (a `__ynn_fusion`), which at these shapes costs
1.5x (M = 2) to 4x (M = 16) the M = 1 time on the 2-core AMD EPYC, while the arithmetic
would allow ~1.3x. No other library here does better (Eigen with YNNPACK off, numpy's
OpenBLAS, PyTorch, XLA's XNNPACK and oneDNN options: measured in small_m.md), so
lookahead's T-token step and the engine's B-row step threw away most of what their
guesses won.

The kernels are built on first use with the machine's C++ compiler (g++ or $CXX) into
one library in the cache directory, keyed by their sources, jaxlib's version and the
compiler, and registered as XLA FFI targets (their handlers in ffi_bindings.cc, the
kernels themselves compiled without XLA's header: kernels.h). `available()` is False
where it cannot be: not x86-64, no AVX2 + FMA, no compiler, or `LOOKAHEAD_JAX_CPU_KERNEL=0`;
the model then keeps XLA's matmuls. The weights it reads are packed in panels (packed.py).

Why the attention (benchmarks/cpu/cache_attention.md): XLA:CPU runs attention.attention's
loop over 64-position blocks as a while loop of small YNNPACK dots: for SmolLM2-135M's 30
layers over 256 cached positions (12 MB of K/V, under 1 ms of memory traffic) 4.3 ms at
one token, 9.2 ms at 16 tokens and 33 ms at 16 rows, against the kernel's 1.9, 6.3 and
17.4 ms (the merge with the new tokens' part included).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.cache_dir import cache_root, exclusive

PANEL = 16  # output columns per panel (kernels.h's kPanelColumns)
# Each source with its optimization level: the kernels at -O3, their FFI handlers at -O1
# (they run once a call; XLA's FFI header, which only they include, is most of their
# build: ~4 s at -O1, ~7 s at -O3, where the kernels without it take ~1 s at -O3).
SOURCES = {
    Path(__file__).with_name(name): level
    for name, level in (
        ("ffi_bindings.cc", "-O1"),
        ("small_m.cc", "-O3"),
        ("cache_attention.cc", "-O3"),
        ("row_argmax.cc", "-O3"),
        ("row_logsumexp.cc", "-O3"),
        ("threefry_bits.cc", "-O3"),
    )
}
# the headers the sources include (in the key)
HEADERS = tuple(
    Path(__file__).with_name(n) for n in ("parallel.h", "kernels.h", "transpose.h", "vector_exp.h")
)
TARGETS = {"float32": "lookahead_jax_small_m_f32", "int8": "lookahead_jax_small_m_int8"}
ATTENTION_TARGET = "lookahead_jax_cache_attention_f32"
ARGMAX_TARGET = "lookahead_jax_first_max_index_f32"
LOGSUMEXP_TARGET = "lookahead_jax_logsumexp_f32"
THREEFRY_TARGET = "lookahead_jax_threefry_bits_u32"
# AVX2 + FMA, not -march=native: a library in a shared cache directory may be loaded on
# another machine, and lj_small_m_supported() checks the CPU before it is registered
FLAGS = ("-mavx2", "-mfma", "-std=c++17", "-fPIC")
# "0" turns the kernel off; "avx2" keeps the kernels' AVX2 paths where the CPU has AVX-512
# (their AVX-512 paths, compiled for it by a target attribute, give the same bits faster)
ENV = "LOOKAHEAD_JAX_CPU_KERNEL"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


@functools.cache
def _compiler_id(cxx: str | None) -> str:
    """The compiler's path and the first line of its --version (in the key: a library
    another compiler built, or one built before a compiler upgrade, is not reused)."""
    if cxx is None:
        return "none"
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx} {(version.stdout.splitlines() or [''])[0]}"
    except (OSError, subprocess.SubprocessError):
        return cxx


def _library_path() -> Path:
    """The library's path in the cache: keyed by the sources and headers, the flags,
    jaxlib's version and the compiler."""
    import jaxlib

    key = hashlib.sha256(b"".join(s.read_bytes() for s in (*SOURCES, *HEADERS)))
    parts = (jaxlib.__version__, *FLAGS, *SOURCES.values(), _compiler_id(_compiler()))
    key.update(" ".join(parts).encode())
    return cache_root() / "cpu_kernel" / f"kernels-{key.hexdigest()[:16]}.so"


def build_key() -> str:
    """The kernels' build (their library's key: sources, flags, jaxlib, compiler), 16 hex
    digits: a step cost measured with one build is not another's (cost_curve.device_key)."""
    return _library_path().stem.rsplit("-", 1)[-1]


def _build(out: Path) -> None:
    """Compile the sources into `out` (atomically: a half-written library is never seen),
    as many compiler processes at once as there are cores, the longest (the FFI handlers)
    first, then link them. On 2 cores: the handlers beside the kernels one after the
    other, 4.5 s; the three at once took 7.5 s."""
    cxx = _compiler()
    if cxx is None:
        raise OSError("no C++ compiler (g++, c++ or $CXX)")
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        objects = [Path(work) / f"{src.stem}.o" for src in SOURCES]

        def compile_one(src: Path, level: str, obj: Path):
            cmd = [cxx, level, *FLAGS, f"-I{jax.ffi.include_dir()}", "-c", str(src), "-o", str(obj)]
            return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        with ThreadPoolExecutor(min(len(SOURCES), os.cpu_count() or 1)) as pool:
            compiles = list(pool.map(compile_one, SOURCES, SOURCES.values(), objects))
        failed = [c.stderr for c in compiles if c.returncode != 0]
        tmp = Path(work) / out.name
        link = (
            None
            if failed
            else subprocess.run(
                [cxx, "-shared", *map(str, objects), "-o", str(tmp)], capture_output=True, text=True
            )
        )
        if failed or link.returncode != 0:
            why = failed[0] if failed else link.stderr
            raise OSError(f"building the CPU kernels failed:\n{why[-2000:]}")
        os.replace(tmp, out)


_LOCK = threading.Lock()  # one build and registration per process
_BUILDER: list[threading.Thread] = []  # build_soon's thread (at most one)
_BUILD_ERRORS: list[OSError] = []  # what it raised, raised again by _load


def _may_run_here() -> bool:
    return os.environ.get(ENV) != "0" and platform.machine().lower() in ("x86_64", "amd64")


def _built() -> Path:
    """The library's path, built first where the cache does not hold it (OSError where
    it cannot be)."""
    path = _library_path()
    with exclusive(path.with_suffix(".lock")):
        if not path.is_file():
            _build(path)
    return path


@functools.cache
def _load() -> ctypes.CDLL | None:
    """The built and registered library, or None where the kernel cannot run here (with
    a warning where it should have: the model then runs 1.5-4x slower steps)."""
    if not _may_run_here():
        return None
    try:
        if _BUILDER:  # build_soon's build: wait for it here, report its failure from here
            _BUILDER[0].join()
            if _BUILD_ERRORS:
                raise _BUILD_ERRORS[0]
        lib = ctypes.cdll.LoadLibrary(str(_built()))
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
    capsule = jax.ffi.pycapsule(lib.LjCacheAttentionF32)
    jax.ffi.register_ffi_target(ATTENTION_TARGET, capsule, "cpu")
    jax.ffi.register_ffi_target(ARGMAX_TARGET, jax.ffi.pycapsule(lib.LjFirstMaxF32), "cpu")
    jax.ffi.register_ffi_target(LOGSUMEXP_TARGET, jax.ffi.pycapsule(lib.LjLogSumExpF32), "cpu")
    jax.ffi.register_ffi_target(THREEFRY_TARGET, jax.ffi.pycapsule(lib.LjThreefryBitsU32), "cpu")
    return lib


def available() -> bool:
    """Whether the kernel runs here (builds and registers it on the first call)."""
    with _LOCK:
        return _load() is not None


def build_soon() -> None:
    """Start building the kernel in a thread (a cold start's ~7 s then overlaps with
    reading the weights), once a process; `available()` waits for it and warns, in the
    caller's thread, if it failed. Not a daemon: an exit waits for the compiler rather
    than leave it writing into the cache."""

    def build():
        try:
            _built()
        except OSError as e:
            _BUILD_ERRORS.append(e)

    with _LOCK:
        if _BUILDER or _load.cache_info().currsize or not _may_run_here():
            return
        _BUILDER.append(threading.Thread(target=build, name="cpu-kernel-build"))
        _BUILDER[0].start()


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


def cache_attention(
    q_bkre, k_bkse, v_bkse, lengths_b, positions_bt, window: int, scale: float,
    segments: bool = False,
):  # fmt: skip
    """The part of a step's attention that reads the cache (cache_attention.cc), as the
    online softmax's carry for attention.attention to merge with the new tokens' part:

    q          [B, K, R, Dh]  float32, R = T x Q: row r is token r // Q's query of head r % Q
    k, v       [B, K, S, Dh]  float32, the cache (entry s holds position s)
    lengths    [B]            entries s < lengths[b] are visible
    positions  [B, T]         the tokens' positions; with `window` > 0 entry s is visible
                              to a token at position p only where p - s < window

    segments: k/v are a ragged pass's own T tokens (S = T; attention.segment_attention)
    and `positions` holds each token's row's first token: token t sees the entries s with
    first[b, t] <= s <= t (and t - s < window, with one).

    Returns top [B, K, R] (the largest visible score, -1e30 where none is), mass [B, K, R]
    (the sum of exp(score - top) over visible entries) and acc [B, K, R, Dh] (the values
    weighted by the same exponentials); score = (q . k) * scale."""
    assert available(), "the CPU kernel is not available here (cpu_kernel.available())"
    B, K, R, Dh = q_bkre.shape
    f32 = jnp.float32
    outs = (
        jax.ShapeDtypeStruct((B, K, R), f32),
        jax.ShapeDtypeStruct((B, K, R), f32),
        jax.ShapeDtypeStruct((B, K, R, Dh), f32),
    )
    call = jax.ffi.ffi_call(ATTENTION_TARGET, outs)
    return call(
        q_bkre,
        k_bkse,
        v_bkse,
        lengths_b.astype(jnp.int32),
        positions_bt.astype(jnp.int32),
        window=int(window),
        scale=np.float32(scale),
        segments=int(segments),
    )


def first_max_index(x_mn: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis of float32 x [..., N] (N >= 1) -> int32 [...]: the
    first index of the largest value, a NaN counting as the largest (row_argmax.cc)."""
    assert available(), "the CPU kernel is not available here (cpu_kernel.available())"
    assert x_mn.dtype == jnp.float32 and x_mn.ndim >= 1 and x_mn.shape[-1] >= 1, x_mn
    out = jax.ShapeDtypeStruct(x_mn.shape[:-1], jnp.int32)
    # (rows are independent: a vmapped call is one call over the batched rows)
    return jax.ffi.ffi_call(ARGMAX_TARGET, out, vmap_method="broadcast_all")(x_mn)


def logsumexp(x_mn: jax.Array) -> jax.Array:
    """jax.nn.logsumexp over the last axis of float32 x [..., N] (N >= 1) -> float32 [...]
    (row_logsumexp.cc: NaN, +inf and all -inf rows as there; else within ~1e-6)."""
    assert available(), "the CPU kernel is not available here (cpu_kernel.available())"
    assert x_mn.dtype == jnp.float32 and x_mn.ndim >= 1 and x_mn.shape[-1] >= 1, x_mn
    out = jax.ShapeDtypeStruct(x_mn.shape[:-1], jnp.float32)
    return jax.ffi.ffi_call(LOGSUMEXP_TARGET, out, vmap_method="broadcast_all")(x_mn)


def threefry_bits(keys_m2: jax.Array, n: int) -> jax.Array:
    """jax.random.bits(key, (n,), uint32) for each raw threefry2x32 key of keys [..., 2]
    uint32 -> [..., n] uint32, with jax_threefry_partitionable on (threefry_bits.cc; the
    caller checks the config)."""
    assert available(), "the CPU kernel is not available here (cpu_kernel.available())"
    assert keys_m2.dtype == jnp.uint32 and keys_m2.ndim >= 1 and keys_m2.shape[-1] == 2, keys_m2
    out = jax.ShapeDtypeStruct((*keys_m2.shape[:-1], n), jnp.uint32)
    return jax.ffi.ffi_call(THREEFRY_TARGET, out, vmap_method="broadcast_all")(keys_m2)
