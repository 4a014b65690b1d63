"""`RoundRead`: what the host reads of the slots between rounds — each row's tokens and
counts — packed on the device into one [B, K] int32 array and read in one transfer (a
round read ten arrays one by one before: `done`, then `n_out` and `steps` for auto's
choice and again after it, `accept_hist` for auto's watch and again for the finished rows,
then seven more to deliver the results).

Packed row layout, K = 2*S + 5 + E + 3*J (J: the guess sources and the window; 0 for
plain decoding):

    [ tokens (S) | step_of_token (S) | prompt_len, n_out, max_new_tokens, done, steps |
      accept_hist (E) | nodes_by_source (J) | paths_by_source (J) | tokens_by_source (J) ]

Rows stay on the first axis, so a state whose rows are sharded over processes packs to an
array sharded the same way, gathered whole by multihost.all_rows.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.decode_state import DecodeState
from lookahead_jax.distributed import multihost
from lookahead_jax.engine import slot_state

_SCALARS = ("prompt_len", "n_out", "max_new_tokens", "done", "steps")
_SOURCE_COUNTS = ("nodes_by_source", "paths_by_source", "tokens_by_source")


@dataclasses.dataclass(frozen=True)
class RoundRead:
    """The slots' tokens and counts on the host (numpy), as the state held them.

    tokens_bs, step_of_bs   [B, S]  prompt and output; the step that emitted each token
    prompt_len_b, n_out_b, max_new_b, steps_b  [B]
    done_b                  [B] bool
    accept_hist_be          [B, E]  steps that emitted 1..E tokens
    nodes_bj, paths_bj, tokens_bj  [B, J]  per guess source (None for plain decoding)
    """

    tokens_bs: np.ndarray
    step_of_bs: np.ndarray
    prompt_len_b: np.ndarray
    n_out_b: np.ndarray
    max_new_b: np.ndarray
    done_b: np.ndarray
    steps_b: np.ndarray
    accept_hist_be: np.ndarray
    nodes_bj: np.ndarray | None
    paths_bj: np.ndarray | None
    tokens_bj: np.ndarray | None


def pack(state: DecodeState):
    """[B, K] int32: each row's fields side by side (the module docstring's layout)."""
    parts = [state.tokens, state.step_of_token]
    parts += [getattr(state, f)[:, None] for f in _SCALARS]
    parts.append(state.accept_hist)
    if state.draft is not None:
        parts += [getattr(state.draft, f) for f in _SOURCE_COUNTS]
    return jnp.concatenate([p.astype(jnp.int32) for p in parts], axis=1)


def read(state: DecodeState) -> RoundRead:
    """The state's RoundRead: one packing program, one transfer of every process's rows."""
    packed = multihost.all_rows(slot_state.program(pack, None)(state))
    S, E = state.tokens.shape[1], state.accept_hist.shape[1]
    J = 0 if state.draft is None else state.draft.nodes_by_source.shape[1]
    widths = [S, S, *[1] * len(_SCALARS), E, *[J] * (len(_SOURCE_COUNTS) if J else 0)]
    cols = np.split(packed, np.cumsum(widths)[:-1], axis=1)
    tokens, step_of, prompt_len, n_out, max_new, done, steps, hist, *counts = cols
    nodes, paths, guessed = counts if counts else (None, None, None)
    return RoundRead(
        tokens_bs=tokens,
        step_of_bs=step_of,
        prompt_len_b=prompt_len[:, 0],
        n_out_b=n_out[:, 0],
        max_new_b=max_new[:, 0],
        done_b=done[:, 0].astype(bool),
        steps_b=steps[:, 0],
        accept_hist_be=hist,
        nodes_bj=nodes,
        paths_bj=paths,
        tokens_bj=guessed,
    )
