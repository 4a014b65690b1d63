"""`GrammarBank`: the grammars of one run's rows in the one set of tables its programs
read (decoding/grammar_rows.py). State row 0 is FREE (every token allowed, leading back
to it: the rows with no grammar); each distinct automaton (grammar/automaton.py) follows
at an offset, its states and next states shifted by it, its forbidden classes still -1,
and takes a class map of its own (its tokens' classes; map 0 is FREE's).

The tables' shapes are the programs' (an offline run's: powers of two, at least
MIN_SHAPE, so that one compiled decode loop serves most grammars: one `lj.generate` a
schema does not compile a loop a schema; an online engine's: fixed, online_shape).

Worked example: automata A (3 states, 40 classes) and B (2 states, 90 classes) over V
tokens make tables of 1 + 3 + 2 = 6 state rows padded to G = 1,024, C = 256 class columns
and M = 3 class maps padded to 4: A at offset 1 with map 1, B at 4 with map 2; a row
under B starts in state 4 + B.initial, A's next_sc[s, c] = t becomes next_gc[1 + s, c] =
1 + t, kind_g[1:4] = 1 and class_mv[1] = A.class_v.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from lookahead_jax.decoding.grammar_rows import FREE, GrammarTables
from lookahead_jax.errors import UserInputError
from lookahead_jax.grammar import MAX_TABLE_BYTES, TokenAutomaton, fixed_text

MIN_SHAPE = (1024, 256, 4)  # an offline run's least (G, C, M): 1 MiB of states and 0.75
# of class maps at 49,152 tokens (22 schemas measured: 32-1,558 states, 28-212 classes)
ROWS_STEP = 16  # an online engine's G is a multiple of this
ONLINE_CLASSES = 1024  # an online engine's class columns (schemas measured: 100-200)
ONLINE_MAPS = 16  # an online engine's class maps: distinct grammars in flight at once, + FREE
CHAIN = 8  # tokens of fixed text guessed from a state (grammar/fixed_text.py)
_CHAINS: dict = {}  # id(automaton.next_sc) -> (its arrays, chains [S, CHAIN]): made once


def chains_of(a: TokenAutomaton, tokenizer) -> tuple[np.ndarray, float]:
    """(the automaton's fixed-text guesses from every state [S, CHAIN], seconds making
    them took: 0.0 when kept from before). 0.4-1.2 s for the benchmark's schemas at
    SmolLM2's vocabulary: requests.encode makes them as a grammar is compiled, on the
    submitting thread, so that placing it (on the engine's) finds them kept."""
    known = _CHAINS.get(id(a.next_sc))
    if known is not None and known[0] is a.next_sc:
        return known[1], 0.0
    if len(_CHAINS) > 64:
        _CHAINS.clear()

    def encode(text: bytes) -> list[int]:
        return tokenizer.encode(text.decode("utf-8", "ignore"), add_special_tokens=False)

    t = time.perf_counter()
    chains = fixed_text.chains(a, tokenizer.token_bytes(), encode, CHAIN)
    _CHAINS[id(a.next_sc)] = (a.next_sc, chains)
    return chains, time.perf_counter() - t


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def _octave(n: int, least: int) -> int:
    """The smallest power of two >= n, at least `least`."""
    return max(least, 1 << max(n - 1, 0).bit_length())


class GrammarBank:
    """The automata of a run, placed (module docstring): `next_gc` [G, C], `kind_g` [G],
    `class_mv` [M, V] and `chains` [G, CHAIN], int32 on the host."""

    def __init__(self, automata: list[TokenAutomaton], vocab_size: int, tokenizer=None, shape=None):
        """The bank of `automata` (an offline run's), or with `shape` (G, C, M) an online
        engine's, empty until `place` puts automata in."""
        distinct: dict[int, TokenAutomaton] = {}
        for a in automata:
            distinct.setdefault(id(a.next_sc), a)  # (the compile cache shares arrays)
        used = 1 + sum(a.states for a in distinct.values())
        widest = max((a.classes for a in distinct.values()), default=1)
        needed = (used, widest, 1 + len(distinct))
        G, C, M = shape or (_octave(n, least) for n, least in zip(needed, MIN_SHAPE, strict=True))
        if table_bytes(G, C, M, vocab_size) > MAX_TABLE_BYTES:  # large ones: a close fit
            G, C, M = _up(used, ROWS_STEP), _up(widest, ROWS_STEP), needed[2]
        nbytes = table_bytes(G, C, M, vocab_size)
        if nbytes > MAX_TABLE_BYTES * max(1, len(distinct)):  # (each grammar within it)
            raise UserInputError(
                f"the run's {len(distinct)} distinct grammars make {used} automaton states "
                f"together, tables of {nbytes / 2**20:.0f} MiB, over {len(distinct)} x the "
                f"bound of {MAX_TABLE_BYTES / 2**20:.0f} MiB "
                "(lookahead_jax.grammar.MAX_TABLE_BYTES): run fewer distinct grammars at once"
            )
        self.tokenizer = tokenizer
        self.next_gc = np.full((G, C), -1, np.int32)
        self.next_gc[FREE, 0] = FREE
        self.kind_g = np.zeros((G,), np.int32)
        self.class_mv = np.zeros((M, vocab_size), np.int32)
        self.chains = np.full((G, CHAIN), -1, np.int32)  # FREE's: none
        # key -> (offset, class map, automaton)
        self.blocks: dict[int, tuple[int, int, TokenAutomaton]] = {}
        self._on_device = None
        for a in distinct.values():  # (the shape holds them all: each goes in)
            placed = self.place(a, set())
            assert placed

    @classmethod
    def online(cls, states: int, vocab_size: int, tokenizer=None) -> GrammarBank:
        """An online engine's bank: room for `states` automaton states (beside FREE) of
        grammars of up to ONLINE_CLASSES classes, ONLINE_MAPS - 1 of them at once."""
        return cls([], vocab_size, tokenizer, shape=online_shape(states))

    def place(self, a: TokenAutomaton, in_use: set[int]) -> bool:
        """Put `a` in the tables unless it is there (first fit after FREE, and a free class
        map); when there is no room, the automata whose keys are not `in_use` (no row
        follows them) are dropped first. False: it does not fit beside those in use."""
        key = id(a.next_sc)
        if key in self.blocks:
            return True
        if a.classes > self.next_gc.shape[1]:
            return False
        at, m = self._gap(a.states), self._free_map()
        if at is None or m is None:
            for old in [other for other in self.blocks if other not in in_use]:
                off, _, gone = self.blocks.pop(old)
                self.next_gc[off : off + gone.states] = -1
                self.kind_g[off : off + gone.states] = 0
            at, m = self._gap(a.states), self._free_map()
            if at is None or m is None:
                return False
        rows = slice(at, at + a.states)
        self.next_gc[rows] = -1
        self.next_gc[rows, : a.classes] = np.where(a.next_sc >= 0, a.next_sc + at, -1)
        self.kind_g[rows] = m
        self.class_mv[m] = a.class_v
        if self.tokenizer is not None:
            self.chains[rows] = chains_of(a, self.tokenizer)[0]
        self.blocks[key] = (at, m, a)
        self._on_device = None
        return True

    def place_requests(self, taken: list, held: list, count) -> tuple[list, list]:
        """(the requests of `taken` whose grammars this bank holds now, placed, each
        placed one's compile seconds given to `count`; the others, to wait): `held` are
        the requests in the slots, whose grammars stay (`place`)."""
        in_use = {id(r.grammar.next_sc) for r in held if r.grammar is not None}
        fits, back = [], []
        for r in taken:
            if r.grammar is None or self.place(r.grammar, in_use):
                fits.append(r)
                if r.grammar is not None:
                    in_use.add(id(r.grammar.next_sc))
                    count(r.grammar.compile_s)
            else:
                back.append(r)
        return fits, back

    def _gap(self, size: int) -> int | None:
        """The first offset past FREE where `size` rows are free, or None."""
        taken = sorted((off, off + a.states) for off, _, a in self.blocks.values())
        at = 1
        for start, end in taken:
            if start - at >= size:
                return at
            at = max(at, end)
        return at if self.next_gc.shape[0] - at >= size else None

    def _free_map(self) -> int | None:
        """A class map no placed automaton holds (past FREE's 0), or None."""
        used = {m for _, m, _ in self.blocks.values()}
        return next((m for m in range(1, self.class_mv.shape[0]) if m not in used), None)

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
    def check_online(encoded, name: str, states: int) -> None:
        """Refuse a request whose grammar an online engine's tables cannot hold."""
        a = encoded.grammar
        room = online_shape(states)[0] - 1
        if a is None or (states and a.states <= room and a.classes <= ONLINE_CLASSES):
            return
        if not states:
            raise UserInputError(
                "${request}: this engine serves no structured output (json_schema, regex): "
                "make it with grammar_states > 0 (the server's --grammar-states)",
                "json_schema",
                request=name,
            )
        raise UserInputError(
            f"${{request}}: its grammar makes {a.states} automaton states of {a.classes} token "
            f"classes; this engine holds {room} states (grammar_states; "
            f"the server's --grammar-states) of at most {ONLINE_CLASSES} classes",
            "json_schema",
            request=name,
        )

    def _host(self) -> GrammarTables:
        return GrammarTables(self.next_gc, self.kind_g, self.class_mv, self.chains)

    def on_device(self) -> GrammarTables:
        """The tables as device arrays, put there once (a prefill passes them)."""
        if self._on_device is None:
            import jax
            import jax.numpy as jnp

            self._on_device = jax.tree.map(jnp.asarray, self._host())
        return self._on_device

    def shaped(self) -> GrammarTables:
        """The tables' shapes (a program's arguments, compiled before a prefill)."""
        import jax

        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self._host())

    def initial_state(self, automaton: TokenAutomaton | None) -> int:
        """The state a row under `automaton` (placed) starts in (FREE for None)."""
        if automaton is None:
            return FREE
        return self.blocks[id(automaton.next_sc)][0] + automaton.initial


def _one_device(model) -> None:
    if model.mesh is not None:
        raise UserInputError("structured output (json_schema, regex) runs on one device")


def table_bytes(G: int, C: int, M: int, vocab_size: int) -> int:
    """The bytes of a bank's tables (next_gc, class_mv, kind_g and the chains)."""
    return 4 * (G * C + M * vocab_size + G + G * CHAIN)


def online_shape(states: int) -> tuple[int, int, int]:
    """(G, C, M): an online bank's tables with room for `states` states beside FREE (a
    multiple of ROWS_STEP rows), ONLINE_CLASSES columns, ONLINE_MAPS class maps. 4,096
    states take 16 MiB, the maps 3 MiB at SmolLM2's 49,152 tokens (8 MiB at 128k)."""
    return _up(states + 1, ROWS_STEP), ONLINE_CLASSES, ONLINE_MAPS


def with_guesses(lookahead, max_context: int):
    """`lookahead` (a LookaheadConfig) with the grammar source on: up to CHAIN tokens a
    step, no deeper than its tree holds (a fixed tree: the chain competes for its nodes;
    without one it adds nodes, so the step is checked against the context again)."""
    length = CHAIN if lookahead.tree is None else max(1, min(CHAIN, lookahead.tree))
    config = dataclasses.replace(lookahead, grammar_guess=length)
    config.check_fits(max_context)
    return config
