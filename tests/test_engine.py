"""The dataset engine (engine/continuous.py): each prompt's tokens equal a plain decode of it alone.

Float64 tiny model, so any difference is a bug. The reference is one static plain batch
through lj.generate (row b's noise is keyed by b, as the engine keys prompt id b); a
prompt with a smaller budget must give the prefix of its reference row. Prompts of very
different lengths (two prompt buckets), budgets from 1 up, an EOS that ends rows
mid-way, arrival orders shuffled, several batch sizes.
"""

import dataclasses
import functools
import gc
import itertools
import os
import re
import signal
import threading
import time
import types
from collections import Counter

import jax
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.decoding import autotune
from lookahead_jax.engine import interrupts, prefill_args, prefill_planning
from lookahead_jax.engine.inputs import bucket
from lookahead_jax.engine.prefill_planning import PrefillPlanner
from lookahead_jax.engine.round_choice import RoundChoice
from lookahead_jax.engine.scheduler import Scheduler
from lookahead_jax.models import seam
from tests import tiny
from tests.helpers import accepted_guesses, engine_packs_ragged, random_prompts, with_eos

MAX_NEW = 16
SEED = 3
# 1..40 tokens: prompt buckets 16, 32 and 64
PROMPTS = random_prompts(9, tiny.VOCAB, 1, 40, seed=31)
PROMPTS[0] = PROMPTS[0][:1]
BUDGETS = [MAX_NEW, 1, 7, MAX_NEW, 13, 2, MAX_NEW, 9, MAX_NEW]


@pytest.fixture(scope="module")
def model64(tiny_ckpts):
    """The tiny float64 model with an EOS that its plain greedy outputs emit mid-way."""
    with jax.enable_x64(True):
        model = with_eos(lj.load(tiny_ckpts["gqa"][1], dtype="float64"), ())
        out = lj.generate(model, PROMPTS, max_new_tokens=MAX_NEW, lookahead=None)
        eos = Counter(t for row in out.token_ids for t in row[2:10]).most_common(1)[0][0]
        yield with_eos(model, (eos,))


_REFERENCES: dict = {}


def reference(model, temperature: float) -> list[list[int]]:
    """Each prompt's plain decode (static batch; row b keyed by b), cached per model."""
    key = (id(model), temperature)
    if key not in _REFERENCES:
        with jax.enable_x64(True):
            _REFERENCES[key] = lj.generate(
                model,
                PROMPTS,
                max_new_tokens=MAX_NEW,
                temperature=temperature,
                seed=SEED,
                lookahead=None,
            ).token_ids
    return _REFERENCES[key]


def check_against_reference(model, results, temperature: float) -> None:
    ref = reference(model, temperature)
    assert sorted(r.id for r in results) == list(range(len(PROMPTS)))
    ended_by_eos = 0
    for r in results:
        want = ref[r.id][: BUDGETS[r.id]]
        assert r.token_ids == want, (r.id, r.token_ids, want)
        finish = "eos" if len(ref[r.id]) < BUDGETS[r.id] else "length"
        assert r.finish == finish, r
        assert r.prompt_tokens == len(PROMPTS[r.id])
        ended_by_eos += finish == "eos"
    if temperature == 0:  # the EOS (picked from greedy outputs) really ends rows mid-way
        assert ended_by_eos >= 1


def requests(order_seed: int) -> list[lj.Request]:
    order = np.random.default_rng(order_seed).permutation(len(PROMPTS))
    return [lj.Request(PROMPTS[i], id=int(i), max_new_tokens=BUDGETS[i]) for i in order]


LONGEST = max(map(len, PROMPTS))
CASES = [  # (lookahead, batch, temperature, max_prompt_tokens: None = inputs.offline_order,
    # row_buckets: True = every round at the smallest row bucket, its rows gathered)
    (None, 2, 0.0, None, "auto"),
    (lj.LookaheadConfig.for_tokens(8), 3, 0.0, None, "auto"),  # (the smaller tree beside
    # tokens=16, the CPU's default, at batches 1 and 4 below)
    (lj.LookaheadConfig.for_tokens(16), 1, 0.0, LONGEST, "auto"),
    (lj.LookaheadConfig.for_tokens(16), 4, 0.9, LONGEST, True),
]


@pytest.mark.parametrize("lookahead,batch,temperature,max_prompt,row_buckets", CASES)
def test_engine_equals_plain_decoding_alone(
    model64, lookahead, batch, temperature, max_prompt, row_buckets
):
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64,
            batch=batch,
            max_new_tokens=MAX_NEW,
            lookahead=lookahead,
            temperature=temperature,
            seed=SEED,
            steps_per_call=5,
            max_prompt_tokens=max_prompt,
            row_buckets=row_buckets,
        )
        results = list(engine.run(requests(order_seed=batch)))
    check_against_reference(model64, results, temperature)
    stats = engine.stats
    if row_buckets is True:  # the tail ran at fewer rows: a row's tokens do not depend
        assert min(stats.rounds_by_rows) < batch, stats.rounds_by_rows  # on them
    if lookahead is not None:  # not vacuous: guesses were accepted, greedy and sampled
        assert accepted_guesses(stats) > 0
    else:  # a plain step emits one token: the prefill's first is not a step's
        assert accepted_guesses(stats) == 0 and stats.compression == 1.0
    assert stats.prompts == len(PROMPTS)
    assert stats.new_tokens == sum(len(r.token_ids) for r in results)
    assert sorted(stats.prompt_buckets) == sorted({bucket(len(p)) for p in PROMPTS})
    if batch < len(PROMPTS):  # slots were refilled while others decoded
        assert stats.rounds > 1
    if batch > 1 and engine_packs_ragged():  # the first admission's prompts ran packed
        assert any(shape.endswith("ragged") for shape in stats.prefill_shapes), stats.prefill_shapes
    # one S for the run: longest first sets it where the attention reads by row (the
    # CPU), or max_prompt_tokens; else one per prompt bucket, shortest first
    by_row = seam.reads_cache_by_row(model64.lm)
    grown = 1 if max_prompt or by_row else len(stats.prompt_buckets)
    assert len(stats.cache_positions) == grown, stats.cache_positions
    assert stats.cache_positions == sorted(stats.cache_positions)


def test_generate_is_one_engine_run_and_shares_its_programs(model64):
    """lj.generate runs a batch through the engine (a slot per prompt; one prefill that is
    the state, or where the worker's earlier tests compiled a one-row prefill of these
    shapes, one a prompt rather than a compile: prefill_shapes.py): an Engine of the same
    shapes makes the same cut, reuses its programs and gives the same tokens, and the
    steps that emitted them."""
    longest = max(len(p) for p in PROMPTS)
    with jax.enable_x64(True):
        out = lj.generate(model64, PROMPTS, max_new_tokens=MAX_NEW, seed=SEED, lookahead=None)
        shapes = dict(batch=len(PROMPTS), max_new_tokens=MAX_NEW, max_prompt_tokens=longest)
        engine = lj.Engine(model64, lookahead=None, seed=SEED, **shapes)
        results = sorted(engine.run(PROMPTS), key=lambda r: r.id)
    assert out.stats.prefill_calls == engine.stats.prefill_calls in (1, len(PROMPTS))
    assert out.stats.prefill_shapes == engine.stats.prefill_shapes
    assert engine.stats.compile_s == 0.0
    assert [r.token_ids for r in results] == out.token_ids
    assert [r.step_of_token for r in results] == out.step_of_token
    assert out.stats.new_tokens == sum(map(len, out.token_ids)) > 0


def test_a_run_frees_its_device_state_by_reference_counting(model64):
    """What an engine run and a generate call put on the device is freed when they are
    done, without Python's cyclic collector: a cycle through the slots' planner kept each
    call's state (1.2 GB at 1024 rows) until that collector happened to run, and a
    process calling generate in a loop grew by a state a call."""

    def run():
        la = CASES[1][0]  # the shapes of test_engine_equals_plain_decoding_alone's
        engine = lj.Engine(
            model64, batch=3, max_new_tokens=MAX_NEW, lookahead=la, seed=SEED, steps_per_call=5
        )
        assert len(list(engine.run(requests(order_seed=3)))) == len(PROMPTS)
        lj.generate(model64, PROMPTS, max_new_tokens=MAX_NEW, seed=SEED, lookahead=None)

    with jax.enable_x64(True):
        run()  # programs, and whatever a first run keeps for the next
        gc.collect()
        kept = jax.live_arrays()  # held: no new array can take a kept one's id
        before = {id(a) for a in kept}
        gc.disable()
        try:
            run()
            left = [a.shape for a in jax.live_arrays() if id(a) not in before]
        finally:
            gc.enable()
    assert left == []


def test_a_round_reads_the_device_twice(model64, monkeypatch):
    """The host reads the slots once before a decode round and once after it, each one
    packed array (engine/round_read.py), not field by field (a round read ten arrays)."""
    from lookahead_jax.distributed import multihost

    reads = []
    all_rows = multihost.all_rows
    monkeypatch.setattr(multihost, "all_rows", lambda a: reads.append(a.shape) or all_rows(a))
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64, batch=4, max_new_tokens=MAX_NEW, lookahead=None, seed=SEED, steps_per_call=5
        )
        results = list(engine.run(PROMPTS[:6]))
    assert len(results) == 6 and engine.stats.rounds > 2
    assert len(reads) <= 2 * engine.stats.rounds + 2, (len(reads), engine.stats.rounds)
    assert all(len(shape) == 2 for shape in reads)  # [B, K]: rows by packed fields


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="Ctrl-C is held only in the main thread",
)
@pytest.mark.parametrize("between_rounds", [False, True], ids=["in_a_round", "between_rounds"])
def test_ctrl_c_in_generate_returns_the_tokens_decoded_so_far(model64, monkeypatch, between_rounds):
    """Ctrl-C during lj.generate ends the run after the round it lands in (sent by its own
    stream callback, inside a round's held block) or after the next (sent between two
    rounds' blocks: held too, by the whole run's): GenerationInterrupted carries each
    row's tokens so far, a prefix of the full decode, all of them streamed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    streamed = [[] for _ in PROMPTS]

    def ctrl_c_once_under_way():
        if sum(map(len, streamed)) > 2 * len(PROMPTS) and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    def stream(new):
        for b, tokens in enumerate(new):
            streamed[b] += tokens
        if not between_rounds:
            ctrl_c_once_under_way()

    def advance_then_ctrl_c(scheduler):
        out = held_advance(scheduler)
        ctrl_c_once_under_way()  # after the round's own held block
        return out

    sent, held_advance = [], Scheduler.held_advance
    if between_rounds:
        monkeypatch.setattr(Scheduler, "held_advance", advance_then_ctrl_c)
    caught = None
    try:
        with jax.enable_x64(True):
            lj.generate(
                model64, PROMPTS, max_new_tokens=MAX_NEW, seed=SEED, lookahead=None, stream=stream
            )
    except KeyboardInterrupt as e:  # (a plain one would end pytest: caught, then asserted)
        caught = e
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent and isinstance(caught, lj.GenerationInterrupted), f"the Ctrl-C ended in {caught!r}"
    partial, full = caught.partial, reference(model64, 0.0)
    assert partial.stats.interrupted
    assert partial.token_ids == streamed
    assert all(full[b][: len(tokens)] == tokens for b, tokens in enumerate(partial.token_ids))
    assert 2 * len(PROMPTS) < sum(map(len, partial.token_ids)) < sum(map(len, full))


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="Ctrl-C is held only in the main thread",
)
def test_held_blocks_nest_and_give_the_handler_back():
    """interrupts.held: a Ctrl-C in the block is held and reported; a block inside another
    reports the outer one's (the flag lj.generate's next round reads); Python's handler is
    back after the outermost, an exception's too; another thread's block holds nothing
    and never takes the main thread's flag."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    in_thread = []

    def thread_block():
        with interrupts.held() as ctrl_c:
            in_thread.append(ctrl_c)

    try:
        with interrupts.held() as outer:
            os.kill(os.getpid(), signal.SIGINT)  # held: no KeyboardInterrupt
            with interrupts.held() as inner:
                assert inner is outer and inner.pressed
            thread = threading.Thread(target=thread_block)
            thread.start()
            thread.join()
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert len(in_thread) == 1 and in_thread[0] is not outer and not in_thread[0].pressed
        with pytest.raises(ValueError), interrupts.held():
            raise ValueError
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_auto_handing_over_to_plain_mid_run_stays_exact(model64, monkeypatch, tmp_path):
    """auto's guard calls a losing lookahead off in the middle of a run, with slots
    mid-decode and prompts still queued: every prompt's tokens are still exact."""
    monkeypatch.setenv("LOOKAHEAD_JAX_CACHE", str(tmp_path))
    config = lj.LookaheadConfig.for_tokens(8)
    monkeypatch.setattr(
        autotune,
        "choose",
        lambda *a, **k: autotune.Choice(config, 2.0, 50.0, 2.0, {}),  # costs 50 plain steps
    )
    monkeypatch.setattr(
        autotune, "Guard", functools.partial(autotune.Guard, warmup_steps=4, window_steps=2)
    )
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64,
            batch=3,
            max_new_tokens=MAX_NEW,
            lookahead="auto",
            seed=SEED,
            max_prompt_tokens=LONGEST,
        )
        results = list(engine.run(requests(order_seed=7)))
    config_used = engine.stats.config
    assert config_used.lookahead.name == config.name
    assert config_used.switched_to_plain_after_steps is not None
    check_against_reference(model64, results, 0.0)


def test_per_prompt_sampling_settings_share_one_batch(model64):
    """Greedy and sampled prompts decode side by side in one batch and one program (the
    settings are per row, on the device): each prompt gets the tokens of a decode at its
    own temperature, lookahead guesses included."""
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64,
            batch=4,
            max_new_tokens=MAX_NEW,
            lookahead=lj.LookaheadConfig.for_tokens(16),
            seed=SEED,
            max_prompt_tokens=LONGEST,
        )
        reqs = [
            dataclasses.replace(r, temperature=0.9) if r.id % 2 else r
            for r in requests(order_seed=1)
        ]
        results = {r.id: r.token_ids for r in engine.run(reqs)}
    greedy, sampled = reference(model64, 0.0), reference(model64, 0.9)
    for i, tokens in results.items():
        assert tokens == (sampled if i % 2 else greedy)[i][: BUDGETS[i]]
    assert engine.stats.config.sampled
    assert accepted_guesses(engine.stats) > 0


def test_online_requests_while_it_decodes(model64, monkeypatch, tmp_path):
    """Requests submitted between rounds join the slots as they free up; listeners get
    every committed token once, in order; a seeded request gets the tokens of a lone
    sampled decode with that seed; a cancelled one ends at once with what it had. auto
    (its layout fixed here) runs lookahead and plain rounds over the same state, one
    after the other here: the tokens stay exact."""
    ref_greedy, ref_sampled = reference(model64, 0.0), reference(model64, 0.9)
    updates: dict = {}
    monkeypatch.setenv("LOOKAHEAD_JAX_CACHE", str(tmp_path))
    config = lj.LookaheadConfig.for_tokens(16)
    choice = autotune.Choice(config, 2.0, 1.0, 2.0, {})
    monkeypatch.setattr(autotune, "choose", lambda *a, **k: choice)
    modes = itertools.cycle([False, True])  # lookahead, plain, lookahead, ...
    monkeypatch.setattr(RoundChoice, "choose", lambda self, R, rows: (next(modes), False))

    def listener(update):
        updates.setdefault(update.id, []).append(update)

    with jax.enable_x64(True):
        engine = lj.Engine(
            model64,
            batch=3,
            max_new_tokens=MAX_NEW,
            lookahead="auto",
            seed=SEED,
            max_prompt_tokens=LONGEST,
            stream_steps=2,
        )
        for i in range(4):  # a queue from the start
            engine.submit(lj.Request(PROMPTS[i], id=i, max_new_tokens=BUDGETS[i]), listener)
        engine.submit(  # row 0's noise of the reference: its own seed, key 0
            lj.Request(PROMPTS[0], id="seeded", seed=SEED, temperature=0.9), listener
        )
        # 0, 1, 2 went in; 1 (a budget of 1 token) ended with its prefill's token, and 3
        # took its slot before the round decoded (as many waited as rows decoded: _admit)
        assert engine.round() and engine.slots_in_use == 3
        engine.submit(lj.Request(PROMPTS[5], id=5, max_new_tokens=MAX_NEW), listener)
        engine.cancel(3)  # queued or decoding by now: ends "cancelled" either way
        rounds = 1
        while engine.round():
            rounds += 1
    assert rounds > 2 and engine.slots_in_use == 0 and engine.queued == 0
    results = {i: u[-1].result for i, u in updates.items()}
    assert all(u.result is None for ups in updates.values() for u in ups[:-1])
    for i, ups in updates.items():  # the streamed pieces add up to the result
        assert [t for u in ups for t in u.token_ids] == results[i].token_ids, i
    for i in (0, 1, 2):
        assert results[i].token_ids == ref_greedy[i][: BUDGETS[i]]
    assert results[5].token_ids == ref_greedy[5]
    assert results["seeded"].token_ids == ref_sampled[0]
    assert results[3].finish == "cancelled"
    assert results[3].token_ids == ref_greedy[3][: len(results[3].token_ids)]
    assert engine.stats.accepted_tokens > 0  # guesses landed
    assert engine.stats.config.lookahead.name == config.name
    per_round = engine.stats.per_round.values()  # both kinds of round ran
    assert sum(modes.get("plain", {}).get("rounds", 0) for modes in per_round) > 0
    assert sum(modes.get("lookahead", {}).get("rounds", 0) for modes in per_round) > 0


def results_into(results: dict):
    """A listener that keeps each request's Result in `results`, by id."""

    def listener(update):
        if update.result is not None:
            results[update.id] = update.result

    return listener


def test_offline_order_is_longest_first_where_the_attention_reads_by_row():
    """inputs.offline_order: longest first for a model whose attention reads each row's
    cache as far as it goes (one S for the run), shortest bucket first for one that reads
    the whole S every step; ties (and a bucket's prompts) in arrival order."""
    from types import SimpleNamespace

    from lookahead_jax.engine.inputs import offline_order

    lengths = [5, 40, 17, 3, 40, 30]
    reqs = [SimpleNamespace(ids=[1] * n, id=i) for i, n in enumerate(lengths)]
    by_row, whole = SimpleNamespace(attention_block=64), SimpleNamespace(attention_block=0)
    assert [r.id for r in offline_order(reqs, by_row)] == [1, 4, 5, 2, 0, 3]
    assert [r.id for r in offline_order(reqs, whole)] == [0, 3, 2, 5, 1, 4]  # 16, 32, 64
    assert [r.id for r in offline_order(reqs, object())] == [0, 3, 2, 5, 1, 4]


def test_an_online_state_grows_under_the_rows_in_flight(model64):
    """Online without max_prompt_tokens, a prompt of a longer bucket grows the state (its
    S axis padded) while a row decodes: both rows get their lone plain decodes' tokens."""
    ref = reference(model64, 0.0)
    # the shortest prompt whose decode runs its whole budget (no EOS), and the longest
    short = min(
        (i for i in range(len(PROMPTS)) if len(ref[i]) == MAX_NEW), key=lambda i: len(PROMPTS[i])
    )
    long_ = max(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i]))
    assert bucket(len(PROMPTS[long_])) > bucket(len(PROMPTS[short]))
    results: dict = {}
    listener = results_into(results)
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64, batch=2, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2
        )
        engine.submit(lj.Request(PROMPTS[short], id=short), listener)
        assert engine.round() and engine.slots_in_use == 1  # it decodes on
        engine.submit(lj.Request(PROMPTS[long_], id=long_), listener)
        while engine.round():
            pass
    assert {i: r.token_ids for i, r in results.items()} == {i: ref[i] for i in (short, long_)}
    assert len(engine.online_stats.cache_positions) == 2, engine.online_stats.cache_positions


def test_a_failing_device_call_fails_the_requests_in_flight_then_serves(model64, monkeypatch):
    """A prefill that raises (a device fault) ends the requests being admitted and those
    waiting with finish "error", their listeners told; the next round serves afresh."""
    from lookahead_jax.engine.device_slots import DeviceSlots

    real, failed = DeviceSlots.prefill, []

    def prefill_failing_once(self, requests, *args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("device lost")
        return real(self, requests, *args, **kwargs)

    monkeypatch.setattr(DeviceSlots, "prefill", prefill_failing_once)
    ends: dict = {}
    listener = results_into(ends)
    with jax.enable_x64(True):
        engine = lj.Engine(
            model64, batch=3, max_new_tokens=MAX_NEW, lookahead=None, max_prompt_tokens=LONGEST
        )
        for i in range(4):  # three go into slots, one waits
            engine.submit(lj.Request(PROMPTS[i], id=i), listener)
        with pytest.raises(RuntimeError, match="device lost"):
            engine.round()
        assert sorted(ends) == [0, 1, 2, 3] and {r.finish for r in ends.values()} == {"error"}
        assert engine.queued == 0 and engine.slots_in_use == 0
        engine.submit(lj.Request(PROMPTS[5], id=5), listener)
        while engine.round():
            pass
    assert ends[5].finish != "error"
    assert ends[5].token_ids == reference(model64, 0.0)[5]


def test_requests_that_come_in_during_an_admission_go_in_before_its_round(model64, monkeypatch):
    """Online: requests submitted while an admission's prefill runs are admitted before
    the round decodes, where slots are free and as many wait as rows decode (a burst's
    first chat came alone, and the fifteen others waited out its round), and get the
    tokens of their lone plain decodes; a lone arrival beside more decoding rows waits."""
    ref = reference(model64, 0.0)
    first_at: dict = {}  # request -> decode rounds run when its first tokens came
    results: dict = {}
    collect = results_into(results)

    def listen(update):
        first_at.setdefault(update.id, engine.online_stats.rounds)
        collect(update)

    drain, arrive = lj.Engine._drain, {2: (1, 2, 3), 3: (4,)}  # drain call -> who came in
    calls = []

    def drain_and_arrive(self, scheduler):
        calls.append(len(calls) + 1)
        for i in arrive.get(calls[-1], ()):
            self.submit(lj.Request(PROMPTS[i], id=i), listen)
        drain(self, scheduler)

    monkeypatch.setattr(lj.Engine, "_drain", drain_and_arrive)
    with jax.enable_x64(True):
        engine = lj.Engine(model64, batch=8, max_new_tokens=MAX_NEW, lookahead=None)
        engine.submit(lj.Request(PROMPTS[0], id=0), listen)
        # admits 0; 1-3 come in during it (drain 2): in before the decode; 4 comes in
        # during theirs (drain 3), alone beside 4 rows decoding: in at the next round
        engine.round()
        assert first_at == {0: 0, 1: 0, 2: 0, 3: 0}, first_at
        while engine.round():
            pass
    assert first_at[4] == 1
    assert {i: r.token_ids for i, r in results.items()} == {i: ref[i] for i in range(5)}


def test_an_offline_run_leaves_the_online_stats_alone(model64):
    """The online rounds count in `online_stats` (what /metrics reads): an offline run on
    a serving engine counts in its own `stats`, and the online counts go on after it."""
    with jax.enable_x64(True):  # (the shapes of the test above; offline sampled as online)
        engine = lj.Engine(
            model64, batch=3, max_new_tokens=MAX_NEW, lookahead=None, max_prompt_tokens=LONGEST,
            sampled=True,
        )  # fmt: skip
        online = engine.online_stats
        engine.submit(lj.Request(PROMPTS[5], id=5))
        while engine.round():
            pass
        assert [r.token_ids for r in engine.run([PROMPTS[4]])] == [reference(model64, 0.0)[4]]
        assert engine.stats is not online and engine.stats.prompts == 1
        engine.submit(lj.Request(PROMPTS[4], id=4))
        while engine.round():
            pass
    assert engine.online_stats is online and online.prompts == 2


def test_after_warm_up_the_first_requests_compile_nothing(model64, monkeypatch):
    """Engine.warm_up (the server's) compiles what the first requests use: the loops, and
    one row's prefill at WARM_SIDE (here the state's prompt side) from scratch and past
    cached blocks, which shorter prompts pad to (each compiled its own before: 2-6 s of
    a server's first chats), and every row's short turn past cached blocks (a burst of
    chats behind one system prompt ran as one-row prefills), as suffixes and in one pass
    after the blocks they share; and a prompt asked again, alone or by every row, past
    all its full blocks."""
    longest = max(PROMPTS, key=len)
    # (the burst could run from scratch as warm-up's ragged pass: that rule's tests are
    # test_ragged_prefill.py's; this one is of the shapes past cached blocks)
    monkeypatch.setattr(PrefillPlanner, "ragged_instead", lambda *args, **kwargs: None)
    shared_pays = PrefillPlanner.shared_pays
    monkeypatch.setattr(PrefillPlanner, "shared_pays", lambda *args: False)
    bursts = []

    def burst(prompts):  # the prefill shapes they ran at, submitted together
        shapes = dict(engine.online_stats.prefill_shapes)
        for prompt in prompts:
            engine.submit(lj.Request(prompt, max_new_tokens=4))
        while engine.round():
            pass
        ran = engine.online_stats.prefill_shapes.items()
        bursts.append({k: n - shapes.get(k, 0) for k, n in ran if n > shapes.get(k, 0)})

    with jax.enable_x64(True):  # (the shapes of the tests above, with the prefix cache)
        engine = lj.Engine(
            model64, batch=3, max_new_tokens=MAX_NEW, lookahead=None, max_prompt_tokens=LONGEST,
            sampled=True, prefix_cache_mb=1,
        )  # fmt: skip
        engine.warm_up(lj.Request([1], max_new_tokens=1, logprobs=0))
        # a prompt, then again (past its cached blocks: its last partial block), then
        # three times at once
        for n in (1, 1, 3):
            burst([longest] * n)
        for turn in (5, 8):  # bursts of 21-token turns past the same block: one prefill
            burst([[*longest[:16], turn + i, *range(9, 29)] for i in range(3)])
            monkeypatch.setattr(PrefillPlanner, "shared_pays", shared_pays)  # (the second)
    assert engine.online_stats.prefix_hits == 10
    assert engine.online_stats.compile_s == 0
    repeats = [{"1x16 after cache": 1}, {"3x16 after cache": 1}]
    assert bursts[1:] == [*repeats, {"3x64 after cache": 1}, {"3x192 shared": 1}], bursts


def test_warm_up_compiles_one_rows_short_turn_and_the_shared_pass_side_above():
    """A lone chat behind a cached system prompt, or a burst's first chat's rest after its
    chunks (28 tokens), runs at one row's short side, not padded to one row's WARM_SIDE
    (SmolLM2, AMD EPYC Zen 4: the first chat's chunks and rest 0.97 s so, 0.90 s at 64);
    sixteen MT-bench chats' turns (shared passes of 1,280 tokens) at the shared pass side
    above sixteen short turns, none at one row (a shared pass holds two or more); each
    shape once where short is the side, a block, or batch is 1."""
    pool = types.SimpleNamespace(block=16)
    warmed = prefill_planning.warm_prefills(16, 128, 64, pool, ragged=False)
    after = sorted((rows, side) for rows, side, p in warmed if p is pool)
    assert after == [(1, 16), (1, 64), (1, 128), (16, 16), (16, 64)]
    warmed = prefill_planning.warm_prefills(16, 128, 64, pool, ragged=True)
    shared = [side for rows, side, p in warmed if isinstance(p, prefill_args.SharedPool)]
    assert shared == [1024, 1280]
    warmed = prefill_planning.warm_prefills(1, 128, 64, pool, ragged=True)
    assert not any(isinstance(p, prefill_args.SharedPool) for _, _, p in warmed)
    for batch, side, short in ((16, 64, 64), (1, 128, 16), (1, 16, 16)):
        warmed = prefill_planning.warm_prefills(batch, side, short, pool, ragged=True)
        assert all(x not in warmed[:i] for i, x in enumerate(warmed)), warmed


def test_an_engine_says_how_it_decodes(model64):
    """Engine.decoding(): the server's start line and /health (auto's own line, with the
    layout chosen for one row, once warm_up has run: the server's test sees a fixed one)."""
    la = lj.LookaheadConfig.for_tokens(16)
    said = [lj.Engine(model64, lookahead=x).decoding() for x in (None, la, "auto")]
    assert said == [
        "plain decoding",
        f"lookahead {la.name} every round",
        "auto (its layout chosen at the first round)",
    ]


def test_serve_logs_slow_rounds_and_calls_on_idle_from_the_last_work(model64, monkeypatch, caplog):
    """`serve` (the server's loop) logs a round slower than SLOW_ROUND_S (every round, at
    0) with its seconds by part; idle, it calls on_idle with the seconds since its last
    round with work; it runs until `stop` is set (here once idle after the result)."""
    from lookahead_jax.engine import describe

    monkeypatch.setattr(describe, "SLOW_ROUND_S", 0.0)
    stop, idle, served_at = threading.Event(), [], []

    def on_idle(idle_s):  # (idle_s, the seconds since the result came)
        idle.append((idle_s, time.perf_counter() - served_at[0]))
        if len(idle) == 3:
            stop.set()

    with jax.enable_x64(True):  # (the shapes of the test above: its programs)
        engine = lj.Engine(
            model64, batch=3, max_new_tokens=MAX_NEW, lookahead=None, max_prompt_tokens=LONGEST
        )

        def listener(update):
            if update.result is not None:
                served_at.append(time.perf_counter())

        engine.submit(lj.Request(PROMPTS[5], id=5), listener)
        with caplog.at_level("WARNING", logger="lookahead_jax.engine"):
            engine.serve(stop, idle_wait_s=0.01, on_idle=on_idle)
    pattern = r"a round took [\d.]+ s: [\d.]+ s compiling, [\d.]+ s in \d+ prefills, "
    assert re.search(pattern + r"[\d.]+ s in \d+ decode calls at \d+ rows", caplog.text)
    seconds = [s for s, _ in idle]  # from the round that ended it, not from serve's start
    assert seconds == sorted(seconds) and seconds[-1] >= 0.02
    assert all(0 <= s <= since for s, since in idle), idle


def test_string_ids_key_the_noise_not_the_slot(model64):
    """The same prompt under the same id gives the same sampled tokens in any slot and
    batch; another id gives other noise."""
    prompt = PROMPTS[3]
    with jax.enable_x64(True):

        def sampled(batch, ids):
            engine = lj.Engine(
                model64, batch=batch, max_new_tokens=MAX_NEW, lookahead=None, temperature=1.0
            )
            reqs = [lj.Request(prompt, id=i) for i in ids]
            return {r.id: r.token_ids for r in engine.run(reqs)}

        alone = sampled(1, ["q"])["q"]
        crowd = sampled(2, ["a", "b", "q", "c"])
    assert crowd["q"] == alone
    assert len({tuple(t) for t in crowd.values()}) > 1


@pytest.mark.parametrize(
    "kwargs,requests_,needle",
    [
        ({"batch": 0}, [[5, 6]], "batch"),
        ({"steps_per_call": 0}, [[5, 6]], "steps_per_call"),
        ({"max_prompt_tokens": 4}, [[5] * 5], r"max-prompt-tokens\) \(4\); raise it to 5"),
        ({}, [lj.Request([5, 6], id="x"), lj.Request([7], id="x")], "used twice"),
        ({}, [[5] * 1020], "exceeds the model's context"),
        ({}, [lj.Request([5, 6], max_new_tokens=0)], "max_new_tokens"),
        ({}, [[5, 999]], "outside"),
        ({}, [], "no prompts"),
    ],
)
def test_bad_requests_are_refused_before_decoding(model64, kwargs, requests_, needle):
    with pytest.raises(lj.UserInputError, match=needle) as e:
        engine = lj.Engine(model64, **{"max_new_tokens": MAX_NEW, "lookahead": None, **kwargs})
        list(engine.run(requests_))
    assert "${" not in str(e.value)  # every slot in the library's words (errors.py)
    if e.value.field in ("prompt", "id"):  # a request's prompt or id: it names the request
        assert str(e.value).startswith("prompt ")
