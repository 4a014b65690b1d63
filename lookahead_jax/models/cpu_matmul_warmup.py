"""Pay XLA:CPU's one-time matmul set-up in the background while `lj.load` reads weights.

The first matrix-matrix dot a process runs on XLA:CPU generates oneDNN's sgemm code
(`xbyak_gemm_t::generate` in a `perf` profile), once a process, whatever the shape. A
prefill is the first such dot a CLI call runs, so it paid for it: SmolLM2-135M's 1 x 128
prefill took 0.136 s at its first run and 0.089 s after (YNNPACK off, as the CLI runs it;
2-core Intel Xeon, jaxlib 0.10.2), and 0.100 s at its first run once a 2 x 8 by 8 x 16
dot had run before it (0.11 s, most of it compiling that dot). `warm_soon` runs that
small dot in a thread, once a process, so the set-up overlaps with reading the weights.
A matrix-vector dot does not do it (1 x 64 by 64 x 128: the prefill's first run stayed
0.158 s). Where XLA:CPU sets up nothing, the thread costs a small compile in the
background and nothing else.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

_STARTED = threading.Event()


def warm_soon() -> None:
    """Run one small float32 matrix-matrix dot on the CPU in a thread, once a process
    (where the default backend is the CPU). Not a daemon: an exit waits the ~0.1 s
    rather than stop XLA mid-compile."""
    if _STARTED.is_set() or jax.default_backend() != "cpu":
        return
    _STARTED.set()
    threading.Thread(target=_dot, name="cpu-matmul-warmup").start()


def _dot() -> None:
    x, w = jnp.ones((2, 8), jnp.float32), jnp.ones((8, 16), jnp.float32)
    jax.block_until_ready(jax.jit(jnp.dot)(x, w))
