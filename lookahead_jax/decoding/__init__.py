"""Decoding: the state (decode_state.py), the plain and lookahead steps (plain.py,
lookahead.py), exact sampling (sampling.py), the loop on the device (loop.py), compiled
programs and their cache (programs.py) and the choice of step size (autotune.py, over
the step's measured cost, cost_curve.py).

`lj.decoding` is this package: `start`, `step`, `run_loop` and `jitted` (loop.py) for
research loops that drive decoding themselves, with all they take and give: the spec
`DecodeSpec` (with a `LookaheadConfig`, or None for plain decoding), the state
`DecodeState`, each row's sampling settings `RowSampling` (from `SamplingConfig`s) and
keys `row_keys`. docs/library.md has a loop that runs as written.
"""

from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.loop import Jitted, jitted, run_loop, start, step
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, row_keys
from lookahead_jax.guesses.lookahead_config import LookaheadConfig

__all__ = [
    "DecodeSpec",
    "DecodeState",
    "Jitted",
    "LookaheadConfig",
    "RowSampling",
    "SamplingConfig",
    "jitted",
    "row_keys",
    "run_loop",
    "start",
    "step",
]
