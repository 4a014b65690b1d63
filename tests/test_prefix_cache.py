"""The prefix cache (engine/prefix_cache.py, models/kv_pool.py): a request that starts from
cached blocks decodes to the tokens of a cold decode of its prompt.

Float64 tiny model, so any difference is a bug: prompts that share a 40-token prefix (two
blocks of 16) and one that shares nothing, sampled (lookahead: the server's tests); rows
of one admission sharing a prefix (one computes it, the others wait for its blocks); a
next turn that carries an answer; a budget of a few blocks (eviction). The block index's
rules are tested on the host alone.
"""

import types

import jax
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.engine import cached_prefill, inputs, prefill_args
from lookahead_jax.engine.prefill_planning import PrefillPlanner
from lookahead_jax.engine.prefill_shapes import PaddedShapes
from lookahead_jax.engine.prefix_cache import BLOCK, PrefixCache, block_keys
from lookahead_jax.engine.stats import Stats
from tests.helpers import random_prompts

MAX_NEW = 16
rng = np.random.default_rng(7)
SHARED = rng.integers(1, 128, 40).tolist()  # two blocks and 8 tokens
PROMPTS = [SHARED + rng.integers(1, 128, k).tolist() for k in (3, 9, 20, 1, 17)]
PROMPTS.append(random_prompts(1, 128, 25, 26, seed=5)[0])  # shares nothing


@pytest.fixture(scope="module")
def model64(tiny_ckpts):
    with jax.enable_x64(True):
        yield lj.load(tiny_ckpts["gqa"][1], dtype="float64")


@pytest.fixture(autouse=True)
def hits_as_hits(monkeypatch):
    """An admission's rows with cached blocks never run from scratch as one ragged pass
    instead, nor in one pass after the blocks they share (whether they would depends on
    which ragged programs earlier tests left compiled; those rules' own tests:
    test_ragged_prefill.py)."""
    monkeypatch.setattr(PrefillPlanner, "ragged_instead", lambda *args, **kwargs: None)
    monkeypatch.setattr(PrefillPlanner, "shared_pays", lambda *args, **kwargs: False)


def shared_passes(monkeypatch):
    """Rows with cached blocks that share some run in one pass after them, always."""
    shared = lambda self, requests, hits, pool: bool(prefill_args.shared_blocks(hits))  # noqa: E731
    monkeypatch.setattr(PrefillPlanner, "shared_pays", shared)


def never_from_scratch(*args, **kwargs):
    """PaddedShapes.instead for tests of the cache's hits: a suffix whose shape would
    compile never runs from scratch instead (whether it would depends on which programs
    earlier tests left compiled; the rule's own test: below)."""
    return None


def no_chunks_now(monkeypatch):
    """For tests of when a prompt is chunked between rounds: none is chunked at once for
    its padding (which it would be depends on which shapes earlier tests compiled; that
    rule's own test: test_a_long_prompt_that_would_run_padded_is_chunked_at_once)."""
    monkeypatch.setattr(cached_prefill, "PADDED_CHUNKS", float("inf"))


def cached_blocks(prompt: list[int]) -> int:
    """The blocks a prompt may take from the cache: every full one before its last token."""
    return (len(prompt) - 1) // BLOCK


# (lookahead rows starting from cached blocks: tests/test_server.py, whose server decodes
# with tokens=16 and the cache on, each answer against a lone decode)
@pytest.mark.parametrize("shared", [False, True], ids=["suffixes", "shared-pass"])
@pytest.mark.parametrize("lookahead,temperature", [(None, 0.9)], ids=["plain-sampled"])
def test_prefix_hits_decode_to_the_cold_tokens(
    model64, lookahead, temperature, shared, monkeypatch
):  # fmt: skip
    """shared: the three rows that wait for the first's blocks run in one ragged pass
    after them (decode_state.SharedPrefix), not as suffixes."""
    monkeypatch.setattr(PaddedShapes, "instead", never_from_scratch)
    if shared:
        shared_passes(monkeypatch)
    la = None if lookahead is None else lj.LookaheadConfig.parse(lookahead)
    kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=la, temperature=temperature, seed=3)
    with jax.enable_x64(True):
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(PROMPTS)}
        engine = lj.Engine(model64, prefix_cache_mb=1, **kw)
        first = {r.id: r.token_ids for r in engine.run(PROMPTS)}
        # the first admission takes 4 prompts that share two blocks nobody holds: one
        # computes them and the other three wait for its store; the last two hit too
        assert engine.stats.prefix_hits == 4
        assert engine.stats.prefix_hit_tokens == 4 * 2 * BLOCK
        ran = engine.stats.prefill_shapes
        assert any(shape.endswith(" shared") for shape in ran) == shared, ran
        again = {r.id: r.token_ids for r in engine.run(PROMPTS)}
        assert engine.stats.prefix_hits == len(PROMPTS)  # every full block is held now
        held = BLOCK * sum(map(cached_blocks, PROMPTS))
        if shared:  # (a shared pass takes the blocks its rows share; each computes its own)
            assert 5 * 2 * BLOCK <= engine.stats.prefix_hit_tokens < held
        else:
            assert engine.stats.prefix_hit_tokens == held
    assert first == cold
    assert again == cold


def test_rows_waiting_for_a_first_ones_blocks_join_what_came_in_meanwhile(model64, monkeypatch):
    """Online, the requests of an admission that wait for an earlier one's blocks are
    handed back (cached_prefill.admit's `defer`) and admitted again at once with what
    came in meanwhile: four requests sharing two blocks nobody holds, and a fifth sharing
    them that comes in after the first's prefill, before any decode round, run as the
    first from scratch and one pass after its blocks for the other four (before: the
    three in that admission, then the fifth apart), with a cold decode's tokens."""
    shared_passes(monkeypatch)
    kw = dict(batch=8, max_new_tokens=MAX_NEW, lookahead=None)
    drain, calls = lj.Engine._drain, []

    def drain_and_arrive(self, scheduler):  # the fifth comes in after the first's prefill
        calls.append(len(calls) + 1)
        if calls[-1] == 2:
            self.submit(lj.Request(PROMPTS[4], id=4), listen)
        drain(self, scheduler)

    with jax.enable_x64(True):
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(PROMPTS[:5])}
        engine = lj.Engine(model64, prefix_cache_mb=1, **kw)
        results = {}
        listen = lambda u: u.result and results.setdefault(u.result.id, u.result)  # noqa: E731
        monkeypatch.setattr(lj.Engine, "_drain", drain_and_arrive)
        for i in range(4):
            engine.submit(lj.Request(PROMPTS[i], id=i), listen)
        while engine.round():
            pass
    assert {i: r.token_ids for i, r in results.items()} == cold
    # the first from scratch; the three it held back and the fifth in one pass after it
    assert engine.online_stats.prefill_calls == 2
    assert engine.online_stats.prefill_shapes == {"1x64": 1, "4x80 shared": 1}


def test_a_next_turn_takes_the_answer_from_the_cache(model64, monkeypatch):
    monkeypatch.setattr(PaddedShapes, "instead", never_from_scratch)
    kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=None)
    with jax.enable_x64(True):
        engine = lj.Engine(model64, prefix_cache_mb=1, **kw)
        answer = next(iter(engine.run([PROMPTS[1]]))).token_ids
        turn = PROMPTS[1] + answer + [5, 6, 7]
        cold = next(iter(lj.Engine(model64, **kw).run([turn]))).token_ids
        hot = next(iter(engine.run([turn])))
    assert hot.token_ids == cold
    # the answer's K/V past the prompt's blocks came from the cache too (all but the
    # newest token of the first decode were committed)
    committed = len(PROMPTS[1]) + len(answer) - 1
    assert engine.stats.prefix_hit_tokens == BLOCK * min(committed // BLOCK, cached_blocks(turn))
    assert engine.stats.prefix_hit_tokens > BLOCK * cached_blocks(PROMPTS[1])


def test_a_budget_of_a_few_blocks_evicts_and_keeps_the_tokens(model64, monkeypatch):
    monkeypatch.setattr(PaddedShapes, "instead", never_from_scratch)
    kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=None)
    with jax.enable_x64(True):
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(PROMPTS)}
        engine = lj.Engine(model64, prefix_cache_mb=0.05, **kw)
        cache = engine.prefix_cache()
        assert 2 <= cache.blocks < 8
        for _ in range(2):
            assert {r.id: r.token_ids for r in engine.run(PROMPTS)} == cold
            assert len(cache) == cache.blocks  # full: blocks were evicted
        assert engine.stats.prefix_hits > 0


def test_prefills_padded_to_compiled_shapes_keep_the_tokens(model64):
    """Prefills run at a larger shape already compiled (rows and prompt or suffix padded:
    prefill_shapes.py) give a cold decode's tokens."""
    kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=None)
    late = [PROMPTS[4], PROMPTS[5]]  # a 25-token suffix after 2 blocks; 25 tokens, no hit
    with jax.enable_x64(True):
        late = [lj.Request(prompt, id=i) for i, prompt in enumerate(late, 4)]
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(late)}
        engine = lj.Engine(model64, prefix_cache_mb=1, **kw)
        results = {}
        listen = lambda u: u.result and results.setdefault(u.result.id, u.result)  # noqa: E731
        for i, prompt in enumerate(PROMPTS[:4]):  # 1 row [1, 64], then 4 rows from 2 blocks
            engine.submit(lj.Request(prompt, id=i), listen)
        while engine.round():
            pass
        padded = engine._scheduler.device.padded
        assert padded.compiled == {("prompt", 1, 64), ("suffix", 4, 32)}
        padded.compile_s = [1e6]  # compiling would cost more than any padding
        for request in late:  # one admission at a time
            engine.submit(request, listen)
            while engine.round():
                pass
    assert {i: results[i].token_ids for i in (4, 5)} == cold
    assert set(padded.spent_s) == {("suffix", 1, 32), ("prompt", 1, 32)}
    assert padded.compiled == {("prompt", 1, 64), ("suffix", 4, 32)}


def test_a_suffix_that_would_compile_runs_from_scratch_meanwhile(model64):
    """A request whose suffix shape has no compiled program to run at prefills from
    scratch at a prompt shape compiled (recomputing two blocks costs less than a
    compile), its suffix shape compiling in the background; the next one runs from the
    cache at it. The tokens are a cold decode's."""
    from lookahead_jax.decoding import programs

    with jax.enable_x64(True):
        kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=None)
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(PROMPTS)}
        # 32 new positions: programs of its own (no other test's suffix shapes ready)
        engine = lj.Engine(model64, **{**kw, "max_new_tokens": 2 * MAX_NEW}, prefix_cache_mb=1)
        results = {}
        listen = lambda u: u.result and results.setdefault(u.result.id, u.result)  # noqa: E731
        compile_s = []
        for i in (0, 1, 2):  # one at a time: [1, 64]; then suffixes of 17 and 28 tokens
            engine.submit(lj.Request(PROMPTS[i], id=i, max_new_tokens=MAX_NEW), listen)
            while engine.round():
                pass
            for pending in list(programs._PENDING.values()):
                pending.result()  # (the background compile, finished before the next)
            compile_s.append(engine.stats.compile_s)
    assert {i: results[i].token_ids for i in (0, 1, 2)} == {i: cold[i] for i in (0, 1, 2)}
    assert engine.stats.prefill_shapes == {"1x64": 2, "1x32 after cache": 1}
    assert engine.stats.prefix_hits == 1  # (the second's blocks were computed, not found)
    # the third ran the very program compiled in the background (its key, device_slots'
    # _start_key, is the real call's): no second compiled for it
    assert compile_s[2] == compile_s[1]


LONG = [
    lj.Request(rng.integers(1, 128, 5).tolist(), id=0, max_new_tokens=MAX_NEW),
    lj.Request(rng.integers(1, 128, 90).tolist(), id=1),  # 90 tokens: 5 chunks and 10 left
    lj.Request(rng.integers(1, 128, 7).tolist(), id=2, max_new_tokens=2),
]


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode(model64):
    """Request 2 ends at once, so the long prompt comes in while request 0 decodes: five
    chunks of 16 between rounds of 2 steps, then its prefill runs the last 10 tokens
    (in arrival order: max_prompt_tokens fixes the state's prompt side)."""
    kw = dict(batch=2, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2)
    kw["max_prompt_tokens"] = len(LONG[1].prompt)
    arrivals = [LONG[0], LONG[2], LONG[1]]
    with jax.enable_x64(True):
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(arrivals)}
        engine = lj.Engine(model64, prefix_cache_mb=1, prefill_chunk=16, **kw)
        assert {r.id: r.token_ids for r in engine.run(arrivals)} == cold
    assert engine.stats.prefill_chunks == 5
    assert engine.stats.prefix_hit_tokens == 0  # its chunks' blocks were computed, not found


@pytest.mark.parametrize("padded,chunk", [(True, 16), (False, 16), (True, None)])
def test_a_long_prompt_that_would_run_padded_is_chunked_at_once(
    model64, monkeypatch, padded, chunk
):
    """A long prompt alone, no row decoding: where its one-piece prefill would run at
    PADDED_CHUNKS x its length or more (no compiled shape near it), its chunks run at
    once, in its admission, and its last 10 tokens as a suffix after them; else, or with
    chunking off, it runs in one piece. Its tokens are the cold decode's either way."""
    own = PrefillPlanner.run_side
    monkeypatch.setattr(PrefillPlanner, "run_side", lambda *a: 4 * own(*a) if padded else own(*a))
    kw = dict(batch=2, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2)
    with jax.enable_x64(True):
        cold = next(iter(lj.Engine(model64, **kw).run(LONG[1:2]))).token_ids
        engine = lj.Engine(model64, prefix_cache_mb=1, prefill_chunk=chunk, **kw)
        updates = []
        engine.submit(LONG[1], updates.append)
        engine.round()
        assert updates, "its first token comes in its first round"
        chunks = 5 if padded and chunk else 0
        assert engine.stats.prefill_chunks == chunks
        assert engine.stats.prefix_hit_tokens == 0  # its chunks' blocks were computed
        # its rest ran as a suffix after its blocks (the side run_side said), or whole
        after = [s for s in engine.stats.prefill_shapes if s.endswith("after cache")]
        assert bool(after) == bool(chunks), engine.stats.prefill_shapes
        while engine.round():
            pass
    assert updates[-1].result.token_ids == cold


def test_requests_admitted_together_are_not_chunked_behind_each_other(model64, monkeypatch):
    """Three requests sharing a prefix nobody holds, arriving together: none is chunked
    (no other row decodes yet, though the rest of each prompt is longer than a chunk): the
    first is prefilled, the others from its blocks, all in the first round (before: the
    others were chunked, then admitted one a round)."""
    monkeypatch.setattr(PaddedShapes, "instead", never_from_scratch)
    no_chunks_now(monkeypatch)
    kw = dict(batch=3, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2)
    together = [lj.Request(p, id=i) for i, p in enumerate(PROMPTS[1:4])]
    with jax.enable_x64(True):
        cold = {r.id: r.token_ids for r in lj.Engine(model64, **kw).run(together)}
        engine = lj.Engine(model64, prefix_cache_mb=1, prefill_chunk=16, **kw)
        first, results = set(), {}

        def listen(u):
            first.add(u.id)
            if u.result is not None:
                results[u.id] = u.result.token_ids

        for r in together:
            engine.submit(r, listen)
        engine.round()
        assert first == {0, 1, 2} and engine.stats.prefill_chunks == 0
        assert engine.stats.prefix_hit_tokens == 2 * cached_blocks(SHARED + [0]) * BLOCK
        while engine.round():
            pass
    assert results == cold


def test_a_request_cancelled_while_its_chunks_run_ends_and_frees_its_slot(model64):
    kw = dict(batch=2, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2)
    with jax.enable_x64(True):
        engine = lj.Engine(model64, prefix_cache_mb=1, prefill_chunk=16, **kw)
        results = {}
        listen = lambda u: u.result and results.setdefault(u.result.id, u.result)  # noqa: E731
        engine.submit(LONG[0], listen)
        engine.round()
        engine.submit(LONG[1], listen)
        engine.round()  # set to chunk (request 0 decodes)
        engine.round()  # its first chunk
        assert engine.stats.prefill_chunks == 1 and engine.slots_in_use == 2
        engine.cancel(1)
        while engine.round():
            pass
        assert results[1].finish == "cancelled" and results[1].token_ids == []
        assert results[0].finish == "length" and engine.slots_in_use == 0
        assert engine.stats.prefill_chunks == 1
        # cancelled once nothing else decodes: it ends all the same
        engine.submit(LONG[0], listen)
        engine.round()
        engine.submit(lj.Request(LONG[1].prompt, id=3), listen)
        engine.round()  # set to chunk beside request 0
        engine.cancel(0)
        engine.round()  # request 0 ends
        engine.cancel(3)
        engine.round()
        assert results[3].finish == "cancelled" and engine.slots_in_use == 0
        assert not engine.round()  # nothing left: the engine idles


# ---------------------------------------------------------------------- the index alone


def admit(shapes: PaddedShapes, kind: str, sides: list[int], rate: float, batch: int = 16):
    """One admission as the engine runs it: the cut, then each run's shape (and the
    shape's program compiled, 1 s, where it was not)."""
    shapes_run = []
    for run in shapes.groups(kind, sides, batch, rate):
        n, side = len(run), max(sides[i] for i in run)
        rows, side = shapes.choose(kind, 1 << (n - 1).bit_length(), side, rate)
        if (kind, rows, side) not in shapes.compiled:
            shapes.ran(kind, rows, side, compile_s=1.0)
        shapes_run.append((rows, side))
    return shapes_run


def test_padding_to_a_compiled_shape_until_it_has_cost_a_compile():
    """prefill_shapes.py's worked example: compiles take 3 s, 1,000 positions/s."""
    shapes = PaddedShapes()
    assert shapes.choose("suffix", 2, 32, 1000.0) == (2, 32)  # nothing compiled or timed
    shapes.ran("suffix", 8, 64, compile_s=3.0)
    shapes.compile_s = [3.0]
    assert shapes.choose("suffix", 16, 16, 1000.0) == (16, 16)  # nothing larger in both
    assert shapes.choose("prompt", 2, 32, 1000.0) == (2, 32)  # another kind
    runs = [admit(shapes, "suffix", [32, 32], 1000.0) for _ in range(9)]
    assert runs == [[(8, 64)]] * 6 + [[(2, 32)]] * 3  # the seventh's padding paid for it
    assert shapes.spent_s[("suffix", 2, 32)] == pytest.approx(7 * 0.448)
    assert shapes.choose("suffix", 1, 16, 1000.0) == (2, 32)  # the smallest larger pair
    shapes.at("another prompt side")  # nothing compiled for it
    assert shapes.choose("suffix", 1, 16, 1000.0) == (1, 16)
    shapes.at(None)  # back: what was compiled there still is
    assert shapes.choose("suffix", 1, 16, 1000.0) == (2, 32)


def test_an_admission_is_cut_into_the_prefills_that_pad_least():
    """prefill_shapes.py's example: 10 prompts of side 128 and 6 of side 64 run as one
    [16, 128] (2,048 positions), not [16, 128] and [8, 64]; new shapes are compiled
    only once the padding spent for want of them has cost their compiles."""
    sides = [64] * 6 + [128] * 10
    shapes = PaddedShapes()
    assert shapes.groups("prompt", sides, 16, 0.0) == [list(range(16))]  # nothing measured
    shapes.ran("prompt", 16, 128, compile_s=3.0)
    # compiled shapes cost only their positions; groups in slot order
    mixed = [128] * 4 + [64] * 12
    ready = lambda rows, side: (rows, side) in {(4, 128), (16, 64)}  # noqa: E731
    assert shapes.groups("prompt", mixed[::-1], 16, 1000.0, ready) == [
        list(range(12, 16)),
        list(range(12)),
    ]
    # 4 of side 128 and 12 of 64, only [16, 128] compiled: [4, 128] + [4, 64] + [8, 64]
    # (1,280 + 3 calls) would save 736 positions, 0.25 s for each of the three shapes
    # an admission: they are compiled once that has reached a compile (3 s)
    again = PaddedShapes()
    again.ran("prompt", 16, 128, compile_s=3.0)
    cuts = [admit(again, "prompt", mixed, 1000.0) for _ in range(14)]
    assert cuts[:13] == [[(16, 128)]] * 13
    assert cuts[13] == [(4, 128), (4, 64), (8, 64)]
    # 9 of one side: [16, 128] (2,048) against [8, 128] + [1, 128] (1,152 + a call)
    shapes.ran("prompt", 8, 128, compile_s=3.0)
    shapes.ran("prompt", 1, 128, compile_s=3.0)
    assert sorted(map(len, shapes.groups("prompt", [128] * 9, 16, 1000.0))) == [1, 8]


def test_a_run_whose_padding_alone_costs_a_compile_compiles_its_own_shape():
    """Sixteen ~600-token prompts ran padded to a compiled [16, 1024] (48-53 s a burst on
    a 2-core CPU): where one run's padding would cost more than a compile, its own shape
    compiles now, also where nothing holds it (not its octave); small paddings still pad."""
    shapes = PaddedShapes()
    shapes.ran("prompt", 16, 1024, compile_s=3.0)
    # 16 x 384 positions of padding at 1,000/s: 6.1 s against a 3 s compile
    assert shapes.plan("prompt", 16, 640, 1000.0, lambda *a: False, True) == ((16, 640), "dear")
    assert shapes.choose("prompt", 16, 640, 1000.0) == (16, 640)
    # 2 x 64 in [16, 1024] pads 16,256 positions; in [2, 1024] (compiled now) 1,920: 1.9 s
    shapes.ran("prompt", 2, 1024, compile_s=3.0)
    assert shapes.plan("prompt", 2, 64, 1000.0, lambda *a: False, True) == ((2, 1024), "padded")
    # nothing holds [16, 1280]; its octave [16, 2048] would pad 12,288 positions
    assert shapes.choose("prompt", 16, 1280, 1000.0) == (16, 1280)
    assert PaddedShapes().choose("prompt", 1, 80, 1000.0) == (1, 128)  # 48: the octave
    # an admission of 16 at 640 runs at its own shape (the rule before: [16, 1024])
    assert admit(shapes, "prompt", [640] * 16, 1000.0) == [(16, 640)]
    # a paid shape pads meanwhile ("soon") only where that one run is cheaper than a compile
    shapes.spent_s[("prompt", 16, 768)] = 10.0
    assert shapes.plan("prompt", 16, 768, 1000.0, lambda *a: False, True) == ((16, 768), "dear")
    shapes.spent_s[("prompt", 2, 512)] = 10.0
    assert shapes.plan("prompt", 2, 512, 1000.0, lambda *a: False, True) == ((2, 1024), "soon")


def test_a_side_with_nothing_compiled_to_hold_it_compiles_its_octave_first():
    """One program for 65..128 (later prompts of the octave run at it), a side's own only
    once its padding has paid for it: 48 positions an admission, 0.048 s at 1,000/s,
    against a 3 s compile."""
    shapes = PaddedShapes()
    assert shapes.choose("prompt", 1, 80, 0.0) == (1, 128)  # nothing measured
    shapes.ran("prompt", 1, 128, compile_s=3.0)
    runs = [admit(shapes, "prompt", [80], 1000.0) for _ in range(64)]
    assert runs[:62] == [[(1, 128)]] * 62 and runs[62:] == [[(1, 80)]] * 2
    assert shapes.choose("prompt", 1, 112, 1000.0, ready=lambda rows, side: side == 112) == (1, 112)


def test_a_paid_shape_compiles_in_the_background_while_a_larger_one_runs():
    """With compile_soon (the engine's prompt prefills), a shape paid for is compiled
    beside the rounds, the larger one running until it is ready; with nothing larger
    compiled it is compiled at once."""
    shapes = PaddedShapes()
    shapes.ran("prompt", 1, 128, compile_s=3.0)
    asked, compiled = [], set()
    ready = lambda rows, side: (rows, side) in compiled  # noqa: E731
    soon = lambda rows, side: asked.append((rows, side))  # noqa: E731
    runs = []
    for _ in range(66):
        for run in shapes.groups("prompt", [80], 16, 1000.0, ready, background=True):
            runs.append(shapes.choose("prompt", len(run), 80, 1000.0, ready, soon))
            shapes.ran("prompt", *runs[-1], compile_s=0.0)
        if len(asked) == 2:
            compiled.add((1, 80))  # the background compile finished
    assert runs[:62] == [(1, 128)] * 62  # as without compile_soon: 62 admissions of padding
    assert runs[62:64] == [(1, 128)] * 2 and asked == [(1, 80)] * 2  # paid: compiling
    assert runs[64:] == [(1, 80)] * 2  # ready
    assert shapes.choose("prompt", 2, 96, 1000.0, ready, soon) == (2, 128)  # its octave's
    shapes.spent_s[("prompt", 4, 80)] = 10.0  # paid, nothing larger: compiled now
    assert shapes.choose("prompt", 4, 80, 1000.0, ready, soon) == (4, 80) and len(asked) == 2


def test_prefill_sides_pad_a_quarter_octave_at_most():
    assert [inputs.prefill_side(n) for n in (1, 17, 64, 65, 81, 128, 129, 300, 513)] == [
        16, 32, 64, 80, 96, 128, 160, 320, 640,
    ]  # fmt: skip
    for n in range(1, 3000):
        side = inputs.prefill_side(n)
        assert n <= side <= inputs.bucket(n) and side % BLOCK == 0
        assert n <= 64 or side - n < inputs.bucket(n) // 8


def index(blocks: int) -> PrefixCache:
    """A PrefixCache of `blocks` blocks for a one-layer cache of tiny shapes."""
    shape = jax.ShapeDtypeStruct((1, 1, 1, 4), np.float32)
    per_block = 2 * BLOCK * 4 * 4  # K and V, BLOCK positions, Dh 4, float32
    cache_like = type("Like", (), {"k": (shape,), "v": (shape,)})
    return PrefixCache(cache_like, blocks * per_block / 2**20)


def test_block_keys_name_whole_prefixes():
    a = list(range(1, 50))
    b = a[:20] + [99] + a[21:]  # differs in block 1
    ka, kb = block_keys(a), block_keys(b)
    assert len(ka) == 3  # full blocks only
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]  # a chain: all after differ


def test_hits_stop_before_the_last_token_and_eviction_takes_deepest_blocks_first():
    cache = index(blocks=4)
    prompt = list(range(1, 49))  # exactly 3 blocks
    assert cache.split([prompt, prompt]) == [True, False]  # the second waits for the first
    assert [i for i, _, _ in cache.claim([prompt])] == [0, 0, 0]
    assert len(cache.hits(prompt)) == 2  # the third block holds the last token: run again
    assert len(cache.hits(prompt + [7])) == 3
    other = list(range(100, 132))  # 2 blocks: one free, then the LRU one is evicted
    cache.claim([other])
    assert len(cache) == 4
    # the first prompt lost its deepest block, not its first
    assert len(cache.hits(prompt + [7])) == 2


def test_a_chunk_over_a_chain_with_holes_keeps_every_block_its_own_id():
    """A chain whose middle block is still held while an earlier one was evicted: the
    chunk's blocks get distinct ids, and the held one keeps its own."""
    cache = index(blocks=8)
    prompt = list(range(1, 130))  # 8 blocks
    first = cache.claim_chunk(prompt, 0, 4)
    second = cache.claim_chunk(prompt, 4, 4)
    assert len(set(first + second)) == 8
    cache.claim([list(range(200, 217))])  # one block: evicts the LRU one, block 7
    assert len(cache.hits(prompt)) == 7
    again = cache.claim_chunk(prompt, 3, 5)  # blocks 3..6 held, 7 not
    assert again[:4] == (first + second)[3:7] and len(set(again)) == 5
    assert len(cache) == 8


def test_padding_pays_for_a_shape_before_any_compile_was_measured():
    """A server's warm-up compiles are not measured (they may be waits for background
    compiles), so a shape is paid for at DEFAULT_COMPILE_S (5 s): fifteen chat suffixes
    of side 64 behind a cached system prompt run as one-row prefills at the warm-up's
    [1, 128] (2,160 positions against [16, 64]'s 1,040: 2.24 s spent at 500 positions/s)
    for three admissions, then as one [16, 64] prefill."""
    shapes = PaddedShapes()
    shapes.ran("suffix", 1, 128, compile_s=0.0)  # the warm-up's
    runs = [admit(shapes, "suffix", [64] * 15, 500.0) for _ in range(4)]
    assert runs[:3] == [[(1, 128)] * 15] * 3
    assert runs[3] == [(16, 64)]


def test_more_requests_arriving_than_rows_decoding_are_not_chunked(model64, monkeypatch):
    """One request decodes; two arrive together whose rests are longer than a chunk:
    more wait than decode, so both are prefilled in the next round, not a chunk a round
    (one arriving alone beside one decoding is chunked: the test above)."""
    monkeypatch.setattr(PaddedShapes, "instead", never_from_scratch)
    no_chunks_now(monkeypatch)
    kw = dict(batch=3, max_new_tokens=MAX_NEW, lookahead=None, steps_per_call=2)
    later = [lj.Request(p, id=i) for i, p in enumerate(PROMPTS[1:3], start=1)]
    with jax.enable_x64(True):
        engine = lj.Engine(model64, prefix_cache_mb=1, prefill_chunk=16, **kw)
        first = set()
        engine.submit(lj.Request(PROMPTS[0], id=0), lambda u: first.add(u.id))
        engine.round()
        for r in later:
            engine.submit(r, lambda u: first.add(u.id))
        engine.round()
        assert first == {0, 1, 2} and engine.stats.prefill_chunks == 0
        while engine.round():
            pass


def test_auto_chunks_are_never_shorter_than_min_chunk():
    """ "auto" sizes a chunk from the run's rates (half a round's prefill), but never below
    MIN_CHUNK: a chunked request's slot sits idle until its last chunk, and a server's
    first rounds measured 32-token chunks, leaving chat prompts out for rounds."""

    def size(prefill_s: float) -> int:
        stats = Stats(batch=16)
        stats.prompt_tokens, stats.rounds, stats.decode_s, stats.prefill_s = 1200, 1, 0.2, prefill_s
        cache = types.SimpleNamespace(block=BLOCK)  # (chunk_size reads only its block)
        return cached_prefill.CachedPrefill(None, stats, None, cache, "auto").chunk_size()

    assert size(4.9) == cached_prefill.MIN_CHUNK  # 1,200 tokens in 4.9 s: 24 fit
    assert size(0.05) == cached_prefill.MAX_CHUNK  # 2,400 fit: the cap
