"""The engine: the one host loop of every decode. Continuous batching with lookahead
decoding in every slot, offline (a list of prompts, `Engine.run`, the JSONL command, and
`lj.generate`: a batch of prompts is one offline run with a slot per prompt) or online
(requests submitted while it decodes, `submit`, `cancel`, `round`: what the HTTP server
runs on).

B slots decode together on the device; a slot whose request ends is refilled with the
next waiting one while the other slots keep decoding. The three verbs of JetStream's
engine interface, over this package's one decode path (decoding.start / run_loop, one
DecodeState, the compiled programs of programs.py, autotune's auto policy):

    prefill   decoding.start on the requests that go into free slots, those of one
              bucket together [n, P] (P: their power-of-two bucket; n: a power of two,
              padded with rows that are done at once): their K/V, first tokens and fresh
              guess sources (pool seeded from the prompt, recycling table, window drawn
              from the prompt)
    insert    those n rows written over their slots of the B-row state in one scatter,
              every field, so a slot's old K/V, tokens, counters and guesses are all
              replaced (slot_state.py)
    generate  decoding.run_loop over the B slots until a slot that was decoding finishes
              (while requests wait), every slot is done, or a number of steps ran
              (`steps_per_call`; `stream_steps` while a request streams its tokens)

A round (`round`) admits what was submitted, prefills it into free slots, runs the loop
once, then reads every slot's tokens back: each request's listener gets the tokens
committed since its last update, a stop string ends its request, and a finished slot is
freed. Into an empty engine, B requests at once are one prefill that is the state (no
insert): lj.generate's batch costs its two programs, start and loop. Offline, a round
runs with Ctrl-C held (interrupts.py), so that an interrupt finds host and device
agreeing. A slot's life:

    empty (done) --insert--> decoding --EOS, budget, stop string or cancel--> done
        --result read--> refilled

What lives on the device: the B-row DecodeState — K/V cache (L buffers [B, K, S, Dh]),
token buffer [B, S], per-row lengths, budgets, step counters, flags, PRNG keys and
sampling settings (temperature, top-k, top-p: rows with different settings share the
batch and its programs), and the guess sources' state (pool [B, V, C, N-1], recycling
tables [B, V, k], window [B, N-1, W]). The host holds the queue, which request sits in
which slot, and the results; it sees the device only between `generate` calls.

Fixed shapes: the state's S = P + max_new_tokens_bucket + E (a prompt bucket, the budget's
bucket, the widest step's emit). An offline run takes its prompts shortest bucket first (stable
within a bucket), starting with P = the first prompt's bucket; a request of a longer
bucket first grows the state (`grow_positions`: the S axis padded, rows in flight
untouched), so attention never spans positions sized for the longest prompt of the dataset
while short ones decode. A prompt of bucket P' is prefilled with budget S - P' - E, so
its state has the current S. New programs: one prefill per prompt bucket and row count
(`stats["prompt_buckets"]`), one loop and one insert per S (`stats["cache_positions"]`).
`max_prompt_tokens` fixes P (arrival order kept, no growth): what a server wants.

Exactness: a row's tokens depend only on its prompt, budget, sampling settings and PRNG
key (decode_state.py, sampling.py). The key is fold_in(PRNGKey(seed), k): a request's own
`seed` with k = 0 (the key of a lone `lj.generate` row, so a seeded request gives the
tokens of a lone sampled decode), else the engine's seed with k = the prompt's key (an
integer id is its own key, any other id a hash of its text) — never the slot. So each
request decodes to the tokens of a plain decode of it alone, whatever slot it lands in
and whatever else runs.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import autotune, programs
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, keys_for
from lookahead_jax.distributed import multihost, sharding
from lookahead_jax.engine import inputs, interrupts, slot_state
from lookahead_jax.engine import stats as decode_stats
from lookahead_jax.engine.stop_strings import find_stop
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses import acceptance_record
from lookahead_jax.guesses.lookahead_config import LookaheadConfig, max_step_tokens
from lookahead_jax.models import seam

FINISHES = ("eos", "length", "stop", "cancelled", "error", "interrupted")


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt for the engine. Unset settings take the engine's."""

    prompt: object  # text, a list of chat messages ({"role", "content"}), or token ids
    id: int | str | None = None  # default: the prompt's index in the run (online: a count)
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    # this request's own noise: fold_in(PRNGKey(seed), 0), a lone decode's row 0 (so the
    # tokens equal lj.generate([prompt], seed=seed)'s); None: the engine's seed and the id
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one found


@dataclasses.dataclass
class Result:
    id: int | str
    token_ids: list[int]  # new tokens, cut at EOS (EOS not included) or at a stop string
    text: str | None  # decoded token_ids, cut before a stop string (None without a tokenizer)
    finish: str  # FINISHES: "eos", "length", "stop", "cancelled", "error" or "interrupted"
    prompt_tokens: int
    steps: int  # forward passes after its prefill
    time_s: float  # wall time from its insert to its result
    error: str | None = None  # finish "error": what failed
    step_of_token: list[int] = dataclasses.field(default_factory=list)  # per token in
    # token_ids: the step that emitted it (0 = the prefill)


@dataclasses.dataclass
class Update:
    """What a request's listener gets after a round: the tokens committed since its last
    update (possibly none) and, with the last update, its Result."""

    id: int | str
    token_ids: list[int]
    result: Result | None = None


Listener = Callable[[Update], None]


@dataclasses.dataclass(frozen=True)
class _Encoded:
    id: int | str
    ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    seed: int  # the row key is fold_in(PRNGKey(seed), key)
    key: int
    stop: tuple[str, ...] = ()
    listener: Listener | None = dataclasses.field(default=None, compare=False)
    streams: bool = False  # its listener wants tokens as they come (rounds of stream_steps)


def prompt_key(prompt_id) -> int:
    """The uint32 that keys a prompt's sampling noise: an integer id in [0, 2**32) is its
    own key (so `lj.generate`'s row b and the engine's prompt b get the same noise),
    any other id the first 4 bytes of the SHA-256 of its type and text (so "7" and 7 differ;
    a string can still share a key with some integer id, 1 in 2**32)."""
    is_int = isinstance(prompt_id, int | np.integer) and not isinstance(prompt_id, bool)
    if is_int and 0 <= prompt_id < 2**32:
        return int(prompt_id)
    digest = hashlib.sha256(f"{type(prompt_id).__name__}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserInputError(f"{name} must be an integer >= 1, got {value!r}")


class Engine:
    """Decode requests with `batch` slots, refilling a slot as soon as its request ends.

    Offline, a list known up front:

        engine = lj.Engine(model, batch=8, max_new_tokens=256, lookahead="auto")
        for r in engine.run(["Write a haiku", [1, 2, 3], lj.Request("Hi", id="a")]):
            print(r.id, r.text)                    # in finish order
        print(engine.stats["tokens_per_s"])

    Online, requests arriving while it decodes (one thread runs the rounds; `submit` and
    `cancel` may come from any thread):

        engine = lj.Engine(model, batch=8, max_prompt_tokens=1024)
        engine.submit(lj.Request("Hi", id="a", stop=("\\n",)), listener=print)
        while engine.round():                      # or engine.serve(stop_event)
            pass

    lookahead: a LookaheadConfig, "auto" (chosen for this batch size from a cost curve
    measured at it, and called off mid-run if it does not pay) or None (plain).
    temperature / top_k / top_p / max_new_tokens: defaults for requests without their own.
    seed: prompt `id`'s noise is fold_in(PRNGKey(seed), prompt_key(id)).
    steps_per_call: the device loop returns to the host at least this often (progress,
    Ctrl-C) even when no slot finished; None: as often as auto checks its choice, else
    only when a slot finishes. stream_steps: as often while a request with a listener
    decodes (its tokens arrive every this many steps).
    max_prompt_tokens: fix the prompt side of the shapes (longer prompts are refused), so
    that runs over other prompts reuse the same compiled programs; default: each run
    sizes for its longest prompt. The budget side is max_new_tokens (offline, or a
    request's larger one), rounded up to a power of two; online requests may not ask for
    more than max_new_tokens.
    sampled: whether rows may sample (compiles the sampling code). Default: offline, if
    some request samples; online, always (any request may).
    """

    def __init__(
        self,
        model,
        batch: int = 8,
        max_new_tokens: int = 256,
        lookahead: LookaheadConfig | str | None = "auto",
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        chat: bool = False,
        steps_per_call: int | None = 64,
        max_prompt_tokens: int | None = None,
        stream_steps: int = 4,
        sampled: bool | None = None,
    ):
        if not hasattr(model, "lm") or not hasattr(model, "params"):
            raise UserInputError(
                "model must be an lj.Model (from lj.load or lj.from_nnx), "
                f"got {type(model).__name__}"
            )
        seam.check_model(model.lm)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise UserInputError(f"batch (--batch) must be an integer >= 1, got {batch!r}")
        sharding.check_batch(model.mesh, batch)
        inputs.check_max_new_tokens(max_new_tokens)
        _positive("steps_per_call", steps_per_call)
        _positive("stream_steps", stream_steps)
        _positive("max_prompt_tokens", max_prompt_tokens)
        if lookahead not in (None, "auto") and not isinstance(lookahead, LookaheadConfig):
            raise UserInputError(
                "lookahead must be a LookaheadConfig, 'auto' or None, got " + repr(lookahead)
            )
        if isinstance(lookahead, LookaheadConfig):
            lookahead.check_fits(model.lm.max_context)
        self.model, self.batch, self.lookahead = model, batch, lookahead
        self.max_new_tokens, self.seed, self.chat = max_new_tokens, seed, chat
        self.sampling = SamplingConfig(float(temperature), top_k, top_p)
        self.steps_per_call, self.stream_steps = steps_per_call, stream_steps
        if max_prompt_tokens is not None:
            inputs.check_context(model.lm.max_context, max_prompt_tokens, max_new_tokens)
        self.max_prompt_tokens = max_prompt_tokens
        self.sampled = sampled
        self.stats: decode_stats.Stats = {}
        self._slots: _Slots | None = None  # the online slots (created at the first round)
        self._inbox: queue.Queue = queue.Queue()  # ("submit", _Encoded) | ("cancel", id)
        self._known: set = set()  # ids submitted and not yet finished (online)
        self._known_lock = threading.Lock()
        self._counter = itertools.count()
        # requests submitted, and those that left a queue (admitted to a slot, cancelled
        # while waiting, failed) in slots before the current ones: `queued` is exact
        # whichever thread asks, where the inbox and the slots' queue hand items over
        self._submitted = self._dequeued_before = 0
        self._wake = threading.Event()  # set by submit and cancel: serve() stops waiting

    # ------------------------------------------------------------------ requests

    def _encode_one(self, r: Request, pid, listener=None, stream=False) -> _Encoded:
        """One request encoded and checked (prompt + budget within the model's context)."""
        what = f"prompt {pid!r}"
        if isinstance(pid, np.integer):
            pid = int(pid)
        if not isinstance(pid, int | str) or isinstance(pid, bool):
            raise UserInputError(f"{what}: an id must be an integer or a string")
        ids = inputs.encode_prompt(
            self.model.tokenizer, self.model.lm.vocab_size, r.prompt, self.chat, what
        )
        max_new_tokens = self.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
        inputs.check_max_new_tokens(max_new_tokens)
        inputs.check_context(self.model.lm.max_context, len(ids), max_new_tokens)
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise UserInputError(
                f"{what} has {len(ids)} tokens, more than the engine's max_prompt_tokens "
                f"({self.max_prompt_tokens})"
            )
        sampling = SamplingConfig(
            self.sampling.temperature if r.temperature is None else float(r.temperature),
            self.sampling.top_k if r.top_k is None else r.top_k,
            self.sampling.top_p if r.top_p is None else r.top_p,
        )
        seed_ok = isinstance(r.seed, int) and not isinstance(r.seed, bool)
        if r.seed is not None and not (seed_ok and -(2**63) <= r.seed < 2**63):
            raise UserInputError(f"{what}: seed must be a 64-bit integer, got {r.seed!r}")
        stop = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise UserInputError(f"{what}: stop strings must be non-empty strings")
        if stop and self.model.tokenizer is None:
            raise UserInputError(f"{what}: stop strings need a tokenizer")
        seed, key = (self.seed, prompt_key(pid)) if r.seed is None else (r.seed, 0)
        return _Encoded(pid, ids, max_new_tokens, sampling, seed, key, stop, listener, stream)

    def encode(self, prompts: Iterable) -> list[_Encoded]:
        """Every prompt encoded and checked (ids unique, prompt + budget within the
        model's context) before anything runs."""
        out, seen = [], set()
        for i, p in enumerate(prompts):
            r = p if isinstance(p, Request) else Request(p)
            pid = i if r.id is None else r.id
            if pid in seen:
                raise UserInputError(f"prompt {pid!r}: the id is used twice")
            seen.add(pid)
            out.append(self._encode_one(r, pid))
        if not out:
            raise UserInputError("no prompts to decode")
        if multihost.is_multiprocess():  # every process runs the same rounds
            blob = repr([(r.id, r.ids, r.max_new_tokens, r.sampling, r.stop) for r in out]).encode()
            digest = int.from_bytes(hashlib.sha256(blob).digest()[:4], "little") >> 1  # int32
            multihost.agree(digest, "prompts (all of them, in the same order)")
        return out

    # ------------------------------------------------------------------ offline

    def run(self, prompts: Iterable) -> Iterator[Result]:
        """Decode every prompt (text, chat messages, token ids or Request); yield each
        Result as its prompt finishes. Every prompt is checked here, before this returns
        (bad input raises UserInputError at once, not at the first result). `self.stats`
        is complete once the iterator is exhausted."""
        return self._run(self.encode(prompts))

    def _run(self, requests: list[_Encoded]) -> Iterator[Result]:
        slots = self._offline(requests)
        while slots.busy():
            results, pressed = slots.held_advance()
            yield from results
            if pressed:  # after the round's results: the rest is redone by a rerun
                raise KeyboardInterrupt
        slots.close()

    def run_batch(
        self, prompts: list, stream: Callable[[list[list[int]]], None] | None = None
    ) -> tuple[list[Result], bool]:
        """Decode a batch: prompt b (text, chat messages or token ids) is request b, its
        noise keyed b (`lj.generate`'s row b). With batch = len(prompts) (as lj.generate
        has it) they go into the slots in one prefill, prompt b into slot b.

        stream(new): after the prefill and after every round (`stream_steps` steps), each
        prompt's newly committed tokens, when some are new. Ctrl-C ends the run after the
        round it came in; the requests in flight then end with finish "interrupted".

        Returns (the results in prompt order, whether Ctrl-C ended it)."""
        new: list[list[int]] = [[] for _ in prompts]
        listener = None if stream is None else (lambda u: new[u.id].extend(u.token_ids))
        requests = [
            self._encode_one(
                p if isinstance(p, Request) else Request(p), b, listener, stream=stream is not None
            )
            for b, p in enumerate(prompts)
        ]
        slots = self._offline(requests)
        if stream is not None:

            def after_collect():
                if any(new):
                    stream([list(tokens) for tokens in new])
                    for tokens in new:
                        tokens.clear()

            slots.after_collect = after_collect
        results, pressed = {}, False
        while slots.busy() and not pressed:
            finished, pressed = slots.held_advance()
            results.update((r.id, r) for r in finished)
            if multihost.is_multiprocess():  # all stop after the same round
                pressed = bool(multihost.agree_max(int(pressed)))
        if pressed:
            results.update((r.id, r) for r in slots.interrupted())
        slots.close(record=not pressed)  # an interrupted run's acceptance is not recorded
        return [results[b] for b in range(len(prompts))], pressed

    def _offline(self, requests: list[_Encoded]) -> _Slots:
        """Fresh stats and slots with `requests` queued."""
        fixed_P = None if self.max_prompt_tokens is None else inputs.bucket(self.max_prompt_tokens)
        max_new_tokens_bucket = inputs.bucket(
            max(self.max_new_tokens, *(r.max_new_tokens for r in requests))
        )
        sampled = self.sampled
        if sampled is None:
            sampled = any(not r.sampling.greedy for r in requests)
        if fixed_P is None:  # shortest bucket first: the cache grows once per bucket at most
            requests = sorted(requests, key=lambda r: inputs.bucket(len(r.ids)))
        self.stats = decode_stats.fresh(self.batch)
        slots = _Slots(
            self, sampled, max_new_tokens_bucket, fixed_P or inputs.bucket(len(requests[0].ids))
        )
        slots.queue.extend(requests)
        return slots

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
            encoded = self._encode_one(r, pid, listener, streams)
            if encoded.id in self._known:
                raise UserInputError(f"prompt {encoded.id!r}: the id is already in flight")
            if encoded.max_new_tokens > self.max_new_tokens:
                raise UserInputError(
                    f"prompt {encoded.id!r}: max_new_tokens {encoded.max_new_tokens} is more than "
                    f"this engine's {self.max_new_tokens}"
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
        slots = self._slots
        left = self._dequeued_before + (slots.dequeued if slots is not None else 0)
        return self._submitted - left

    @property
    def slots_in_use(self) -> int:
        return 0 if self._slots is None else sum(x is not None for x in self._slots.active)

    def round(self) -> bool:
        """One online round: admit what was submitted and cancelled, prefill free slots,
        decode, deliver updates. Returns whether there was anything to do. A failure of a
        device call ends every request in flight with finish "error" (their listeners
        are told), resets the slots and is raised."""
        if self._slots is None and self._inbox.empty():
            return False
        try:
            if self._slots is None:
                if not self.stats:
                    self.stats = decode_stats.fresh(self.batch)
                # without max_prompt_tokens the state starts at the smallest prompt bucket
                # and grows as longer prompts come
                P = inputs.bucket(self.max_prompt_tokens or 1)
                sampled = True if self.sampled is None else self.sampled
                self._slots = _Slots(self, sampled, inputs.bucket(self.max_new_tokens), P)
            slots = self._slots
            self._drain(slots)
            if not slots.busy():
                return False
            for result in slots.advance():
                with self._known_lock:
                    self._known.discard(result.id)
        except Exception as e:
            self._fail_all(self._slots, e)
            raise
        return True

    def _drain(self, slots: _Slots) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                slots.queue.append(item)
            elif (ended := slots.cancel(item)) is not None:
                with self._known_lock:
                    self._known.discard(ended.id)

    def _fail_all(self, slots: _Slots | None, error: Exception) -> None:
        """Every request in flight, being admitted or waiting ends with finish "error"
        (their listeners are told); fresh slots at the next round."""
        active = [] if slots is None else [x for x in slots.active if x is not None]
        waiting = [] if slots is None else list(slots.queue)
        while True:  # and what is still in the inbox
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                waiting.append(item)
        self._dequeued_before += (0 if slots is None else slots.dequeued) + len(waiting)
        now = time.perf_counter()
        for a in active + [_Active(r, now) for r in waiting]:
            result = Result(a.request.id, [], None, "error", len(a.request.ids), 0, 0.0, str(error))
            with self._known_lock:
                self._known.discard(a.request.id)
            if a.request.listener is not None:
                a.request.listener(Update(a.request.id, [], result))
        self._slots = None

    def serve(self, stop: threading.Event, on_error=None, idle_wait_s: float = 0.1) -> None:
        """Run rounds until `stop` is set (the server's engine thread); while idle, waits
        for a submission (woken at once) or `idle_wait_s`. A failing round has ended its
        requests with errors (`round`); then `on_error(exception)` says whether to go on
        (True) or stop, and without `on_error` the exception is raised."""
        while not stop.is_set():
            self._wake.clear()
            try:
                worked = self.round()
            except Exception as e:
                if on_error is None or not on_error(e):
                    raise
                continue
            if not worked:
                self._wake.wait(idle_wait_s)


@dataclasses.dataclass
class _Active:
    """A request in a slot: when it went in and how many of its tokens its listener has."""

    request: _Encoded
    inserted: float
    sent: int = 0
    stop_checked: int = 0  # its first tokens known to hold no stop string


class _Slots:
    """The B slots on the device and the host's view of them (module docstring)."""

    def __init__(self, engine: Engine, sampled: bool, max_new_tokens_bucket: int, P: int):
        self.started = time.perf_counter()
        model = engine.model
        self.engine, self.model, self.B = engine, model, engine.batch
        self.queue: collections.deque[_Encoded] = collections.deque()
        self.dequeued = 0  # requests that left `queue`: admitted or cancelled
        self.active: list[_Active | None] = [None] * self.B
        self.after_collect: Callable[[], None] | None = None  # called after each read-back
        self.auto = None
        lookahead = engine.lookahead
        if lookahead == "auto":
            self.auto = autotune.AutoRun(
                model, engine.sampling, max_step_tokens(model.lm.max_context), batch=self.B
            )
            lookahead = self.auto.config
        self.spec = DecodeSpec(
            lm=model.lm,
            eos_ids=tuple(model.eos_ids),
            sampled=sampled,
            lookahead=lookahead,
            cache_dtype=jnp.dtype(model.dtype).name,
        )
        self.source_names = () if lookahead is None else lookahead.source_names
        self.slack = self.spec.max_emit
        self.max_new_tokens_bucket = max_new_tokens_bucket
        self.hist_done_e = None  # the lookahead phase's accepted-length histogram [E] of
        self.plain_steps = 0  # results read; after auto's hand-over, their plain steps
        self.weights = None  # (sum of finished rows' record weights [n_sources, A], rows)
        self.state: DecodeState | None = None
        self.cancelled: set[int] = set()  # slots whose requests were cancelled
        self.to_retire_b = np.zeros((self.B,), bool)  # freed slots the device still decodes
        self._set_shape(P)
        self.stats["config"] = {
            "lookahead": None if lookahead is None else lookahead.describe(),
            "dtype": self.spec.cache_dtype,
            "sampled": sampled,
            **engine.sampling.describe(),
        }
        if self.auto is not None:
            self.stats["config"]["lookahead_auto"] = {
                **self.auto.choice.describe(),
                "switched_to_plain_after_steps": None,
            }

    @property
    def stats(self) -> decode_stats.Stats:
        return self.engine.stats

    # ------------------------------------------------------------------ shapes, programs

    def _set_shape(self, P: int) -> None:
        """Programs for the state of prompt side P: S = P + max_new_tokens_bucket + slack
        (the loop's compilation started by the next prefill, the insert at its first use)."""
        self.P = P
        rows = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct((self.B, *shape), dtype)  # noqa: E731
        self.loop_args = (
            self.model.params,
            rows(P),
            rows(),
            rows(),
            rows(2, dtype=jnp.uint32),
            RowSampling(rows(dtype=jnp.float32), rows(), rows(dtype=jnp.float32)),
        )
        self.loop = None  # compiled beside the next prefill's program (_fill)
        shape = programs.state_shape(
            self.model, self.spec, self.max_new_tokens_bucket, self.loop_args
        )
        mesh = self.model.mesh
        self.state_sh = None if mesh is None else sharding.state_shardings(shape, mesh)
        self.insert = slot_state.program(slot_state.insert, self.state_sh, donate_argnums=0)
        self.retire = slot_state.program(slot_state.retire, self.state_sh, donate_argnums=0)
        self.positions_S = shape.tokens.shape[1]
        self.stats["cache_positions"].append(self.positions_S)

    def _grow(self, P: int) -> None:
        """Move to a longer prompt side P: the rows in flight keep decoding in a state
        whose S axis is padded (the new positions lie past every row's end)."""
        self._set_shape(P)
        if self.state is not None:
            grow = slot_state.program(slot_state.grow_positions, self.state_sh, static_argnums=1)
            self.state = grow(self.state, self.positions_S)

    def _compiled(self, spec, max_new_tokens_bucket, args, name):
        exe, secs = programs.compiled(self.model, spec, max_new_tokens_bucket, args, name)
        self.stats["compile_s"] += secs
        return exe

    # ------------------------------------------------------------------ rounds

    def busy(self) -> bool:
        return bool(self.queue) or any(x is not None for x in self.active)

    def held_advance(self) -> tuple[list[Result], bool]:
        """`advance` with Ctrl-C held (interrupts.py): (its results, whether Ctrl-C came)."""
        with interrupts.held() as ctrl_c:
            results = self.advance()
        return results, ctrl_c.pressed

    def advance(self) -> list[Result]:
        """One round of the slots: admit, decode, read back; returns the requests that
        finished (Engine.round, which drives it online, returns whether it had work)."""
        stats = self.stats
        t, compile_s = time.perf_counter(), stats["compile_s"]
        admitted = self._fill()
        finished = []
        if admitted:
            jax.block_until_ready(self.state)
            stats["prefill_s"] += time.perf_counter() - t - (stats["compile_s"] - compile_s)
            if any(a.request.listener for a in admitted):
                finished += self._collect()  # the first tokens (the prefill's) go out now
        if not any(x is not None for x in self.active):
            return finished
        (done_b,) = self._read("done")
        if not (done_b | self.to_retire_b).all():
            t, compile_s = time.perf_counter(), stats["compile_s"]
            if self.to_retire_b.any():
                self.state = self.retire(self.state, self.to_retire_b)
                self.to_retire_b[:] = False
            if self.loop is None:
                self.loop = self._compiled(
                    self.spec, self.max_new_tokens_bucket, self.loop_args, "run_loop"
                )
            self.state = self.loop(
                self.model.params, self.state, jnp.int32(self._steps()), jnp.bool_(bool(self.queue))
            )
            jax.block_until_ready(self.state)
            stats["decode_s"] += time.perf_counter() - t - (stats["compile_s"] - compile_s)
            stats["rounds"] += 1
            self._watch()
        finished += self._collect()
        return finished

    def _steps(self) -> int:
        """Steps the next loop call may run: stream_steps while a request streams, else
        steps_per_call (None: auto's check window while it watches, else the whole budget)."""
        engine = self.engine
        if any(x is not None and x.request.streams for x in self.active):
            return engine.stream_steps
        if engine.steps_per_call is not None:
            return engine.steps_per_call
        if self.auto is not None and self.auto.chunk_steps is not None:
            return self.auto.chunk_steps  # also after a hand-over: Ctrl-C is noticed as soon
        return self.max_new_tokens_bucket + 1

    def _prefill(self, P: int, requests: list[_Encoded]) -> DecodeState:
        """One prefill of the requests of bucket P, padded to `prefill_rows` rows (a padding
        row has a budget of 0: done at once)."""
        n = slot_state.prefill_rows(len(requests), self.B)
        pad = n - len(requests)
        prompt = np.zeros((n, P), np.int32)
        prompt_len, max_new_tokens = np.ones((n,), np.int32), np.zeros((n,), np.int32)
        for i, r in enumerate(requests):
            prompt[i, : len(r.ids)] = r.ids
            prompt_len[i], max_new_tokens[i] = len(r.ids), r.max_new_tokens
        keys = np.zeros((n, 2), np.uint32)  # padding rows: zeros
        by_seed: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_seed.setdefault(r.seed, []).append(i)
        for seed, rows_i in by_seed.items():  # one vmapped fold_in per seed, not per row
            keys[rows_i] = np.asarray(keys_for(seed, [requests[i].key for i in rows_i]))
        sampling = RowSampling.of([r.sampling for r in requests] + [SamplingConfig()] * pad)
        rows = (prompt, prompt_len, max_new_tokens, keys, sampling)
        mesh = self.model.mesh
        if mesh is not None:  # where the start program takes them: rows over `data`
            rows = jax.tree.map(
                lambda a: multihost.replicated(mesh, a, sharding.batch_major(a, mesh)), rows
            )
        args = (self.model.params, *rows)
        buckets = self.stats["prompt_buckets"]
        if P not in buckets:
            buckets.append(P)
        self.stats["prefill_calls"] += 1
        # the budget bucket that gives this prompt bucket's state the state's
        # S = self.P + max_new_tokens_bucket + slack
        start = self._compiled(self.spec, self.P + self.max_new_tokens_bucket - P, args, "start")
        return start(*args)

    def _fill(self) -> list[_Active]:
        """Prefill the queue's next requests into the free slots: one prefill per prompt
        bucket among them, then one insert of its rows. Into an empty engine, B requests
        are one prefill at the state's P, and that is the state (no insert)."""
        free = [s for s in range(self.B) if self.active[s] is None]
        taken = [self.queue.popleft() for _ in range(min(len(free), len(self.queue)))]
        self.dequeued += len(taken)
        if not taken:
            return []
        longest = max(inputs.bucket(len(r.ids)) for r in taken)
        if longest > self.P:
            self._grow(longest)
        if self.loop is None:  # the loop compiles in the background beside the prefill's
            programs.compile_soon(
                self.model, self.spec, self.max_new_tokens_bucket, self.loop_args, "run_loop"
            )
        now = time.perf_counter()
        admitted = []
        for s, r in zip(free, taken, strict=False):  # active before any device call, so
            self.active[s] = _Active(r, now)  # that a failing one fails them too (_fail_all)
            admitted.append(self.active[s])
        if self.state is None and len(taken) == self.B:  # free == all slots, in order
            self.state = self._prefill(self.P, taken)
            return admitted
        by_bucket: dict[int, list] = {}
        for s, r in zip(free, taken, strict=False):  # the first len(taken) free slots
            by_bucket.setdefault(inputs.bucket(len(r.ids)), []).append((s, r))
        for P, placed in by_bucket.items():
            fresh = self._prefill(P, [r for _, r in placed])
            if self.state is None:
                empty = slot_state.program(slot_state.empty_slots, self.state_sh, static_argnums=1)
                self.state = empty(fresh, self.B)
            slots = np.full((fresh.done.shape[0],), self.B, np.int32)  # padding: dropped
            slots[: len(placed)] = [s for s, _ in placed]
            self.state = self.insert(self.state, fresh, slots)
            self.to_retire_b[[s for s, _ in placed]] = False
        return admitted

    def cancel(self, request_id) -> Result | None:
        """End a request with "cancelled": a waiting one now (its Result returned), a
        decoding one at the next `_collect`."""
        for r in list(self.queue):
            if r.id == request_id:
                self.queue.remove(r)
                self.dequeued += 1
                return self._deliver(_Active(r, time.perf_counter()), [], [], "cancelled", 0)
        for s, a in enumerate(self.active):
            if a is not None and a.request.id == request_id:
                self.cancelled.add(s)  # ended by the next _collect
        return None

    def _read(self, *fields) -> list[np.ndarray]:
        return [multihost.all_rows(getattr(self.state, f)) for f in fields]

    def _collect(self, end_all: str | None = None) -> list[Result]:
        """Read every slot back: send each listener its new tokens, end the requests that
        are done (EOS, budget), hit a stop string or were cancelled, free their slots.
        end_all: end every request in a slot with this finish, as a cancel."""
        tokens, step_of, prompt_len, n_out, max_new_tokens, done, steps = self._read(
            "tokens", "step_of_token", "prompt_len", "n_out", "max_new_tokens", "done", "steps"
        )
        cancelled, self.cancelled = self.cancelled, set()
        finished, ended = [], []
        for s, a in enumerate(self.active):
            if a is None:
                continue
            new = tokens[s, prompt_len[s] : prompt_len[s] + n_out[s]].tolist()
            finish, cut = None, new
            if end_all is not None or s in cancelled:
                finish = end_all or "cancelled"
            elif a.request.stop:
                finish, cut = self._stop(a, new)
            if finish is None and done[s]:
                finish = "length" if n_out[s] >= max_new_tokens[s] else "eos"
            if finish is None:
                if a.request.listener is not None and len(new) > a.sent:
                    a.request.listener(Update(a.request.id, new[a.sent :]))
                    a.sent = len(new)
                continue
            ended.append(s)
            # a row the device still decodes (cancelled, stopped) is retired before the
            # next loop call; so is a done row that sampled, so that a batch left with
            # greedy rows skips the sampling work (slot_state.retire)
            self.to_retire_b[s] = not done[s] or not a.request.sampling.greedy
            step_of_token = step_of[s, prompt_len[s] : prompt_len[s] + len(cut)].tolist()
            finished.append(self._deliver(a, cut, step_of_token, finish, int(steps[s])))
        self._count_rows(ended)
        for s in ended:
            self.active[s] = None
        if self.after_collect is not None:
            self.after_collect()
        return finished

    def interrupted(self) -> list[Result]:
        """End every request in a slot with finish "interrupted" and the tokens it has
        (after a Ctrl-C between rounds: the state is whole)."""
        self.stats["interrupted"] = True
        return [] if self.state is None else self._collect(end_all="interrupted")

    def _stop(self, a: _Active, new: list[int]) -> tuple[str | None, list[int]]:
        """("stop", the tokens up to the one that completes the first stop string) once
        the text holds a stop string, else (None, new). Decodes only the tokens since the
        last round and a window before them (stop_strings.py)."""
        end = find_stop(self.model.tokenizer.decode, new, a.stop_checked, a.request.stop)
        a.stop_checked = len(new)
        return (None, new) if end is None else ("stop", new[:end])

    def _deliver(
        self, a: _Active, cut: list[int], step_of_token: list[int], finish: str, steps: int
    ) -> Result:
        tokenizer = self.model.tokenizer
        text = None if tokenizer is None else tokenizer.decode(cut)
        if finish == "stop":
            text = text[: min(i for i in (text.find(s) for s in a.request.stop) if i >= 0)]
        stats = self.stats
        stats["prompts"] += 1
        stats["new_tokens"] += len(cut)
        stats["row_steps"] += steps
        result = Result(
            id=a.request.id,
            token_ids=cut,
            text=text,
            finish=finish,
            prompt_tokens=len(a.request.ids),
            steps=steps,
            time_s=time.perf_counter() - a.inserted,
            step_of_token=step_of_token,
        )
        if a.request.listener is not None:
            a.request.listener(Update(a.request.id, cut[a.sent :], result))
        return result

    def close(self, record: bool = True) -> None:
        """The run's totals (offline); with `record`, auto's acceptance is folded into
        the model's running factor."""
        if record:
            self.record_acceptance()
        decode_stats.totals(self.stats, time.perf_counter() - self.started, self.accepted_hist())

    # ------------------------------------------------------------------ per-row counts

    def _count_rows(self, slots: list[int]) -> None:
        """Count the rows `slots` into the stats: their steps by tokens emitted and, with
        lookahead, each source's accepted paths and tokens. Rows that end now; or, at
        auto's hand-over, the rows in flight (their lookahead phase: the plain state that
        follows starts its counts afresh)."""
        if not slots:
            return
        (hist,) = self._read("accept_hist")
        for s in slots:
            self._add_hist(hist[s])
        draft = self.state.draft
        if draft is None:
            return
        nodes, paths, tokens = (
            multihost.all_rows(a)[slots].sum(0)
            for a in (draft.nodes_by_source, draft.paths_by_source, draft.tokens_by_source)
        )
        weights = None
        if draft.record is not None:  # the rows' last weights by depth, averaged
            record = acceptance_record.AcceptanceRecord(
                expected=multihost.all_rows(draft.record.expected)[slots],
                accepted=multihost.all_rows(draft.record.accepted)[slots],
            )
            w_sum = acceptance_record.weights(record).sum(0)  # [n_sources, A]
            total, rows = self.weights or (0.0, 0)
            self.weights = (total + w_sum, rows + len(slots))
            weights = self.weights[0] / self.weights[1]
        decode_stats.count_sources(self.stats, self.source_names, nodes, paths, tokens, weights)

    def _add_hist(self, hist_e) -> None:
        """Count a finished row's accepted-length histogram [E]: into the lookahead
        phase's, or after auto's hand-over to plain decoding, its steps (one column)."""
        if self.auto is not None and self.auto.after_steps is not None:
            self.plain_steps += int(hist_e.sum())
            return
        if self.hist_done_e is None:
            self.hist_done_e = np.zeros_like(hist_e)
        self.hist_done_e += hist_e

    def accepted_hist(self):
        """[E]: the finished rows' steps by tokens emitted, the plain phase's included."""
        if self.auto is None or self.auto.lookahead_hist is None:
            return self.hist_done_e
        hist = self.auto.lookahead_hist.sum(0).copy()
        hist[0] += self.plain_steps
        return hist

    # ------------------------------------------------------------------ auto

    def _lookahead_hist(self):
        """[1 + B, E]: the read results' histogram, then each occupied slot's."""
        (live,) = self._read("accept_hist")
        occupied = np.asarray([x is not None for x in self.active])
        rows = [self.hist_done_e if self.hist_done_e is not None else np.zeros(live.shape[1])]
        return np.concatenate([np.asarray(rows, live.dtype), live[occupied]], axis=0)

    def _watch(self) -> None:
        """auto: hand a losing lookahead over to plain decoding, mid-run, for every slot
        (the same state without the guess sources; buffers keep their sizes). The rows
        in flight keep their lookahead phase's counts (hist, sources)."""
        if self.auto is None or not self.auto.watching:
            return
        hist = self._lookahead_hist()
        steps = int(hist.sum()) // self.B  # the lookahead phase's device steps, about
        if not self.auto.gives_up(hist, steps):
            return
        occupied = [s for s, a in enumerate(self.active) if a is not None]
        self._count_rows(occupied)  # their lookahead phase, before the state loses it
        self.auto.after_steps, self.auto.lookahead_hist = steps, hist.sum(0, keepdims=True)
        self.spec = dataclasses.replace(self.spec, lookahead=None, min_slack=self.slack)
        self._set_shape(self.P)  # plain programs; the state has no guess sources now
        self.state = autotune.to_plain(self.state)
        if self.state_sh is not None:
            self.state = jax.device_put(self.state, self.state_sh)
        self.stats["config"]["lookahead_auto"]["switched_to_plain_after_steps"] = steps

    def record_acceptance(self) -> None:
        """auto: fold this run's lookahead acceptance into the model's running factor."""
        auto = self.auto
        if auto is None or auto.config is None or self.hist_done_e is None:
            return
        hist = auto.lookahead_hist if auto.lookahead_hist is not None else self.hist_done_e[None]
        compression, steps = autotune.hist_compression(hist)  # steps: row-steps, as generate's
        autotune.record_acceptance(self.model, auto.config, compression, steps, auto.sampling)
