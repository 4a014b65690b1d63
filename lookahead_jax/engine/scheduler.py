"""The engine's host side: which request sits in which slot, and a round of the slots.

A round (`advance`) admits waiting requests into free slots (a prefill and an insert per
group of them, groups cut to pad least: prefill_shapes.py), runs the decode loop
once over the state's rows (a row bucket that holds the live slots, gathered into the
first rows when it shrinks: row_buckets.py) — online with auto, its layout or plain
steps, whichever the live rows decode faster (round_choice.py) — then reads every slot
back: each request's listener gets the tokens committed since its last update, a stop
string ends its request, a cancelled one ends, and a finished slot is freed. A slot's life:

    empty (done) --insert--> decoding --EOS, max_new_tokens, stop string or cancel-->
        done --result read--> refilled

The device is seen only between rounds; Ctrl-C is held during one (`held_advance`), so
that an interrupt finds host and device agreeing.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import autotune
from lookahead_jax.decoding.decode_state import DecodeSpec
from lookahead_jax.decoding.guess_memory import GuessMemory
from lookahead_jax.distributed import multihost
from lookahead_jax.engine import grammar_bank, inputs, interrupts
from lookahead_jax.engine.cached_prefill import CachedPrefill
from lookahead_jax.engine.config import EngineConfig
from lookahead_jax.engine.device_slots import DeviceSlots
from lookahead_jax.engine.grammar_bank import GrammarBank
from lookahead_jax.engine.logprob_window import LogprobWindow
from lookahead_jax.engine.prefill_shapes import PaddedShapes
from lookahead_jax.engine.prefix_cache import PrefixCache
from lookahead_jax.engine.requests import Encoded, Result, TokenLogprob, Update
from lookahead_jax.engine.round_choice import RoundChoice, RowAcceptance, RowRound
from lookahead_jax.engine.round_read import RoundRead
from lookahead_jax.engine.row_buckets import RowBuckets
from lookahead_jax.engine.row_counts import RowCounts
from lookahead_jax.engine.stats import RunConfig, Stats
from lookahead_jax.engine.stop_strings import before_stop, find_stop
from lookahead_jax.guesses.lookahead_config import max_step_tokens


@dataclasses.dataclass
class Active:
    """A request in a slot: when it went in and how many of its tokens its listener has."""

    request: Encoded
    inserted: float
    sent: int = 0
    stop_checked: int = 0  # its first tokens known to hold no stop string
    chunking: bool = False  # its prompt is being prefilled in chunks (cached_prefill.py)
    chunked_tokens: int = 0  # ... of which this many so far
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)  # of its first tokens
    prompt_logprobs: list[TokenLogprob | None] | None = None  # read at its first collect
    # its tokens per lookahead step so far (online auto's choice: round_choice.py)
    acceptance: RowAcceptance = dataclasses.field(default_factory=RowAcceptance)


@dataclasses.dataclass(frozen=True)
class Kept:
    """What an engine keeps across its runs, handed to each run's scheduler: the guess
    sources' memory (used with shared_guesses), the prefill shapes compiled and the
    padding spent for want of others (prefill_shapes.py), the prefix cache (or None)."""

    guess_memory: GuessMemory
    prefill_shapes: PaddedShapes
    prefix_cache: PrefixCache | None


class Scheduler:
    """The B slots of one run (offline) or of an online engine until a failure: the
    queue, the requests in the slots, and the rounds that move them."""

    def __init__(
        self,
        model,
        config: EngineConfig,
        kept: Kept,
        stats: Stats,
        sampled: bool,
        logprobs: int | None,
        new_positions: int,
        P: int,
        per_round: bool = False,
        grammars: GrammarBank | None = None,
    ):
        """config: the engine's settings; kept: what the engine keeps across its runs
        (its guess memory, prefill shapes and prefix cache); stats: where the rounds
        count. per_round: auto chooses lookahead or plain steps each round
        (round_choice.py; online), with the layout chosen for one row at the engine's
        temperature; else once, for the batch, handing over to plain mid-run if it does
        not pay."""
        self.started = time.perf_counter()
        self.config, self.model, self.B = config, model, config.batch
        self.stats = stats
        self.queue: collections.deque[Encoded] = collections.deque()
        self.dequeued = 0  # requests that left `queue`: admitted or cancelled
        self.active: list[Active | None] = [None] * self.B
        self.after_collect: Callable[[], None] | None = None  # called after each read-back
        # online: moves what was submitted since the round began into `queue` (_admit)
        self.arrivals: Callable[[], None] | None = None
        self.handed_back = 0  # requests the last admission handed back to the queue
        self.cancelled: set[int] = set()  # slots whose requests were cancelled
        auto, lookahead = None, config.lookahead
        if lookahead == "auto":
            limit = max_step_tokens(model.lm.max_context)
            if per_round:  # the load where lookahead pays most; each round judges the rest
                auto = autotune.AutoRun(model, config.sampling, limit, batch=1, guard=False)
            else:
                auto = autotune.AutoRun(model, config.sampling, limit, batch=self.B)
            lookahead = auto.config
        if grammars is not None and lookahead is not None and not lookahead.grammar_guess:
            lookahead = grammar_bank.with_guesses(lookahead, model.lm.max_context)
        spec = DecodeSpec(
            lm=model.lm,
            eos_ids=tuple(model.eos_ids),
            sampled=sampled,
            lookahead=lookahead,
            cache_dtype=jnp.dtype(model.dtype).name,
            logprobs=logprobs,
            grammar=grammars is not None,
        )
        memory = kept.guess_memory if config.shared_guesses else None
        self.device = DeviceSlots(
            model, self.B, spec, new_positions, P, self.stats, memory, kept.prefill_shapes,
            grammars,
        )  # fmt: skip
        cache = kept.prefix_cache
        self.prefix = None
        if cache is not None:
            chunk = config.prefill_chunk
            self.prefix = CachedPrefill(self.device, stats, model.params, cache, chunk)
        self.counts = RowCounts(self.device, auto, self.stats)
        # row buckets need every state edit on one device (take_rows has no shardings);
        # both rules time this process's rounds, so with several processes (which must
        # run the same programs each round) they are off, as auto's guard is
        multi = multihost.is_multiprocess()
        one_device = model.mesh is None and not multi
        self.buckets = RowBuckets(self.B, config.row_buckets if one_device else False)
        self.round_choice = None
        if per_round and lookahead is not None and auto is not None and not multi:
            self.round_choice = RoundChoice(prior=auto.choice.expected_compression)
        choice = None if auto is None else auto.choice
        self.stats.begin(RunConfig(lookahead, spec.cache_dtype, sampled, config.sampling, choice))

    @property
    def auto(self) -> autotune.AutoRun | None:
        return self.counts.auto

    def busy(self) -> bool:
        return bool(self.queue) or any(x is not None for x in self.active)

    def occupied(self) -> list[int]:
        """Slots whose requests decode (a request prefilled in chunks is not yet)."""
        return [s for s, a in enumerate(self.active) if a is not None and not a.chunking]

    # ------------------------------------------------------------------ rounds

    def held_advance(self) -> tuple[list[Result], bool]:
        """`advance` with Ctrl-C held (interrupts.py): (its results, whether Ctrl-C came)."""
        with interrupts.held() as ctrl_c:
            results = self.advance()
        return results, ctrl_c.pressed

    def advance(self) -> list[Result]:
        """One round: admit, decode, read back; returns the requests that finished."""
        stats, device = self.stats, self.device
        finished = self._admit()
        if not self.occupied() and not self.cancelled:  # (a chunked request may be)
            return finished
        before = device.read_round()
        if device.has_work(before.done_b):
            live = self._fit_rows()
            choice, plain, probe = self.round_choice, False, False
            steps = self._steps_per_call()
            if choice is not None:  # (rows to retire stop before the loop runs)
                if device.rows != len(before.done_b):  # the rows moved (a smaller bucket)
                    before = device.read_round()
                decoding = np.flatnonzero(~before.done_b & ~device.to_retire_b)
                actives = [self.active[s] for s in decoding]  # (as auto's choice sees them)
                rows = [RowRound(a.request.sampling.greedy, a.acceptance) for a in actives]
                plain, probe = choice.choose(device.rows, rows)
                steps = 1 if probe else steps
            t, compile_s = time.perf_counter(), stats.compile_s
            loop_s = device.generate(steps, waiting=bool(self.queue), plain=plain)
            seconds = time.perf_counter() - t - (stats.compile_s - compile_s)
            stats.count_round(device.rows, seconds)
            self.buckets.ran(live, device.rows, seconds)
            after = device.read_round()
            if choice is not None:
                for r, s in zip(rows, decoding, strict=True):
                    r.tokens = int(after.n_out_b[s] - before.n_out_b[s])
                    r.steps = int(after.steps_b[s] - before.steps_b[s])
                choice.ran(device.rows, plain, loop_s, rows, probe)
                stats.count_auto_rounds(choice.describe())
            if self.counts.watch(self.occupied(), after):  # handed over: counts afresh
                after = device.read_round()
            return finished + self._collect(after)
        return finished + self._collect(before)

    def _admit(self) -> list[Result]:
        """Admit waiting requests (`_fill`; each admission's first tokens go out as it
        ends), then before the round decodes those it handed back, and what came in while
        it ran (`arrivals`) where slots are free and as many wait as rows decode."""
        stats, finished, first = self.stats, [], True
        while True:
            t, compile_s, chunks = time.perf_counter(), stats.compile_s, stats.prefill_chunks
            admitted, first = self._fill(chunk=first), False  # (one chunk a round)
            if admitted or stats.prefill_chunks > chunks:  # (a chunk: cached_prefill.py)
                jax.block_until_ready(self.device.state if admitted else self.prefix.cache.pool)
                stats.count_prefill_time(time.perf_counter() - t - (stats.compile_s - compile_s))
                if any(a.request.listener for a in admitted):
                    finished += self._collect()  # the first tokens (the prefill's) go out now
            if not (admitted or self.handed_back) or self.arrivals is None:
                return finished
            self.arrivals()
            free = None in self.active and len(self.queue) >= len(self.occupied())
            if not (free or self.handed_back):
                return finished

    def _rows_for(self, n: int) -> int:
        """The row bucket to hold slots 0 .. n-1 at (row_buckets.py)."""
        device = self.device
        return self.buckets.choose(n, device.loop_compiled, device.loop_compile_s)

    def _fit_rows(self) -> int:
        """Before a decode round: gather the live slots into the first rows of a smaller
        row bucket when one holds them (the requests move with their rows: slot order[i]
        becomes slot i); returns how many slots are live."""
        live = [s for s, a in enumerate(self.active) if a is not None]
        rows = self._rows_for(len(live))
        if rows < self.device.rows:
            self.device.resize(live, rows)
            self.active = [self.active[s] for s in live] + [None] * (self.B - len(live))
            self.cancelled = {live.index(s) for s in self.cancelled if s in live}
        return len(live)

    def _steps_per_call(self) -> int:
        """Steps the next loop call may run (EngineConfig.steps_per_round)."""
        streaming = any(x is not None and x.request.streams for x in self.active)
        auto_steps = None if self.auto is None else self.auto.steps_per_call
        return self.config.steps_per_round(streaming, auto_steps, self.device.new_positions + 1)

    def _fill(self, chunk: bool = True) -> list[Active]:
        """Prefill the queue's next requests into the free slots: a prefill and an insert
        per group of them (prefill_planning.prefill_groups); `chunk`: one chunk may run."""
        device, self.handed_back = self.device, 0
        free = [s for s in range(self.B) if self.active[s] is None]
        taken = [self.queue.popleft() for _ in range(min(len(free), len(self.queue)))]
        taken = self._placed(taken)
        self.dequeued += len(taken)
        ready = []  # [(slot, Active)]: chunked requests whose rest now fits one chunk
        if self.prefix is not None and chunk:
            ready = self.prefix.chunk(self.active, self.cancelled)
        if not taken and not ready:
            return []
        longest = max(inputs.bucket(len(r.ids)) for r in [*taken, *(a.request for _, a in ready)])
        if longest > device.P:
            device.grow(longest)
        used = [s for s, a in enumerate(self.active) if a is not None] + free[: len(taken)]
        rows = self._rows_for(max(used) + 1)
        if device.state is None:
            device.resize([], rows)
        elif rows > device.rows:  # more rows for the admitted: padded with done ones
            device.resize(list(range(device.rows)), rows)
        device.compile_loop_soon()
        now = time.perf_counter()
        admitted = []
        for s, r in zip(free, taken, strict=False):  # active before any device call, so
            self.active[s] = Active(r, now)  # that a failing one fails them too (_fail_all)
            admitted.append(self.active[s])
        if self.prefix is not None:
            placed = [(s, a.request) for s, a in ready] + list(zip(free, taken, strict=False))
            back = self.prefix.admit(placed, self.active, defer=self.arrivals is not None)
            self.queue.extendleft(reversed([r for _, r in back]))  # (admitted again: _admit)
            self.dequeued, self.handed_back = self.dequeued - len(back), len(back)
            kept = {id(a) for a in self.active}
            return [a for a in admitted if not a.chunking and id(a) in kept] + [a for _, a in ready]
        # taken[i] goes to free[i]; a group of all B rows into no state is the state
        for group, ragged in device.planner.prefill_groups(taken):
            fresh = device.prefill([taken[i] for i in group], ragged=ragged)
            device.insert(fresh, [free[i] for i in group])
        return admitted

    def _placed(self, taken: list[Encoded]) -> list[Encoded]:
        """The requests whose grammars the bank (grammar_bank.py) holds, placed now and counted
        (those no row follows dropped if need be); the others wait at the queue's front."""
        bank = self.device.grammars
        if bank is None or all(r.grammar is None for r in taken):
            return taken
        held = [a.request for a in self.active if a is not None]
        fits, back = bank.place_requests(taken, held, self.stats.count_grammar)
        self.queue.extendleft(reversed(back))
        return fits

    def cancel(self, request_id) -> Result | None:
        """End a request with "cancelled": a waiting one now (its Result returned), a
        decoding one at the next `_collect`."""
        for r in list(self.queue):
            if r.id == request_id:
                self.queue.remove(r)
                self.dequeued += 1
                return self._deliver(Active(r, time.perf_counter()), [], [], "cancelled", 0, 0)
        for s, a in enumerate(self.active):
            if a is not None and a.request.id == request_id:
                self.cancelled.add(s)  # ended by the next _collect
        return None

    # ------------------------------------------------------------------ read-back

    def _collect(self, read: RoundRead | None = None, end_all: str | None = None) -> list[Result]:
        """Read every slot back (`read`: the round's RoundRead, if read already): send
        each listener its new tokens, end the requests that are done (EOS,
        max_new_tokens), hit a stop string or were cancelled, free their slots. end_all:
        end every request in a slot with this finish, as a cancel."""
        read = read or self.device.read_round()
        tokens_bs, step_of_bs, prompt_len_b = read.tokens_bs, read.step_of_bs, read.prompt_len_b
        n_out_b, max_new_b, done_b = read.n_out_b, read.max_new_b, read.done_b
        kept = self._read_logprobs(prompt_len_b, n_out_b)
        cancelled, self.cancelled = self.cancelled, set()
        finished, ended = [], []
        for s, a in enumerate(self.active):
            if a is None:
                continue
            if a.chunking:  # nothing on the device yet; ended only by a cancel
                if end_all is not None or s in cancelled:
                    self.active[s] = None  # its row holds nothing of it: no count, no retire
                    finished.append(self._deliver(a, [], [], end_all or "cancelled", 0, 0))
                continue
            new = tokens_bs[s, prompt_len_b[s] : prompt_len_b[s] + n_out_b[s]].tolist()
            if a.request.prompt_logprobs is not None and a.prompt_logprobs is None:
                n = len(a.request.ids)  # position 0 follows nothing
                a.prompt_logprobs = [None, *kept.at(s, 1, n, a.request.prompt_logprobs)]
            if a.request.logprobs is not None:
                start = prompt_len_b[s]
                a.logprobs += kept.at(
                    s, start + len(a.logprobs), start + len(new), a.request.logprobs
                )
            logprobs = a.logprobs if a.request.logprobs is not None else None
            finish, cut = None, new
            if end_all is not None or s in cancelled:
                finish = end_all or "cancelled"
            elif a.request.stop:
                finish, cut = self._stop(a, new)
            if finish is None and done_b[s]:
                finish = "length" if n_out_b[s] >= max_new_b[s] else "eos"
            if finish is None:
                if a.request.listener is not None and len(new) > a.sent:
                    since = None if logprobs is None else logprobs[a.sent : len(new)]
                    prompt = a.prompt_logprobs if a.sent == 0 else None
                    update = Update(a.request.id, new[a.sent :], None, since, prompt)
                    a.request.listener(update)
                    a.sent = len(new)
                continue
            ended.append(s)
            # a row the device still decodes (cancelled, stopped) is retired before the
            # next loop call; so is a done row that sampled, so that a batch left with
            # greedy rows skips the sampling work (slot_state.retire)
            if not done_b[s] or not a.request.sampling.greedy:
                self.device.retire_later(s)
            step_of_token = step_of_bs[s, prompt_len_b[s] : prompt_len_b[s] + len(cut)].tolist()
            eos = None
            if finish == "eos" and logprobs is not None:  # the EOS sits after the new tokens
                end = prompt_len_b[s] + n_out_b[s]
                eos = (int(tokens_bs[s, end]), kept.at(s, end, end + 1, a.request.logprobs)[0])
            # the tokens its steps emitted: all but the prefill's first, and an EOS a step
            # emitted (not counted in n_out)
            n = int(n_out_b[s])
            emitted = max(n - 1, 0) + int(bool(done_b[s]) and 0 < n < max_new_b[s])
            steps = int(read.steps_b[s])
            finished.append(self._deliver(a, cut, step_of_token, finish, steps, emitted, eos))
        self.counts.count(ended, read)
        if ended:
            self.device.remember(ended)
        if self.prefix is not None and ended:
            self.prefix.keep(ended, tokens_bs, prompt_len_b + n_out_b - 1)
        for s in ended:
            self.active[s] = None
        if self.after_collect is not None:
            self.after_collect()
        return finished

    def _read_logprobs(self, prompt_len_b, n_out_b) -> LogprobWindow | None:
        """The logprobs the slots' requests have not read yet (logprob_window.py)."""
        return LogprobWindow.read(self.device, self.active, prompt_len_b, n_out_b)

    def interrupted(self) -> list[Result]:
        """End every request in a slot with finish "interrupted" and the tokens it has
        (after a Ctrl-C between rounds: the state is whole)."""
        return [] if self.device.state is None else self._collect(end_all="interrupted")

    def _stop(self, a: Active, new: list[int]) -> tuple[str | None, list[int]]:
        """("stop", the tokens up to the one that completes the first stop string) once
        the text holds a stop string, else (None, new). Decodes only the tokens since the
        last round and a window before them (stop_strings.py)."""
        end = find_stop(self.model.tokenizer.decode, new, a.stop_checked, a.request.stop)
        a.stop_checked = len(new)
        return (None, new) if end is None else ("stop", new[:end])

    def _deliver(
        self,
        a: Active,
        cut: list[int],
        step_of_token: list[int],
        finish: str,
        steps: int,
        emitted: int,
        eos: tuple[int, TokenLogprob] | None = None,
    ) -> Result:
        """The result of a request that ended with `cut` (its tokens, stop strings cut
        off) after `steps` forward passes past its prefill, which emitted `emitted`."""
        tokenizer = self.model.tokenizer
        text = None if tokenizer is None else tokenizer.decode(cut)
        if finish == "stop":
            text = before_stop(text, a.request.stop)
        self.stats.count_result(len(cut), steps, emitted)
        result = Result(
            id=a.request.id,
            token_ids=cut,
            text=text,
            finish=finish,
            prompt_tokens=len(a.request.ids),
            steps=steps,
            time_s=time.perf_counter() - a.inserted,
            step_of_token=step_of_token,
            logprobs=None if a.request.logprobs is None else a.logprobs[: len(cut)],
            prompt_logprobs=a.prompt_logprobs,
            eos=eos,
        )
        if a.request.listener is not None:
            since = None if result.logprobs is None else result.logprobs[a.sent :]
            prompt = a.prompt_logprobs if a.sent == 0 else None
            a.request.listener(Update(a.request.id, cut[a.sent :], result, since, prompt))
        return result

    def close(self, interrupted: bool = False) -> None:
        """The run's totals (offline); unless Ctrl-C `interrupted` it, auto's acceptance
        is folded into the model's running factor."""
        if not interrupted and not self.device.spec.grammar:  # (a grammar's guesses and
            self.counts.record_acceptance(self.model)  # masks would skew auto's factor)
        wall_s = time.perf_counter() - self.started
        self.stats.close(wall_s, self.counts.accepted_hist(), interrupted)
