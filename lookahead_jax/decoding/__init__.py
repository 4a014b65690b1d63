"""Decoding: the state (decode_state.py), the plain and lookahead steps (plain.py,
lookahead.py), exact sampling (sampling.py), the loop on the device (loop.py), compiled
programs and their cache (programs.py), the host driver (driver.py) and the choice of
step size (autotune.py).

`lj.decoding` is this package: `start`, `step`, `run_loop` and `jitted` (loop.py) for
research loops that drive decoding themselves.
"""

from lookahead_jax.decoding.loop import Jitted, jitted, run_loop, start, step

__all__ = ["Jitted", "jitted", "run_loop", "start", "step"]
