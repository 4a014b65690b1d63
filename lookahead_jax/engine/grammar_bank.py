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

    def __init__(self, automata: list[TokenAutomaton], vocab_size: int, tokenizer=None, G=None):
        """The bank of `automata` (an offline run's), or with `G` an online engine's of G
        rows, empty until `place` puts automata in."""
        distinct: dict[int, TokenAutomaton] = {}
        for a in automata:
            distinct.setdefault(id(a.next_sv), a)  # (the compile cache shares arrays)
        used = 1 + sum(a.states for a in distinct.values())
        G = G or -(-used // ROWS_STEP) * ROWS_STEP
        if G * vocab_size * 4 > MAX_TABLE_BYTES + ROWS_STEP * vocab_size * 4:
            raise UserInputError(
                f"the run's {len(distinct)} distinct grammars make {used} automaton states "
                f"together, a table of {G * vocab_size * 4 / 2**20:.0f} MiB, over the bound of "
                f"{MAX_TABLE_BYTES / 2**20:.0f} MiB (lookahead_jax.grammar.MAX_TABLE_BYTES): "
                "run fewer distinct grammars at once"
            )
        self.tokenizer = tokenizer
        self.table = np.full((G, vocab_size), -1, np.int32)
        self.table[FREE] = FREE
        self.chains = np.full((G, CHAIN), -1, np.int32)  # FREE's: none
        self.blocks: dict[int, tuple[int, TokenAutomaton]] = {}  # key -> (offset, automaton)
        self._on_device = None
        for a in distinct.values():  # (G holds them all: each goes in)
            placed = self.place(a, set())
            assert placed

    @classmethod
    def online(cls, states: int, vocab_size: int, tokenizer=None) -> GrammarBank:
        """An online engine's bank: room for `states` automaton states (beside FREE), at
        most what MAX_TABLE_BYTES holds at this vocabulary (~1,360 at 49,152 tokens, ~520
        at 128,256)."""
        return cls([], vocab_size, tokenizer, G=online_rows(states, vocab_size))

    def place(self, a: TokenAutomaton, in_use: set[int]) -> bool:
        """Put `a` in the table unless it is there (first fit after FREE); when no gap
        holds it, the automata whose keys are not `in_use` (no row follows them) are
        dropped first. False: it does not fit beside those in use."""
        key = id(a.next_sv)
        if key in self.blocks:
            return True
        at = self._gap(a.states)
        if at is None:
            for old in [k for k in self.blocks if k not in in_use]:
                off, gone = self.blocks.pop(old)
                self.table[off : off + gone.states] = -1
            at = self._gap(a.states)
            if at is None:
                return False
        block = a.next_sv
        rows = slice(at, at + a.states)
        self.table[rows, : block.shape[1]] = np.where(block >= 0, block + at, -1)
        if self.tokenizer is not None:
            self.chains[rows] = _chains(a, self.tokenizer)
        self.blocks[key] = (at, a)
        self._on_device = None
        return True

    def _gap(self, size: int) -> int | None:
        """The first offset past FREE where `size` rows are free, or None."""
        taken = sorted((off, off + a.states) for off, a in self.blocks.values())
        at = 1
        for start, end in taken:
            if start - at >= size:
                return at
            at = max(at, end)
        return at if self.table.shape[0] - at >= size else None

    @classmethod
    def for_run(cls, encoded, model, lookahead) -> GrammarBank | None:
        """The bank of an offline run's requests (None when no request has a grammar)."""
        automata = [r.grammar for r in encoded if r.grammar is not None]
        if not automata:
            return None
        _one_device(model)
        if lookahead not in (None, "auto") and lookahead.verify_window:
            raise UserInputError(
                "structured output cannot run with verify_window=True (the window's own "
                "paths are not masked by the grammar)"
            )
        return cls(automata, model.lm.vocab_size, model.tokenizer)

    @classmethod
    def for_engine(cls, model, config) -> GrammarBank | None:
        """An online engine's bank (None: grammar_states 0, no grammar served)."""
        if not config.grammar_states:
            return None
        _one_device(model)
        return cls.online(config.grammar_states, model.lm.vocab_size, model.tokenizer)

    @staticmethod
    def check_online(encoded, name: str, states: int, vocab_size: int) -> None:
        """Refuse a request whose grammar an online engine's table cannot hold."""
        a = encoded.grammar
        if states:
            states = online_rows(states, vocab_size) - 1
        if a is None or a.states <= states:
            return
        raise UserInputError(
            f"${{request}}: its grammar makes {a.states} automaton states; this engine holds "
            f"{states} (grammar_states; the server's --grammar-states)"
            if states
            else "${request}: this engine serves no structured output (json_schema, regex): "
            "make it with grammar_states > 0 (the server's --grammar-states)",
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
        """The state a row under `automaton` (placed) starts in (FREE for None)."""
        if automaton is None:
            return FREE
        return self.blocks[id(automaton.next_sv)][0] + automaton.initial


def _one_device(model) -> None:
    if model.mesh is not None:
        raise UserInputError("structured output (json_schema, regex) runs on one device")


def online_rows(states: int, vocab_size: int) -> int:
    """G, the rows of an online table with room for `states` states beside FREE: a
    multiple of ROWS_STEP, at most what MAX_TABLE_BYTES holds at this vocabulary."""
    most = (MAX_TABLE_BYTES // (vocab_size * 4)) // ROWS_STEP * ROWS_STEP
    return min(-(-(states + 1) // ROWS_STEP) * ROWS_STEP, most)


def with_guesses(lookahead, max_context: int):
    """`lookahead` (a LookaheadConfig) with the grammar source on: up to CHAIN tokens a
    step, no deeper than its tree holds (a fixed tree: the chain competes for its nodes;
    without one it adds nodes, so the step is checked against the context again)."""
    length = CHAIN if lookahead.tree is None else max(1, min(CHAIN, lookahead.tree))
    config = dataclasses.replace(lookahead, grammar_guess=length)
    config.check_fits(max_context)
    return config
