"""Decoding: the state (decode_state.py), the plain and lookahead steps (plain.py,
lookahead.py), exact sampling (sampling.py), the loop on the device (loop.py), compiled
programs and their cache (programs.py), the host driver (driver.py) and the choice of
step size (autotune.py).

`lj.decoding` is this package: `start`, `step`, `run_loop` and `jitted` (loop.py) for
research loops that drive decoding themselves, with what they take: `DecodeSpec`,
`DecodeState`, `RowSampling`, `SamplingConfig`, `row_keys`.
"""

from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.loop import Jitted, jitted, run_loop, start, step
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, row_keys

__all__ = [
    "DecodeSpec",
    "DecodeState",
    "Jitted",
    "RowSampling",
    "SamplingConfig",
    "jitted",
    "row_keys",
    "run_loop",
    "start",
    "step",
]
