"""The dataset engine: continuous batching with lookahead decoding in every slot.

B slots decode together on the device; a slot whose prompt ends is refilled with the
next prompt while the other slots keep decoding. The three verbs of JetStream's engine
interface, over this package's one decode path (decoding.start / run_loop, the same
DecodeState, compiled programs and auto policy as `lj.generate`):

    prefill   decoding.start on the prompts that go into free slots, those of one
              bucket together [n, P] (P: their power-of-two bucket; n: a power of two,
              padded with rows that are done at once): their K/V, first tokens and fresh
              guess sources (pool seeded from the prompt, recycling table, window drawn
              from the prompt)
    insert    those n rows written over their slots of the B-row state in one scatter,
              every field, so a slot's old K/V, tokens, counters and guesses are all
              replaced
    generate  decoding.run_loop over the B slots until a slot that was decoding finishes
              (while prompts wait), every slot is done, or `steps_per_call` steps ran

A slot's life:

    empty (done) --insert--> decoding --EOS or budget--> done --result read--> refilled

What lives on the device: the B-row DecodeState — K/V cache (L buffers [B, K, S, Dh]), token
buffer [B, S], per-row lengths, budgets, step counters, flags and PRNG keys, and the guess
sources' state (pool [B, V, C, N-1], recycling tables [B, V, k], window [B, N-1, W]).
The host holds the queue of prompts, which prompt sits in which slot, and the results;
it sees the device only between `generate` calls (one per finished slot at most, never
one per token).

Fixed shapes: the state's S = P + cap + E (a prompt bucket, the budget's bucket, the
widest step's emit). Prompts are taken shortest bucket first (stable within a bucket),
starting with P = the first prompt's bucket; a prompt of a longer bucket first grows the
state (`grow_slots`: the S axis padded, rows in flight untouched), so attention never spans
slots sized for the longest prompt of the dataset while short ones decode. A prompt of
bucket P' is prefilled with budget S - P' - E, so its state has the current S. New
programs: one prefill per prompt bucket and row count (`stats["prompt_buckets"]`), one
loop and one insert per S (`stats["cache_slots"]`). `max_prompt_tokens` fixes P for the whole run
(arrival order kept, no growth).

Exactness: a row's tokens depend only on its prompt, budget and PRNG key (decode_state.py,
sampling.py), and the key is fold_in(PRNGKey(seed), prompt key) — an integer id is its
own key, any other id a hash of its text — never the slot. So each prompt decodes to the
tokens of a plain decode of it alone, whatever slot it lands in and whatever else runs.

Per-prompt sampling settings: the sampling mode is static in a compiled step, so prompts
are grouped by (temperature, top_k, top_p) and the groups run one after another, each
with its own programs (results still stream out as they finish).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import time
from collections.abc import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding import autotune, programs
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState
from lookahead_jax.decoding.sampling import SamplingConfig, keys_for
from lookahead_jax.distributed import multihost, sharding
from lookahead_jax.engine import inputs
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.lookahead_config import LookaheadConfig, max_step_tokens
from lookahead_jax.models import kv_cache, seam


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt for the engine. Unset settings take the engine's."""

    prompt: object  # text, a list of chat messages ({"role", "content"}), or token ids
    id: int | str | None = None  # default: the prompt's index in the run
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


@dataclasses.dataclass
class Result:
    id: int | str
    token_ids: list[int]  # new tokens, cut at EOS (EOS not included)
    text: str | None  # decoded token_ids (None without a tokenizer)
    finish: str  # "eos" or "length"
    prompt_tokens: int
    steps: int  # forward passes after its prefill
    time_s: float  # wall time from its insert to its result


@dataclasses.dataclass(frozen=True)
class _Encoded:
    id: int | str
    ids: list[int]
    max_new: int
    sampling: SamplingConfig


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


def insert(state: DecodeState, fresh: DecodeState, slots_n) -> DecodeState:
    """The B-row `state` with its rows `slots_n` [n] replaced by the n rows of `fresh` (a
    prefill of n prompts), every field; a slot index >= B (a padding row) writes nothing.
    Every leaf's rows are its first axis (the K/V buffers' [B, K, S, Dh] too)."""
    return jax.tree.map(lambda big, small: big.at[slots_n].set(small, mode="drop"), state, fresh)


def grow_slots(state: DecodeState, slots: int) -> DecodeState:
    """The state with its S axis (token buffers [B, S], K/V buffers [B, K, S, Dh]) padded with
    zeros to `slots`. The new slots lie past every row's end, where nothing is read."""

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, slots - x.shape[axis])
        return jnp.pad(x, widths)

    cache = kv_cache.map_buffers(lambda x: pad(x, kv_cache.SLOTS_AXIS), state.cache)
    return dataclasses.replace(
        state, cache=cache, tokens=pad(state.tokens, 1), step_of_token=pad(state.step_of_token, 1)
    )


def empty_slots(fresh: DecodeState, batch: int) -> DecodeState:
    """A B-row state of `fresh`'s shapes (but its number of rows) whose every slot is done
    (nothing decodes)."""
    state = jax.tree.map(lambda x: jnp.repeat(x[:1], batch, axis=0), fresh)
    return dataclasses.replace(state, done=jnp.ones((batch,), bool))


def prefill_rows(n: int, batch: int) -> int:
    """How many rows a prefill of n prompts runs: a power of two (so that few programs are
    compiled), at most the batch."""
    return min(1 << max(n - 1, 0).bit_length(), batch)


_SMALL_PROGRAMS: dict = {}


def _small_program(fn, out_shardings, **jit_kw):
    """`fn` (insert, empty_slots, grow_slots) jitted once per process, output sharding and
    jit options, so that jax.jit's own cache compiles it once per shape across runs.
    (Their compilations, a fraction of a second each, are not in stats["compile_s"].)"""
    sh_key = None
    if out_shardings is not None:
        sh_key = (jax.tree.structure(out_shardings), tuple(jax.tree.leaves(out_shardings)))
        jit_kw["out_shardings"] = out_shardings
    key = (fn, sh_key, tuple(sorted((k, v) for k, v in jit_kw.items() if k != "out_shardings")))
    if key not in _SMALL_PROGRAMS:
        _SMALL_PROGRAMS[key] = jax.jit(fn, **jit_kw)
    return _SMALL_PROGRAMS[key]


class Engine:
    """Decode a stream of prompts with `batch` slots, refilling a slot as soon as its
    prompt ends. Example:

        engine = lj.Engine(model, batch=8, max_new_tokens=256, lookahead="auto")
        for r in engine.run(["Write a haiku", [1, 2, 3], lj.Request("Hi", id="a")]):
            print(r.id, r.text)                    # in finish order
        print(engine.stats["tokens_per_s"])

    lookahead: a LookaheadConfig, "auto" (chosen for this batch size from a cost curve
    measured at it, and called off mid-run if it does not pay) or None (plain).
    temperature / top_k / top_p / max_new_tokens: defaults for requests without their own.
    seed: prompt `id`'s noise is fold_in(PRNGKey(seed), prompt_key(id)).
    steps_per_call: the device loop returns to the host at least this often (progress,
    Ctrl-C) even when no slot finished.
    max_prompt_tokens: fix the prompt side of the run's shapes (longer prompts are
    refused), so that runs over other prompts reuse the same compiled programs; default:
    each run sizes for its longest prompt. The budget side is max_new_tokens (or a
    request's larger one), rounded up to a power of two.
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
        steps_per_call: int = 64,
        max_prompt_tokens: int | None = None,
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
        for name, value in (
            ("steps_per_call", steps_per_call),
            ("max_prompt_tokens", max_prompt_tokens),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise UserInputError(f"{name} must be an integer >= 1, got {value!r}")
        if lookahead not in (None, "auto") and not isinstance(lookahead, LookaheadConfig):
            raise UserInputError(
                "lookahead must be a LookaheadConfig, 'auto' or None, got " + repr(lookahead)
            )
        if isinstance(lookahead, LookaheadConfig):
            lookahead.check_fits(model.lm.max_context)
        self.model, self.batch, self.lookahead = model, batch, lookahead
        self.max_new_tokens, self.seed, self.chat = max_new_tokens, seed, chat
        self.sampling = SamplingConfig(float(temperature), top_k, top_p)
        self.steps_per_call = steps_per_call
        if max_prompt_tokens is not None:
            inputs.check_context(model.lm.max_context, max_prompt_tokens, max_new_tokens)
        self.max_prompt_tokens = max_prompt_tokens
        self.stats: dict = {}

    # ------------------------------------------------------------------ requests

    def encode(self, prompts: Iterable) -> list[_Encoded]:
        """Every prompt encoded and checked (ids unique, prompt + budget within the
        model's context) before anything runs."""
        out, seen = [], set()
        for i, p in enumerate(prompts):
            r = p if isinstance(p, Request) else Request(p)
            pid = i if r.id is None else r.id
            what = f"prompt {pid!r}"
            if isinstance(pid, np.integer):
                pid = int(pid)
            if not isinstance(pid, int | str) or isinstance(pid, bool):
                raise UserInputError(f"{what}: an id must be an integer or a string")
            if pid in seen:
                raise UserInputError(f"{what}: the id is used twice")
            seen.add(pid)
            ids = inputs.encode_prompt(
                self.model.tokenizer, self.model.lm.vocab_size, r.prompt, self.chat, what
            )
            max_new = self.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
            inputs.check_max_new_tokens(max_new)
            inputs.check_context(self.model.lm.max_context, len(ids), max_new)
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
            out.append(_Encoded(pid, ids, max_new, sampling))
        if not out:
            raise UserInputError("no prompts to decode")
        if multihost.is_multiprocess():  # every process runs the same rounds
            blob = repr([(r.id, r.ids, r.max_new, r.sampling) for r in out]).encode()
            digest = int.from_bytes(hashlib.sha256(blob).digest()[:4], "little") >> 1  # int32
            multihost.agree(digest, "prompts (all of them, in the same order)")
        return out

    # ------------------------------------------------------------------ running

    def run(self, prompts: Iterable) -> Iterator[Result]:
        """Decode every prompt (text, chat messages, token ids or Request); yield each
        Result as its prompt finishes. Every prompt is checked here, before this returns
        (bad input raises UserInputError at once, not at the first result). `self.stats`
        is complete once the iterator is exhausted."""
        return self._run(self.encode(prompts))

    def _run(self, requests: list[_Encoded]) -> Iterator[Result]:
        fixed_P = None if self.max_prompt_tokens is None else inputs.bucket(self.max_prompt_tokens)
        cap = inputs.bucket(max(self.max_new_tokens, *(r.max_new for r in requests)))
        groups: dict[SamplingConfig, list[_Encoded]] = {}
        for r in requests:
            groups.setdefault(r.sampling, []).append(r)
        self.stats = {
            "prompts": 0,
            "new_tokens": 0,
            "row_steps": 0,
            "rounds": 0,
            "compile_s": 0.0,
            "prompt_buckets": [],
            "prefill_calls": 0,
            "cache_slots": [],
            "batch": self.batch,
            "groups": [],
        }
        t0 = time.perf_counter()
        for sampling, group in groups.items():
            yield from _GroupRun(self, sampling, group, fixed_P, cap).run()
        wall = time.perf_counter() - t0
        s = self.stats
        s["wall_s"] = wall
        s["tokens_per_s"] = s["new_tokens"] / wall if wall > 0 else 0.0
        s["compression"] = s["new_tokens"] / max(s["row_steps"], 1)


class _GroupRun:
    """One sampling mode's prompts through the slots (see the module docstring)."""

    def __init__(self, engine: Engine, sampling, requests, fixed_P: int | None, cap: int):
        model = engine.model
        self.engine, self.model, self.B = engine, model, engine.batch
        if fixed_P is None:  # shortest bucket first: the cache grows once per bucket at most
            requests = sorted(requests, key=lambda r: inputs.bucket(len(r.ids)))
        self.queue = collections.deque(requests)
        self.auto = None
        lookahead = engine.lookahead
        if lookahead == "auto":
            self.auto = autotune.AutoRun(
                model, sampling, max_step_tokens(model.lm.max_context), batch=self.B
            )
            lookahead = self.auto.config
        self.spec = DecodeSpec(
            lm=model.lm,
            sampling=sampling,
            eos_ids=tuple(model.eos_ids),
            lookahead=lookahead,
            cache_dtype=jnp.dtype(model.dtype).name,
        )
        self.slack = self.spec.max_emit
        self.cap = cap
        self.slots: list = [None] * self.B  # (request, insert time) per slot
        self.hist_done = None  # accepted-length histogram of results read [E]
        self.state = None
        self._set_shape(fixed_P or inputs.bucket(len(self.queue[0].ids)))
        engine.stats["groups"].append(
            {
                "sampling": sampling.describe(),
                "prompts": len(requests),
                "lookahead": None if lookahead is None else lookahead.describe(),
                "auto": None if self.auto is None else self.auto.choice.describe(),
            }
        )

    def _set_shape(self, P: int) -> None:
        """Programs for the state of prompt side P: S = P + cap + slack (the loop compiled
        now, the insert at its first use)."""
        self.P = P
        self.loop_args = (
            self.model.params,
            jax.ShapeDtypeStruct((self.B, P), jnp.int32),
            *(jax.ShapeDtypeStruct((self.B,), jnp.int32) for _ in range(2)),
            jax.ShapeDtypeStruct((self.B, 2), jnp.uint32),
        )
        self.loop = self._compiled(self.spec, self.cap, self.loop_args, "run_loop")
        shape = self._state_shape(self.spec)
        mesh = self.model.mesh
        self.state_sh = None if mesh is None else sharding.state_shardings(shape, mesh)
        self.insert = _small_program(insert, self.state_sh, donate_argnums=0)
        self.slots_S = shape.tokens.shape[1]
        self.engine.stats["cache_slots"].append(self.slots_S)

    def _grow(self, P: int) -> None:
        """Move to a longer prompt side P: the rows in flight keep decoding in a state
        whose S axis is padded (the new slots lie past every row's end)."""
        self._set_shape(P)
        if self.state is not None:
            grow = _small_program(grow_slots, self.state_sh, static_argnums=1)
            self.state = grow(self.state, self.slots_S)

    def _state_shape(self, spec):
        """The B-row state's shapes under `spec`."""
        from lookahead_jax import decoding

        fn = functools.partial(decoding.start, spec=spec, max_new_cap=self.cap)
        return jax.eval_shape(fn, *self.loop_args)

    def _compiled(self, spec, cap, args, name):
        exe, secs = programs.compiled(self.model, spec, cap, args, name)
        self.engine.stats["compile_s"] += secs
        return exe

    def _prefill(self, P: int, requests: list[_Encoded]) -> DecodeState:
        """One prefill of the prompts of bucket P, padded to `prefill_rows` rows (a padding
        row has a budget of 0: done at once)."""
        n = prefill_rows(len(requests), self.B)
        prompt = np.zeros((n, P), np.int32)
        prompt_len, max_new = np.ones((n,), np.int32), np.zeros((n,), np.int32)
        for i, r in enumerate(requests):
            prompt[i, : len(r.ids)] = r.ids
            prompt_len[i], max_new[i] = len(r.ids), r.max_new
        keys = [prompt_key(r.id) for r in requests] + [0] * (n - len(requests))
        rows = (prompt, prompt_len, max_new, np.asarray(keys_for(self.engine.seed, keys)))
        mesh = self.model.mesh
        if mesh is not None:  # where the start program takes them: rows over `data`
            rows = tuple(multihost.replicated(mesh, a, sharding.batch_major(a, mesh)) for a in rows)
        args = (self.model.params, *rows)
        buckets = self.engine.stats["prompt_buckets"]
        if P not in buckets:
            buckets.append(P)
        self.engine.stats["prefill_calls"] += 1
        # the budget that gives this bucket's state the state's S = self.P + cap + slack
        start = self._compiled(self.spec, self.P + self.cap - P, args, "start")
        return start(*args)

    def _fill(self) -> None:
        """Prefill the queue's next prompts into the free slots: one prefill per prompt
        bucket among them, then one insert of its rows."""
        free = [s for s in range(self.B) if self.slots[s] is None]
        taken = [self.queue.popleft() for _ in range(min(len(free), len(self.queue)))]
        if not taken:
            return
        longest = max(inputs.bucket(len(r.ids)) for r in taken)
        if longest > self.P:
            self._grow(longest)
        by_bucket: dict[int, list] = {}
        for s, r in zip(free, taken, strict=False):  # the first len(taken) free slots
            by_bucket.setdefault(inputs.bucket(len(r.ids)), []).append((s, r))
        for P, placed in by_bucket.items():
            fresh = self._prefill(P, [r for _, r in placed])
            if self.state is None:
                empty = _small_program(empty_slots, self.state_sh, static_argnums=1)
                self.state = empty(fresh, self.B)
            slots = np.full((fresh.done.shape[0],), self.B, np.int32)  # padding: dropped
            slots[: len(placed)] = [s for s, _ in placed]
            self.state = self.insert(self.state, fresh, slots)
            now = time.perf_counter()
            for s, r in placed:
                self.slots[s] = (r, now)

    def run(self) -> Iterator[Result]:
        stats = self.engine.stats
        while True:
            self._fill()
            if all(x is None for x in self.slots):
                break
            done = multihost.all_rows(self.state.done)
            finished = [s for s, x in enumerate(self.slots) if x is not None and done[s]]
            if finished:
                yield from self._read(finished)
                continue
            self.state = self.loop(
                self.model.params,
                self.state,
                jnp.int32(self.engine.steps_per_call),
                jnp.bool_(bool(self.queue)),
            )
            stats["rounds"] += 1
            self._watch()
        self._record_acceptance()

    def _read(self, finished: list[int]) -> Iterator[Result]:
        fields = (
            self.state.tokens,
            self.state.prompt_len,
            self.state.n_out,
            self.state.max_new,
            self.state.steps,
            self.state.accept_hist,
        )
        tokens, prompt_len, n_out, max_new, steps, hist = map(multihost.all_rows, fields)
        now = time.perf_counter()
        stats = self.engine.stats
        tokenizer = self.model.tokenizer
        for s in finished:
            r, t_insert = self.slots[s]
            self.slots[s] = None
            self._add_hist(hist[s])
            new = tokens[s, prompt_len[s] : prompt_len[s] + n_out[s]].tolist()
            stats["prompts"] += 1
            stats["new_tokens"] += len(new)
            stats["row_steps"] += int(steps[s])
            yield Result(
                id=r.id,
                token_ids=new,
                text=None if tokenizer is None else tokenizer.decode(new),
                finish="length" if n_out[s] >= max_new[s] else "eos",
                prompt_tokens=len(r.ids),
                steps=int(steps[s]),
                time_s=now - t_insert,
            )

    def _add_hist(self, hist_e) -> None:
        """Count a finished row's accepted-length histogram [E] into the lookahead phase's
        (the plain phase after auto's hand-over is not counted)."""
        if self.auto is not None and self.auto.after_steps is not None:
            return
        if self.hist_done is None:
            self.hist_done = np.zeros_like(hist_e)
        self.hist_done += hist_e

    def _lookahead_hist(self):
        """[1 + B, E]: the read results' histogram, then each occupied slot's."""
        live = multihost.all_rows(self.state.accept_hist)
        occupied = np.asarray([x is not None for x in self.slots])
        rows = [self.hist_done if self.hist_done is not None else np.zeros(live.shape[1])]
        return np.concatenate([np.asarray(rows, live.dtype), live[occupied]], axis=0)

    def _watch(self) -> None:
        """auto: hand a losing lookahead over to plain decoding, mid-run, for every slot
        (the same state without the guess sources; buffers keep their sizes)."""
        if self.auto is None or not self.auto.watching:
            return
        hist = self._lookahead_hist()
        steps = int(hist.sum()) // self.B  # the lookahead phase's device steps, about
        if not self.auto.gives_up(hist, steps):
            return
        self.auto.after_steps, self.auto.lookahead_hist = steps, hist.sum(0, keepdims=True)
        self.spec = dataclasses.replace(self.spec, lookahead=None, min_slack=self.slack)
        self._set_shape(self.P)  # plain programs; the state has no guess sources now
        self.state = autotune.to_plain(self.state)
        if self.state_sh is not None:
            self.state = jax.device_put(self.state, self.state_sh)
        self.engine.stats["groups"][-1]["switched_to_plain_after_steps"] = steps

    def _record_acceptance(self) -> None:
        """auto: fold this run's lookahead acceptance into the model's running factor."""
        auto = self.auto
        if auto is None or auto.config is None or self.hist_done is None:
            return
        hist = auto.lookahead_hist if auto.lookahead_hist is not None else self.hist_done[None]
        compression, steps = autotune.hist_compression(hist)  # steps: row-steps, as generate's
        autotune.record_acceptance(self.model, auto.config, compression, steps, auto.sampling)
