"""The engine's device side: the DecodeState of the B slots (R rows of it: below) and the
three verbs of JetStream's engine interface that change it, each one compiled program
(decoding.start / run_loop / run_plain through programs.py; the edits of slot_state.py):

    prefill   `prefill(requests)`: decoding.start on n requests at their longest side
              P' (inputs.prefill_side), [n, P'] (n: slot_state.prefill_rows, padded with
              rows that are done at once; `planner` cuts an admission into prefills:
              prefill_planning.py), or several packed in one ragged pass (prefill_args.ragged):
              their K/V, first tokens and fresh guess sources
    insert    `insert(fresh, slots)`: those n rows written over slots of the R-row state
              in one scatter, every field (a slot's old K/V, tokens, counters and
              guesses all replaced)
    generate  `generate(steps, waiting, plain)`: run_loop (or run_plain: plain steps over
              a lookahead state) over the R rows for at most `steps` steps, or until a
              slot finishes while requests wait

and what goes around them: `read` (fields back to the host, every process's rows),
`grow` (a longer prompt side: the S axis padded), `resize` (the state's rows: a row
bucket, row_buckets.py), `retire_later` (rows the host ended, made done before the next
generate), `to_plain` (auto's hand-over).

Rows: the state holds R <= B rows (`rows`, a row bucket: row_buckets.py), the slots
0 .. R-1; the scheduler keeps every slot it uses below R. Loop programs per R (run_loop,
and with online auto run_plain). Arrays named `_b` here have the state's R rows.

Shapes: S = P + new_positions + slack, where new_positions is the budget side (the
largest max_new_tokens a request may have, rounded up to a power of two) and slack the
widest step's emit. A prompt of side P' <= P is prefilled with room for
S - P' - slack new positions, so its rows have the state's S. Which requests go into
which slots, and when, is the host's (scheduler.py). New programs: a prefill per prompt
side and row count (sides: inputs.prefill_side; a shape not compiled may run padded to
one that is: prefill_shapes.py), a loop and an insert per S (`stats.cache_positions`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import autotune, guess_memory, programs
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.grammar_rows import GrammarRows
from lookahead_jax.decoding.sampling import RowSampling
from lookahead_jax.distributed import sharding
from lookahead_jax.engine import inputs, prefill_args, round_read, slot_state
from lookahead_jax.engine.grammar_bank import GrammarBank
from lookahead_jax.engine.prefill_planning import PrefillPlanner
from lookahead_jax.engine.prefill_shapes import PaddedShapes
from lookahead_jax.engine.requests import Encoded
from lookahead_jax.engine.round_read import RoundRead
from lookahead_jax.engine.stats import Stats
from lookahead_jax.models import kv_pool, seam

_STATIC = ("spec", "bucket")


def recall_program():
    """guess_memory.recall jitted with the prefilled state donated, so that its other
    buffers (the cache) pass through rather than being copied: a copy of 16 rows' cache
    cost ~0.5 s an admission on a 2-core CPU (tests/test_guess_memory.py reads the
    aliasing in its HLO)."""
    return slot_state.program(guess_memory.recall, None, static_argnames=_STATIC, donate_argnums=0)


class DeviceSlots:
    """The B slots on the device: their state (R rows), and the programs for its shapes."""

    def __init__(
        self,
        model,
        batch: int,
        spec: DecodeSpec,
        new_positions: int,
        P: int,
        stats,
        memory=None,
        padded: PaddedShapes | None = None,
        grammars: GrammarBank | None = None,
    ):
        self.model, self.B, self.spec = model, batch, spec
        self.grammars = grammars  # the run's grammars, with spec.grammar (grammar_bank.py)
        self.rows = batch  # rows of the state: a row bucket (resize)
        self.loop_compile_s: list[float] = []  # each loop compile waited for, seconds
        # the guess sources' engine-wide memories (guess_memory.py; a GuessMemory kept by
        # the engine across runs), None: each row's guesses start from nothing
        self.memory = memory
        self.slack = spec.max_emit  # kept after auto's hand-over (to_plain's min_slack)
        self.new_positions = new_positions
        self.stats: Stats = stats  # where its prefills, compiles and shapes count
        # the prefill shapes compiled, and padding spent (an engine's, kept across runs)
        self.padded = PaddedShapes() if padded is None else padded
        self.state: DecodeState | None = None
        # several prompts from scratch may prefill packed in one pass (a ragged prefill:
        # prefill_args.ragged) where the model runs those, on one CPU (on a GPU or TPU its
        # attention's loop, whose trip count only the device knows, would read the
        # predicate back every iteration: attention.attention_block_for)
        on_cpu = jax.devices()[0].platform == "cpu"
        self.ragged = seam.has_ragged(model.lm) and model.mesh is None and on_cpu
        # how an admission is cut into prefills, and of which kind each is
        # (its two callbacks reach the slots weakly: a cycle through them kept the state,
        # 1.2 GB at 1024 rows, alive after a run until Python's cyclic collector ran)
        self.planner = PrefillPlanner(
            self.padded, batch, self.ragged, stats, _weak(self._ready), _weak(self._compile_soon)
        )
        self.to_retire_b = np.zeros((batch,), bool)  # rows to make done before generate [R]
        self._set_shape(P)

    # ------------------------------------------------------------------ shapes, programs

    def _set_shape(self, P: int) -> None:
        """Programs for the state of prompt side P: S = P + new_positions + slack (the
        loop compiled at the next compile_loop_soon or generate, the insert at its first
        use)."""
        self.P = P
        self.padded.at((P, self.new_positions, self.spec))
        # (R, "run_loop" or "run_plain") -> its loop, compiled beside a prefill's program
        self.loops = {}  # (compile_loop_soon)
        shape = programs.state_shape(self.model, self.spec, self.new_positions, self.loop_args())
        mesh = self.model.mesh
        self.state_sh = None if mesh is None else sharding.state_shardings(shape, mesh)
        self._insert = slot_state.program(slot_state.insert, self.state_sh, donate_argnums=0)
        self._retire = slot_state.program(slot_state.retire, self.state_sh, donate_argnums=0)
        self.positions_S = shape.tokens.shape[1]
        self.stats.count_shape(self.positions_S)

    def loop_args(self, rows: int | None = None, side: int | None = None, prefix=None) -> tuple:
        """The start program's argument shapes for a state of `rows` rows (default: B),
        which key its loop (programs.py); side: its prompts' (default: the state's P);
        prefix: a CachedPrefix's shapes (a prefill after cached blocks), RaggedPrompts'
        or SharedPrefix's."""
        R = self.B if rows is None else rows
        rows_of = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct((R, *shape), dtype)  # noqa: E731
        args = (
            self.model.params,
            rows_of(self.P if side is None else side),
            rows_of(),
            rows_of(),
            rows_of(2, dtype=jnp.uint32),
            RowSampling.shaped(R),
        )
        if self.grammars is not None:  # (after the prefix, None without one)
            return (*args, prefix, GrammarRows(rows_of(), self.grammars.shaped()))
        return args if prefix is None else (*args, prefix)

    def grow(self, P: int) -> None:
        """Move to a longer prompt side P: the rows in flight keep decoding in a state
        whose S axis is padded (the new positions lie past every row's end)."""
        self._set_shape(P)
        if self.state is not None:
            grow = slot_state.program(slot_state.grow_positions, self.state_sh, static_argnums=1)
            self.state = grow(self.state, self.positions_S)

    def compile_loop_soon(self, rows: int | None = None) -> None:
        """Start compiling the loop for `rows` rows (default: the state's) and the current
        shapes in the background (beside the prefill's program, which the first round
        compiles in the foreground)."""
        rows = self.rows if rows is None else rows
        if (rows, "run_loop") not in self.loops:
            args = self.loop_args(rows)
            programs.compile_soon(self.model, self.spec, self.new_positions, args, "run_loop")

    def loop_names(self, plain_rounds: bool) -> tuple[str, ...]:
        """The loop programs a run uses: run_loop, and with `plain_rounds` (auto's plain
        rounds over a lookahead state: round_choice.py) run_plain."""
        with_plain = plain_rounds and self.spec.lookahead is not None
        return ("run_loop", "run_plain") if with_plain else ("run_loop",)

    def compile_loops(self, rows_list: list[int], names: tuple[str, ...]) -> None:
        """Compile the loops `names` for each row count of `rows_list` at the current
        shapes, two at a time (every other one in the compile thread, the rest here: XLA
        compiles a program mostly on one core), and wait for them."""
        todo = [(rows, name, self.loop_args(rows)) for rows in rows_list for name in names]
        for _, name, a in todo[1::2]:
            programs.compile_soon(self.model, self.spec, self.new_positions, a, name)
        for rows, name, a in todo:
            self.loops[(rows, name)], _ = self._compiled(self.new_positions, a, name)

    def loop_compiled(self, rows: int) -> bool:
        """Whether the loop for `rows` rows is ready (compiled, not being compiled)."""
        args = self.loop_args(rows)
        return (rows, "run_loop") in self.loops or programs.ready(
            self.model, self.spec, self.new_positions, args, "run_loop"
        )

    def _loop_ready(self, name: str = "run_loop") -> None:
        """The loop `name` for the state's rows, compiled (or waited for:
        compile_loop_soon), its seconds kept in loop_compile_s. A prefill waits for it
        too, so that it runs on quiet cores rather than beside the loop's compile (its
        seconds go to compile_s, where they belong, not prefill_s)."""
        if (self.rows, name) in self.loops:
            return
        args = self.loop_args(self.rows)
        self.loops[(self.rows, name)], secs = self._compiled(self.new_positions, args, name)
        if secs > 0:
            self.loop_compile_s.append(secs)

    def _compiled(self, new_positions: int, args, name: str):
        """(executable, seconds spent compiling it now), those seconds added to the stats."""
        exe, secs = programs.compiled(self.model, self.spec, new_positions, args, name)
        self.stats.count_compile(secs)
        return exe, secs

    # ------------------------------------------------------------------ the three verbs

    def compile_prefill(self, rows: int, side: int, pool=None, wait=True) -> None:
        """Compile the start program of a prefill of (rows, side) — a prompt's, or with
        `pool` (prefill_args.program_pool's value) one after cached blocks, a ragged
        pass or one after shared blocks — or with `wait` False start compiling it in the
        background where that is done (prefill_shapes.py then finds it: `_ready`)."""
        soon = None if wait else self._compile_soon(pool)
        if soon is not None:
            soon(rows, side)
        else:  # known to prefill_shapes.py: a larger shape for smaller ones to pad to
            self._compiled(*self._start_key(rows, side, pool), "start")
            # (its seconds not among the compiles the padding rule averages: they may be
            # a wait for a compile started in the background)
            self.padded.ran(prefill_args.kind_of(pool), rows, side, 0.0)

    def _start_key(self, rows: int, side: int, pool=None) -> tuple:
        """programs.py's (room for new positions, start arguments) of a prefill of this
        shape: a prompt prefill's (side: its prompt side); with `pool` (a program_pool
        value), a prefill after cached blocks, a ragged one (prefill_args.RAGGED) or one
        after shared blocks (prefill_args.SharedPool), whose prompt side is the state's P
        (side: the suffixes', or the pass's tokens)."""
        if pool is None:
            return self.P + self.new_positions - side, self.loop_args(rows, side)
        prefix = prefill_args.prefix_shapes(rows, side, pool, self.P)
        return self.new_positions, self.loop_args(rows, prefix=prefix)

    def _ready(self, pool):
        """ready(rows, side): whether the start program of a prefill of that shape (a
        prompt's, or of the kind `pool` keys: `_start_key`) is compiled (programs.py)."""

        def ready(rows: int, side: int) -> bool:
            key = self._start_key(rows, side, pool)
            return programs.ready(self.model, self.spec, *key, "start")

        return ready

    def _compile_soon(self, pool):
        """compile_soon(rows, side): start compiling the start program of a prefill of
        that shape (as `_ready`'s) in the background (programs.compile_soon; `_ready` then
        tells when it is), or None where that is not done (a mesh)."""
        if self.model.mesh is not None:
            return None

        def compile_soon(rows: int, side: int) -> None:
            key = self._start_key(rows, side, pool)
            programs.compile_soon(self.model, self.spec, *key, "start")

        return compile_soon

    def prefill(
        self,
        requests: list[Encoded],
        hits: list[list[int]] | None = None,
        pool: kv_pool.KVPool | None = None,
        ragged: bool | None = None,
    ) -> DecodeState:
        """One prefill of the requests at their longest side (inputs.prefill_side), padded
        to `prefill_rows` rows (a padding row has max_new_tokens 0: done at once). hits:
        each request's cached leading blocks, pool ids into `pool` (prefix_cache.py): only
        the rest of its prompt runs, at the state's prompt side P. Several without hits
        may run packed in one ragged pass (side: all their tokens): where `ragged` says
        so, or (None) where the planner decides so; several with hits, where `ragged`
        says so, packed after the blocks they share (prefill_args.shared). Any may run
        at a larger shape already compiled, padded (prefill_shapes.py)."""
        # the prompts' sides, or the suffixes' past the blocks
        kind, sides, key_pool, rate, ready = self.planner.planning(requests, hits, pool, ragged)
        n = slot_state.prefill_rows(len(requests), self.B)
        n, side = self.padded.choose(kind, n, max(sides), rate, ready, self._compile_soon(key_pool))
        P = side if kind == "prompt" else self.P
        rows = prefill_args.rows(requests, n, P, self.model.mesh)
        if kind == prefill_args.SHARED:
            rows = (*rows, prefill_args.shared(requests, hits, pool, n, side, P))
        elif hits is not None:
            rows = (*rows, prefill_args.cached_prefix(P, requests, hits, pool, n, side))
        elif kind == prefill_args.RAGGED:
            rows = (*rows, prefill_args.ragged(requests, n, side))
        if self.grammars is not None:  # (after the prefix: None without one)
            rows = (*rows, *([None] if kind == "prompt" else []))
            rows = (*rows, prefill_args.grammar_rows(requests, n, self.grammars))
        args = (self.model.params, *rows)
        # (the prompts' own buckets, whatever shape they ran at)
        buckets = [inputs.bucket(len(r.ids)) for r in requests]
        self.stats.count_prefill(n, side, kind, self.padded.positions(kind, n, side), buckets)
        # room for the new positions that gives rows of this prompt side the state's S
        start, compile_s = self._compiled(self.P + self.new_positions - P, args, "start")
        self.padded.ran(kind, n, side, compile_s)
        self._loop_ready()
        fresh = start(*args)
        if self.memory is not None and self.spec.lookahead is not None:
            recall = recall_program()
            fresh = recall(fresh, self.memory.of(self.spec), spec=self.spec, bucket=P)
        return fresh

    def remember(self, slots: list[int]) -> None:
        """Fold the rows `slots` (ended, not yet refilled) into the guess sources'
        memories."""
        if self.memory is None or self.spec.lookahead is None:
            return
        rows_b = np.zeros((self.rows,), bool)
        rows_b[slots] = True
        fold = slot_state.program(guess_memory.remember, None, static_argnames=("spec",))
        self.memory.store(
            self.spec, fold(self.memory.of(self.spec), self.state, rows_b, spec=self.spec)
        )

    def insert(self, fresh: DecodeState, slots: list[int]) -> None:
        """Write the prefilled rows `fresh` over `slots` (its first len(slots) rows; the
        rest are padding, dropped; every slot below `rows`). Into an engine with no state
        yet, a prefill of all R rows, slots in order, is the state (its padding rows are
        done); anything else starts from R done rows."""
        n = fresh.done.shape[0]
        assert max(slots) < self.rows, (slots, self.rows)
        if self.state is None and list(slots) == list(range(len(slots))) and n == self.rows:
            self.state = fresh
            return
        if self.state is None:
            sh = self.state_sh if self.rows == self.B else None
            empty = slot_state.program(slot_state.empty_slots, sh, static_argnums=1)
            self.state = empty(fresh, self.rows)
        slots_n = np.full((n,), self.rows, np.int32)  # padding: dropped
        slots_n[: len(slots)] = slots
        self.state = self._insert(self.state, fresh, slots_n)
        self.to_retire_b[list(slots)] = False

    def generate(self, steps_per_call: int, waiting: bool, plain: bool = False) -> float:
        """Run the decode loop on every slot not done, for at most `steps_per_call` steps,
        or until a slot finishes if `waiting` (requests wait for a slot); rows the host
        ended are made done first. plain: plain steps over the lookahead state (auto's
        choice for this round: round_choice.py). Returns the loop's own seconds (waited
        for): not the retire before it, nor a compile of either (a step's cost, as
        round_choice measures it)."""
        if self.to_retire_b.any():
            self.state = self._retire(self.state, self.to_retire_b)
            self.to_retire_b[:] = False
        name = "run_plain" if plain and self.spec.lookahead is not None else "run_loop"
        self._loop_ready(name)
        steps = jnp.int32(steps_per_call)
        loop = self.loops[(self.rows, name)]
        jax.block_until_ready(self.state)
        t = time.perf_counter()
        self.state = loop(self.model.params, self.state, steps, jnp.bool_(waiting))
        jax.block_until_ready(self.state)
        return time.perf_counter() - t

    def resize(self, order: list[int], rows: int) -> None:
        """The state's rows become the slots `order` (rows of the current state, in their
        new order: slot order[i] is now slot i), then done rows up to `rows` (a row
        bucket). One copy of the rows kept (slot_state.take_rows); nothing to do when
        the state is already so."""
        if rows == self.rows and list(order) == list(range(rows)):
            return
        assert len(order) <= rows <= self.B
        if self.state is None:
            self.to_retire_b, self.rows = np.zeros((rows,), bool), rows
            return
        assert self.model.mesh is None  # (take_rows has no shardings)
        index_r = np.zeros((rows,), np.int32)
        keep_r = np.zeros((rows,), bool)
        index_r[: len(order)], keep_r[: len(order)] = order, True
        take = slot_state.program(slot_state.take_rows, None)
        self.state = take(self.state, index_r, keep_r)
        retire_r = np.zeros((rows,), bool)
        retire_r[: len(order)] = self.to_retire_b[list(order)]
        self.to_retire_b, self.rows = retire_r, rows

    def warm_rows(self, rows_list: list[int], store: Callable | None = None) -> None:
        """Run once the small programs a round runs around its loop, each compiled per
        state shape, at B and each smaller row bucket of rows_list: the state's gather to
        the next smaller bucket, and to each from B and back (take_rows), the retire of
        ended rows (retiring none), the read-back and, `store(state)` given, a store of
        blocks that stores none (cached_prefill.store_blocks). A server's warm-up: as
        requests end and the state shrinks bucket by bucket, each compiled inside some
        round (0.3-0.8 s each; a 2-core Intel Xeon). (Not warmed: an insert per prefill
        shape, growth from one bucket to the next.) The state's rows are garbage after
        it; it ends at B rows."""
        if self.state is None or self.model.mesh is not None:  # (take_rows: no shardings)
            return
        smaller = sorted((r for r in rows_list if r < self.B), reverse=True)
        for rows in [self.B, *smaller]:  # B, then down bucket by bucket
            if rows != self.rows:
                self.resize([0], rows)
            self.state = self._retire(self.state, np.zeros((rows,), bool))
            self.read_round()
            if store is not None:
                store(self.state)
        for rows in smaller:  # each from B (the first from 1) and back
            self.resize([0], rows)
            self.resize([0], self.B)
        jax.block_until_ready(self.state)

    # ------------------------------------------------------------------ around them

    def read_round(self) -> RoundRead:
        """Every row's tokens and counts on the host, every process's rows, in one
        transfer (round_read.py)."""
        return round_read.read(self.state)

    def has_work(self, done_b: np.ndarray) -> bool:
        """Whether a generate would decode anything: some slot is neither done (`done_b`,
        a RoundRead's) nor to be retired."""
        return not (done_b | self.to_retire_b).all()

    def retire_later(self, slot: int) -> None:
        """Make `slot` done before the next generate (the host ended its request)."""
        self.to_retire_b[slot] = True

    def to_plain(self) -> None:
        """auto's hand-over: the same rows decode on without guess sources (plain
        programs; buffers keep their sizes)."""
        self.spec = dataclasses.replace(self.spec, lookahead=None, min_slack=self.slack)
        self._set_shape(self.P)
        self.state = autotune.to_plain(self.state)
        if self.state_sh is not None:
            self.state = jax.device_put(self.state, self.state_sh)


def _weak(method: Callable) -> Callable:
    """`method`, called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)
