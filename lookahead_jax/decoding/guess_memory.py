"""Guesses across requests: an engine-wide memory for the guess sources that keep one
(guess_source.py, "Across requests": token recycling's tables, suffix match's text),
fed by every row that ends and drawn from by every row that starts.

    memories(spec)                       one per source (None: keeps none), all empty
    recall(state, memories, bucket)      a prefill's new rows: each source's state from
                                         its memory (with the row's own prompt over it)
    remember(memories, state, rows_b)    the memories with the ended rows folded in
                                         (their states and text, before their slots
                                         are refilled)

A row's guesses never change its tokens (every guess is verified), so the memory changes
only how many tokens a step emits: a prompt asked again, or a conversation's next turn,
finds the earlier answer's text, and the model's runners-up after its tokens, already
there.
"""

from __future__ import annotations

import dataclasses

from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.lookahead import prompt_of
from lookahead_jax.guesses.guess_source import Ended


def _keeps_memory(source) -> bool:
    return all(hasattr(source, name) for name in ("memory", "recall", "remember"))


def memories(spec: DecodeSpec) -> tuple:
    """Empty memories, one per source of the spec's lookahead (None where it keeps none)."""
    vocab = spec.lm.vocab_size
    return tuple(s.memory(vocab) if _keeps_memory(s) else None for s in spec.lookahead.sources)


def recall(state: DecodeState, memories: tuple, *, spec: DecodeSpec, bucket: int) -> DecodeState:
    """A prefilled state (its guess sources just initialised) whose sources start from
    their memories instead; bucket: the prefill's prompt bucket P."""
    prompt = prompt_of(state, spec, bucket)
    sources = tuple(
        own if memory is None else source.recall(memory, own, prompt)
        for source, own, memory in zip(
            spec.lookahead.sources, state.draft.sources, memories, strict=True
        )
    )
    return dataclasses.replace(state, draft=dataclasses.replace(state.draft, sources=sources))


def remember(memories: tuple, state: DecodeState, rows_b, *, spec: DecodeSpec) -> tuple:
    """The memories with the states of rows `rows_b` [B] (bool) folded in."""
    ended = Ended(
        tokens=state.tokens, prompt_len=state.prompt_len, end=state.prompt_len + state.n_out
    )
    return tuple(
        None if memory is None else source.remember(memory, own, rows_b, ended)
        for source, own, memory in zip(
            spec.lookahead.sources, state.draft.sources, memories, strict=True
        )
    )


class GuessMemory:
    """The memories an engine keeps across its runs: one tuple per lookahead layout (a
    run that switches layout, or auto's choice, starts its own)."""

    def __init__(self):
        self._by_layout: dict = {}

    def of(self, spec: DecodeSpec) -> tuple:
        if spec.lookahead not in self._by_layout:
            self._by_layout[spec.lookahead] = memories(spec)
        return self._by_layout[spec.lookahead]

    def store(self, spec: DecodeSpec, kept: tuple) -> None:
        self._by_layout[spec.lookahead] = kept
