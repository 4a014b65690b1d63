"""`GrammarBank`: the grammars of one run's rows in the one table its programs read
(decoding/grammar_rows.py). Row 0 is FREE (every token allowed, leading back to it: the
rows with no grammar); each distinct automaton (grammar/automaton.py) follows at an
offset, its states and next states shifted by it, its forbidden tokens still -1.

Worked example: automata A (3 states) and B (2 states) over V tokens make a table of
1 + 3 + 2 = 6 rows, padded to G = 16 (a multiple of ROWS_STEP, so that few program shapes meet):
A at offset 1, B at 4; a row under B starts in state 4 + B.initial, and A's
next_sv[s, v] = t becomes table[1 + s, v] = 1 + t.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lookahead_jax.decoding.grammar_rows import FREE
from lookahead_jax.errors import UserInputError
from lookahead_jax.grammar import MAX_TABLE_BYTES, TokenAutomaton, fixed_text

ROWS_STEP = 16  # G is a multiple of this (few program shapes; a grammar's own bound holds)
CHAIN = 8  # tokens of fixed text guessed from a state (grammar/fixed_text.py)
_CHAINS: dict = {}  # id(automaton.next_sv) -> (its arrays, chains [S, CHAIN]): made once


def _chains(a: TokenAutomaton, tokenizer) -> np.ndarray:
    """The automaton's fixed-text guesses from every state (kept with the automaton)."""
    known = _CHAINS.get(id(a.next_sv))
    if known is None or known[0] is not a.next_sv:
        if len(_CHAINS) > 64:
            _CHAINS.clear()

        def encode(text: bytes) -> list[int]:
            return tokenizer.encode(text.decode("utf-8", "ignore"), add_special_tokens=False)

        known = (a.next_sv, fixed_text.chains(a, tokenizer.token_bytes(), encode, CHAIN))
        _CHAINS[id(a.next_sv)] = known
    return known[1]


class GrammarBank:
    """The automata of a run, placed (module docstring); `table` [G, V] int32 on the host."""

    def __init__(self, automata: list[TokenAutomaton], vocab_size: int, tokenizer=None):
        distinct: dict[int, TokenAutomaton] = {}
        for a in automata:
            distinct.setdefault(id(a.next_sv), a)  # (the compile cache shares arrays)
        used = 1 + sum(a.states for a in distinct.values())
        G = -(-used // ROWS_STEP) * ROWS_STEP
        if G * vocab_size * 4 > MAX_TABLE_BYTES + ROWS_STEP * vocab_size * 4:
            raise UserInputError(
                f"the run's {len(distinct)} distinct grammars make {used} automaton states "
                f"together, a table of {G * vocab_size * 4 / 2**20:.0f} MiB, over the bound of "
                f"{MAX_TABLE_BYTES / 2**20:.0f} MiB (lookahead_jax.grammar.MAX_TABLE_BYTES): "
                "run fewer distinct grammars at once"
            )
        table = np.full((G, vocab_size), -1, np.int32)
        table[FREE] = FREE
        chains = np.full((G, CHAIN), -1, np.int32)  # FREE's: none
        self.offsets: dict[int, int] = {}
        at = 1
        for key, a in distinct.items():
            block = a.next_sv
            table[at : at + a.states, : block.shape[1]] = np.where(block >= 0, block + at, -1)
            if tokenizer is not None:
                chains[at : at + a.states] = _chains(a, tokenizer)
            self.offsets[key] = at
            at += a.states
        self.table, self.chains = table, chains
        self._on_device = None

    @classmethod
    def for_run(cls, encoded, model, lookahead) -> GrammarBank | None:
        """The bank of an offline run's requests (None when no request has a grammar)."""
        automata = [r.grammar for r in encoded if r.grammar is not None]
        if not automata:
            return None
        if model.mesh is not None:
            raise UserInputError("structured output (json_schema, regex) runs on one device")
        if lookahead not in (None, "auto") and lookahead.verify_window:
            raise UserInputError(
                "structured output cannot run with verify_window=True (the window's own "
                "paths are not masked by the grammar)"
            )
        return cls(automata, model.lm.vocab_size, model.tokenizer)

    @staticmethod
    def refuse_online(encoded, name: str) -> None:
        """An online engine's rounds hold no grammar table yet: refuse a request with one."""
        if encoded.grammar is not None:
            raise UserInputError(
                "${request}: structured output (json_schema, regex) runs in offline runs "
                "(lj.generate, Engine.run) so far, not in an online engine's rounds",
                "json_schema",
                request=name,
            )

    def on_device(self):
        """(table, chains) as device arrays, put there once (a prefill passes them)."""
        if self._on_device is None:
            import jax.numpy as jnp

            self._on_device = (jnp.asarray(self.table), jnp.asarray(self.chains))
        return self._on_device

    def initial_state(self, automaton: TokenAutomaton | None) -> int:
        """The state a row under `automaton` starts in (FREE for None)."""
        if automaton is None:
            return FREE
        return self.offsets[id(automaton.next_sv)] + automaton.initial


def with_guesses(lookahead, max_context: int):
    """`lookahead` (a LookaheadConfig) with the grammar source on: up to CHAIN tokens a
    step, no deeper than its tree holds (a fixed tree: the chain competes for its nodes;
    without one it adds nodes, so the step is checked against the context again)."""
    length = CHAIN if lookahead.tree is None else max(1, min(CHAIN, lookahead.tree))
    config = dataclasses.replace(lookahead, grammar_guess=length)
    config.check_fits(max_context)
    return config
