"""The engine: the one host loop of every decode. Continuous batching with lookahead
decoding in every slot, offline (a list of prompts, `Engine.run`, the JSONL command, and
`lj.generate`: one offline run with a slot per prompt) or online (requests submitted
while it decodes, `submit`, `cancel`, `round`: what the HTTP server runs on). B slots
decode together; a slot whose request ends is refilled with the next waiting one while
the others keep decoding (the parts, and what lives on the device: engine/__init__.py).

Shapes (device_slots.py): an offline run takes its prompts in inputs.offline_order (longest
first on a CPU: one state shape holds the run; else shortest bucket first, the state grown for
a longer one), its prompt side P the first's bucket; `max_prompt_tokens` fixes P (a server's).

Exactness: a row's tokens depend only on its prompt, max_new_tokens, sampling settings
and PRNG key (decode_state.py, sampling.py; the key: requests.py) — never the slot. So
each request decodes to the tokens of a plain decode of it alone, whatever slot it lands
in and whatever else runs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import jax
import jax.numpy as jnp

from lookahead_jax.decoding.guess_memory import GuessMemory
from lookahead_jax.distributed import multihost, sharding
from lookahead_jax.engine import describe, inputs, prefill_planning, requests, row_buckets
from lookahead_jax.engine.config import EngineConfig
from lookahead_jax.engine.grammar_bank import GrammarBank
from lookahead_jax.engine.interrupts import held
from lookahead_jax.engine.prefill_shapes import PaddedShapes
from lookahead_jax.engine.prefix_cache import PrefixCache
from lookahead_jax.engine.requests import Encoded, Listener, Request, Result, Update
from lookahead_jax.engine.scheduler import Active, Kept, Scheduler
from lookahead_jax.engine.stats import Stats
from lookahead_jax.errors import UserInputError

# the prefill side warm_up compiles for one row: chat messages with their template are
# mostly shorter (MT-bench first turns: 30-200 tokens with SmolLM2's template), and a
# prefill pads to a compiled side rather than wait ~2-6 s for its own
WARM_SIDE = 128
# with the prefix cache, a short turn past cached blocks: one row's (a lone chat, a chunked
# prompt's rest) and every row's in one prefill (a burst ran sixteen one-row ones at WARM_SIDE)
WARM_SHORT_SIDE = 64


class _CtrlC(KeyboardInterrupt):
    """The offline driver's Ctrl-C, raised after the round it came in (Engine._drive)."""


class Engine:
    """Decode requests with `batch` slots, refilling a slot as soon as its request ends.

    Offline, a list known up front:

        engine = lj.Engine(model, batch=8, max_new_tokens=256, lookahead="auto")
        for r in engine.run(["Write a haiku", [1, 2, 3], lj.Request("Hi", id="a")]):
            print(r.id, r.text)                    # in finish order
        print(engine.stats.tokens_per_s)

    Online, requests arriving while it decodes (one thread runs the rounds; `submit` and
    `cancel` may come from any thread):

        engine = lj.Engine(model, batch=8, max_prompt_tokens=1024)
        engine.submit(lj.Request("Hi", id="a", stop=("\\n",)), listener=print)
        while engine.round():                      # or engine.serve(stop_event)
            pass

    The settings (`lj.EngineConfig`, or the same as keywords: batch, max_new_tokens,
    lookahead, sampling defaults, max_prompt_tokens, prefix_cache_mb, row_buckets, ...):
    engine/config.py says what each does.
    """

    def __init__(self, model, config: EngineConfig | None = None, **settings):
        """config: the settings (engine/config.py), or give them as keywords (the
        docstring's): `lj.Engine(model, batch=16)` is `lj.Engine(model,
        EngineConfig(batch=16))`; keywords beside a config replace its fields."""
        inputs.check_model(model)
        if config is None:
            config = EngineConfig(**settings)
        elif not isinstance(config, EngineConfig):
            raise UserInputError(
                f"config must be an lj.EngineConfig (or give the settings as keywords), "
                f"got {type(config).__name__}"
            )
        elif settings:
            config = dataclasses.replace(config, **settings)
        sharding.check_batch(model.mesh, config.batch)
        config.check_context(model.lm.max_context)
        self.model, self.config = model, config
        self._auto_choice = None  # auto's choice for one row, once warm_up has run
        self.guess_memory = GuessMemory()  # kept across runs (used with shared_guesses)
        self.prefill_shapes = PaddedShapes()  # kept across runs: prefill_shapes.py
        self._prefix_cache: PrefixCache | None = None  # made at the first run that uses it
        # the online rounds' counts since the start (or warm_up), which /metrics reads and
        # no offline run replaces; `stats`: the last offline run's, else those same ones
        self.online_stats = self.stats = Stats(batch=config.batch)
        self._scheduler: Scheduler | None = None  # the online slots (created at the first round)
        self._inbox: queue.Queue = queue.Queue()  # ("submit", Encoded) | ("cancel", id)
        self._known: set = set()  # ids submitted and not yet finished (online)
        self._known_lock = threading.Lock()
        self._counter = itertools.count()
        # requests submitted, and those that left a queue (admitted, cancelled while waiting,
        # failed) in earlier slots: `queued` is exact whichever thread asks mid-handover
        self._submitted = self._dequeued_before = 0
        self._wake = threading.Event()  # set by submit and cancel: serve() stops waiting

    # the settings, read-only (self.config's; an engine's settings do not change)
    batch = property(lambda self: self.config.batch)
    max_new_tokens = property(lambda self: self.config.max_new_tokens)
    lookahead = property(lambda self: self.config.lookahead)
    seed = property(lambda self: self.config.seed)
    chat = property(lambda self: self.config.chat)
    sampling = property(lambda self: self.config.sampling)
    steps_per_call = property(lambda self: self.config.steps_per_call)
    stream_steps = property(lambda self: self.config.stream_steps)
    max_prompt_tokens = property(lambda self: self.config.max_prompt_tokens)
    sampled = property(lambda self: self.config.sampled)
    max_logprobs = property(lambda self: self.config.max_logprobs)
    prefix_cache_mb = property(lambda self: self.config.prefix_cache_mb)
    prefill_chunk = property(lambda self: self.config.prefill_chunk)
    shared_guesses = property(lambda self: self.config.shared_guesses)
    row_buckets = property(lambda self: self.config.row_buckets)

    # ------------------------------------------------------------------ requests

    @property
    def defaults(self) -> requests.Defaults:
        """The settings a request without its own takes, and the prompt limit."""
        c = self.config
        return requests.Defaults(
            c.max_new_tokens, c.sampling, c.seed, c.chat, c.max_prompt_tokens, c.max_logprobs
        )

    def _encode_one(self, r: Request, pid, listener=None, stream=False) -> Encoded:
        return requests.encode(self.model, self.defaults, r, pid, listener, stream)

    def encode(self, prompts: Iterable) -> list[Encoded]:
        """Every prompt encoded and checked before anything runs (requests.encode_all)."""
        return requests.encode_all(self.model, self.defaults, prompts)

    def prefix_cache(self) -> PrefixCache | None:
        """The prefix cache every run of this engine shares (None: off, with no budget
        or on a mesh, which it does not support yet)."""
        if not self.prefix_cache_mb or self.model.mesh is not None:
            return None
        if self._prefix_cache is None:
            model = self.model
            like = jax.eval_shape(lambda: model.lm.init_cache(1, 1, jnp.dtype(model.dtype)))
            self._prefix_cache = PrefixCache(like, self.prefix_cache_mb)
        return self._prefix_cache

    def _kept(self) -> Kept:  # what this engine keeps across runs, for a run's scheduler
        return Kept(self.guess_memory, self.prefill_shapes, self.prefix_cache())

    # ------------------------------------------------------------------ offline

    def run(self, prompts: Iterable) -> Iterator[Result]:
        """Decode every prompt (text, chat messages, token ids or Request); yield each
        Result as its prompt finishes. Every prompt is checked here, before this returns
        (bad input raises UserInputError at once, not at the first result). `self.stats`
        is complete once the iterator is exhausted."""
        return self._run(self.encode(prompts))

    def _run(self, encoded: list[Encoded]) -> Iterator[Result]:
        for finished in self._drive(self._offline(encoded), end_interrupted=False):
            yield from finished

    def run_batch(
        self, prompts: list, stream: Callable[[list[list[int]]], None] | None = None
    ) -> tuple[list[Result], bool]:
        """Decode a batch: prompt b (text, chat messages or token ids) is request b, its
        noise keyed b (`lj.generate`'s row b). With batch = len(prompts) (as lj.generate
        has it) they go into the slots in one prefill, prompt b into slot b.

        stream(new): after the prefill and after every round (`stream_steps` steps), each
        prompt's newly committed tokens, when some are new. Ctrl-C (held the whole run) ends it
        after the round it came in, or the next if it came between two (after the last: not
        reported); requests in flight end "interrupted". Returns (results by prompt, pressed)."""
        new: list[list[int]] = [[] for _ in prompts]
        listener = None if stream is None else (lambda u: new[u.id].extend(u.token_ids))
        encoded = [
            self._encode_one(
                p if isinstance(p, Request) else Request(p), b, listener, stream=stream is not None
            )
            for b, p in enumerate(prompts)
        ]
        scheduler = self._offline(encoded)
        if stream is not None:

            def after_collect():
                if any(new):
                    stream([list(tokens) for tokens in new])
                    for tokens in new:
                        tokens.clear()

            scheduler.after_collect = after_collect
        results, pressed = {}, False
        with held():  # (its rounds' own held blocks report this one's Ctrl-C)
            try:
                for finished in self._drive(scheduler, end_interrupted=True):
                    results.update((r.id, r) for r in finished)
            except _CtrlC:  # only the driver's own: a Ctrl-C elsewhere propagates as it came
                pressed = True
        return [results[b] for b in range(len(prompts))], pressed

    def _drive(self, scheduler: Scheduler, end_interrupted: bool) -> Iterator[list[Result]]:
        """The one offline driver (run, run_batch, lj.generate): rounds with Ctrl-C held
        until every request has finished, yielding each round's results. A Ctrl-C ends it
        after that round's results, in every process (they agree on the round, so a
        process whose user pressed nothing stops too), then raises KeyboardInterrupt
        (_CtrlC); with `end_interrupted` the requests in slots are yielded first with
        finish "interrupted" (run leaves them: a rerun redoes them). An interrupted run's
        stats say so, and its acceptance is not recorded for auto."""
        pressed = False
        try:
            while scheduler.busy() and not pressed:
                finished, pressed = scheduler.held_advance()
                if multihost.is_multiprocess():  # all stop after the same round
                    pressed = bool(multihost.agree_max(int(pressed)))
                if pressed and end_interrupted:
                    finished += scheduler.interrupted()
                yield finished
        except Exception:
            self._forget_device_memories()
            raise
        scheduler.close(interrupted=pressed)
        if pressed:
            raise _CtrlC

    def _offline(self, encoded: list[Encoded], per_round: bool = False) -> Scheduler:
        """A fresh scheduler and stats, `encoded` queued (per_round: as online: warm_up)."""
        fixed_P = None if self.max_prompt_tokens is None else inputs.bucket(self.max_prompt_tokens)
        most_new = max(self.max_new_tokens, *(r.max_new_tokens for r in encoded))
        new_positions = inputs.bucket(most_new)
        sampled = self.sampled
        if sampled is None:  # (warm_up: as online, where any request may sample)
            sampled = per_round or any(not r.sampling.greedy for r in encoded)
        asked = any(r.logprobs is not None or r.prompt_logprobs is not None for r in encoded)
        logprobs = self.max_logprobs if asked else None  # the online programs' when asked
        if fixed_P is None:
            encoded = inputs.offline_order(encoded, self.model.lm)
        self.stats = Stats(batch=self.batch)
        P = fixed_P or inputs.bucket(len(encoded[0].ids))
        scheduler = Scheduler(
            self.model, self.config, self._kept(), self.stats, sampled, logprobs,
            new_positions, P, per_round,
            GrammarBank.for_engine(self.model, self.config) if per_round  # (warm_up: online's)
            else GrammarBank.for_run(encoded, self.model, self.config.lookahead),
        )  # fmt: skip
        scheduler.queue.extend(encoded)
        return scheduler

    def warm_up(self, request: Request) -> None:
        """Decode `request` offline, then compile what the first requests use (call it before
        serving: stats start afresh): every row bucket's decode loops (with max_prompt_tokens:
        the online rounds' shapes; with auto its plain rounds' too) and the programs around
        them (warm_rows); one row's prefill of a chat-sized prompt (WARM_SIDE) from scratch,
        and with the prefix cache past cached blocks, one and every row's short turn
        (WARM_SHORT_SIDE) and last partial block (a prompt asked again) past them; where
        ragged passes run, up to 16 rows' chat-sized prompts in one, and with the cache up
        to 16 short turns after blocks they share, and the side above (prefills pad to them)."""
        scheduler = self._offline(self.encode([request]), per_round=True)
        for _ in self._drive(scheduler, end_interrupted=False):
            pass
        self._auto_choice = None if scheduler.auto is None else scheduler.auto.choice
        rows = row_buckets.buckets(self.batch) if scheduler.buckets.mode is not False else []
        device, side = scheduler.device, min(WARM_SIDE, scheduler.device.P)
        names = device.loop_names(scheduler.round_choice is not None)
        prefix = scheduler.prefix
        pool = None if prefix is None else prefix.cache.pool
        short = min(WARM_SHORT_SIDE, side)
        prefills = prefill_planning.warm_prefills(self.batch, side, short, pool, device.ragged)
        for rows_, side_, p in prefills:  # in the background, beside the loops
            device.compile_prefill(rows_, side_, p, wait=False)
        device.compile_loops(rows or [self.batch], names)
        for rows_, side_, p in prefills:  # (waits for them; known to prefill_shapes.py)
            device.compile_prefill(rows_, side_, p)
        device.warm_rows(rows, None if prefix is None else prefix.warm_store)
        self.online_stats = self.stats = Stats(batch=self.batch)

    def decoding(self) -> str:
        """How this engine decodes, in a line (the server's start line and /health;
        describe.py): plain, a fixed layout, or auto's layout (online: run in the rounds
        whose rows measure it faster than plain steps; known once warm_up ran)."""
        return describe.decoding(self.lookahead, self._auto_choice, self.sampling.temperature)

    # ------------------------------------------------------------------ online

    def submit(
        self,
        request: Request | object,
        listener: Listener | None = None,
        stream: bool | None = None,
    ):
        """Queue one request (any thread); returns its id. `listener(update)` is called on
        the engine's thread after each round that committed tokens for it, and with its
        Result at the end. stream (default: with a listener): the rounds are kept to
        `stream_steps` while it decodes, so that its tokens come as they are committed.
        Bad input raises UserInputError here, before it is queued."""
        r = request if isinstance(request, Request) else Request(request)
        with self._known_lock:
            pid = r.id
            if pid is None:
                pid = next(self._counter)
                while pid in self._known:
                    pid = next(self._counter)
        streams = listener is not None if stream is None else stream
        # outside the lock: a grammar compiles here (seconds, the first time), and the
        # engine's thread takes the lock as requests finish
        encoded = self._encode_one(r, pid, listener, streams)
        with self._known_lock:
            name = f"prompt {encoded.id!r}"  # the errors' ${request} (errors.py)
            if encoded.id in self._known:
                raise UserInputError("${request}: the id is already in flight", "id", request=name)
            GrammarBank.check_online(encoded, name, self.config.grammar_states)
            n, limit = encoded.max_new_tokens, self.max_new_tokens
            if n > limit:
                raise UserInputError(
                    f"${{request}}: ${{max_new_tokens}} = {n} is more than "
                    f"${{engine_max_new_tokens}} ({limit}); ask for at most {limit}, or raise it "
                    f"to {n}",
                    "max_new_tokens",
                    request=name,
                )
            self._known.add(encoded.id)
            self._submitted += 1
        self._inbox.put(("submit", encoded))
        self._wake.set()
        return encoded.id

    def cancel(self, request_id) -> None:
        """End a request (any thread): it finishes with "cancelled" at the next round and
        its slot is freed. Unknown or finished ids are ignored."""
        self._inbox.put(("cancel", request_id))
        self._wake.set()

    @property
    def queued(self) -> int:
        """Requests waiting for a slot (online)."""
        scheduler = self._scheduler
        left = self._dequeued_before + (scheduler.dequeued if scheduler is not None else 0)
        return self._submitted - left

    @property
    def slots_in_use(self) -> int:
        return 0 if self._scheduler is None else sum(x is not None for x in self._scheduler.active)

    def round(self) -> bool:
        """One online round: admit what was submitted and cancelled, prefill free slots,
        decode, deliver updates. Returns whether there was anything to do. A failure of a
        device call ends every request in flight with finish "error" (their listeners
        are told), resets the slots and is raised."""
        if self._scheduler is None and self._inbox.empty():
            return False
        try:
            if self._scheduler is None:
                # (without max_prompt_tokens: the smallest prompt bucket, grown for longer ones)
                P = inputs.bucket(self.max_prompt_tokens or 1)
                sampled = True if self.sampled is None else self.sampled
                self._scheduler = Scheduler(
                    self.model, self.config, self._kept(), self.online_stats, sampled,
                    self.max_logprobs, inputs.bucket(self.max_new_tokens), P,
                    per_round=True,  # (auto's choice each round)
                    grammars=GrammarBank.for_engine(self.model, self.config),
                )  # fmt: skip
                self._scheduler.arrivals = functools.partial(self._drain, self._scheduler)
            scheduler = self._scheduler
            self._drain(scheduler)
            if not scheduler.busy():
                return False
            for result in scheduler.advance():
                with self._known_lock:
                    self._known.discard(result.id)
        except Exception as e:
            self._fail_all(self._scheduler, e)
            raise
        return True

    def _take_inbox(self) -> list[tuple[str, object]]:
        """What the inbox holds, in order, taken out of it."""
        taken = []
        while True:
            try:
                taken.append(self._inbox.get_nowait())
            except queue.Empty:
                return taken

    def _drain(self, scheduler: Scheduler) -> None:
        for kind, item in self._take_inbox():
            if kind == "submit":
                scheduler.queue.append(item)
            elif (ended := scheduler.cancel(item)) is not None:
                with self._known_lock:
                    self._known.discard(ended.id)

    def _fail_all(self, scheduler: Scheduler | None, error: Exception) -> None:
        """Every request in flight, being admitted or waiting ends with finish "error"
        (their listeners are told); fresh slots at the next round."""
        active = [] if scheduler is None else [x for x in scheduler.active if x is not None]
        waiting = [] if scheduler is None else list(scheduler.queue)
        waiting += [item for kind, item in self._take_inbox() if kind == "submit"]  # (unread)
        self._dequeued_before += (0 if scheduler is None else scheduler.dequeued) + len(waiting)
        now = time.perf_counter()
        for a in active + [Active(r, now) for r in waiting]:
            result = Result(a.request.id, [], None, "error", len(a.request.ids), 0, 0.0, str(error))
            with self._known_lock:
                self._known.discard(a.request.id)
            if a.request.listener is not None:
                a.request.listener(Update(a.request.id, [], result))
        self._scheduler = None
        self._forget_device_memories()

    def _forget_device_memories(self) -> None:
        """After a failed device call: the prefix cache's pool may be half-written (its
        stores donate it), and a guess memory folded by the failed round may carry its error
        (JAX reports a failure where its results are used): both start again empty."""
        self._prefix_cache = None
        self.guess_memory = GuessMemory()

    def serve(self, stop: threading.Event, on_error=None, idle_wait_s=0.1, on_idle=None) -> None:
        """Run rounds until `stop` is set (the server's engine thread); idle, it calls
        `on_idle(s)` (s: seconds since a round last worked), then waits for a submission
        (woken at once) or `idle_wait_s`. A failing round has ended its requests with errors
        (`round`); `on_error(exception)` says whether to go on (True); without it, raised."""
        last_work = time.perf_counter()
        while not stop.is_set():
            self._wake.clear()
            # (the online stats: every online scheduler counts in them, a new one too)
            t, before = time.perf_counter(), describe.round_figures(self.online_stats)
            try:
                worked = self.round()
            except Exception as e:
                if on_error is None or not on_error(e):
                    raise
                worked = True  # (its requests ended: a round with work, for on_idle)
            if self._scheduler is not None:  # a slow round says where its seconds went
                after, rows = describe.round_figures(self.online_stats), self._scheduler.device.rows
                describe.log_if_slow(time.perf_counter() - t, before, after, rows)
            last_work = time.perf_counter() if worked else last_work
            if not worked:
                if on_idle is not None:
                    on_idle(time.perf_counter() - last_work)
                self._wake.wait(idle_wait_s)
