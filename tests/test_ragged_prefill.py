"""A ragged prefill — several prompts packed one after another in one pass
(decode_state.RaggedPrompts, attention.segment_attention) — against the prefill of the
same prompts right-padded in rows: the same first tokens and K/V, float64; its attention
against the masked softmax it stands for; when the engine runs one (prefill_shapes.
ragged_pays: at the shape warm-up compiled, nothing compiling; rows with cached blocks
in one from scratch), with a lone decode's tokens. The engine's exactness with ragged
passes (lookahead, sampling, grammars, logprobs) is test_engine's and the others' with
batches > 1."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lookahead_jax as lj
from lookahead_jax.decoding.decode_state import DecodeSpec, RaggedPrompts, SharedPrefix, prefill
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig, row_keys
from lookahead_jax.engine import prefill_args
from lookahead_jax.engine.prefill_shapes import SHARED, PaddedShapes
from lookahead_jax.models import cpu_kernel, kv_pool, packed, seam
from lookahead_jax.models.attention import segment_attention
from lookahead_jax.models.llama import LlamaLM
from lookahead_jax.models.llama_params import init_params, split_layers
from tests import tiny
from tests.helpers import cpu_kernel_runs, engine_packs_ragged

engine_packs = pytest.mark.skipif(
    not engine_packs_ragged(), reason="the engine packs prompts on a CPU only"
)


def _masked_softmax(q, k, v, first, window):
    """The reference: token t sees u with first[t] <= u <= t (and t - u < window)."""
    T, Dh = q.shape[1], q.shape[-1]
    t = np.arange(T)
    mask = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= first[:, :, None])
    if window:
        mask &= (t[:, None] - t[None, :] < window)[None]
    s = np.einsum("btkqe,bkue->bktqu", q, k) / np.sqrt(Dh)
    s = np.where(mask[:, None, :, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bktqu,bkue->btkqe", p / p.sum(-1, keepdims=True), v)


def _first(lengths: list[int], tail: int) -> np.ndarray:
    """[1, T]: each token's row's first index; tail tokens their own."""
    starts = np.cumsum([0, *lengths])
    rows = [np.full(n, starts[i]) for i, n in enumerate(lengths)]
    return np.concatenate([*rows, starts[-1] + np.arange(tail)])[None].astype(np.int32)


@pytest.mark.parametrize(
    "lengths, tail, block, window",
    [
        ([3, 6, 2], 1, 4, 0),  # the docstring's example: three steps back
        ([3, 6, 2], 1, 4, 3),  # a window shorter than a row
        ([17, 1, 9, 30], 7, 8, 0),  # a row longer than several blocks, one of one token
        ([5, 5], 0, 128, 0),  # one block holds the pass
        ([17, 1, 9, 30], 7, 8, 5),  # a window shorter than rows of several tiles
    ],
)
def test_segment_attention_is_the_masked_softmax(lengths, tail, block, window):
    """float64 (XLA's blocks); the CPU kernel's (float32: each query over its row's keys,
    16 positions a tile, so a row of 17 or 30 spans tiles) agrees to float32 rounding."""
    rng = np.random.default_rng(len(lengths) + block)
    T, K, Q, Dh = sum(lengths) + tail, 2, 3, 24  # (24: the kernel's 16- and 8-wide dims)
    q = rng.normal(size=(1, T, K, Q, Dh))
    k, v = rng.normal(size=(1, K, T, Dh)), rng.normal(size=(1, K, T, Dh))
    first = _first(lengths, tail)
    with jax.enable_x64(True):
        got = segment_attention(
            *(jnp.asarray(x) for x in (q, k, v, first)), window=window, block=block
        )
    want = _masked_softmax(q, k, v, first, window)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-12)
    if cpu_kernel_runs():
        f32 = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
        kernel = segment_attention(*f32, jnp.asarray(first), window=window, segments_kernel=True)
        np.testing.assert_allclose(np.asarray(kernel), want, rtol=2e-5, atol=2e-5)


def _with_prefix(q, k, v, first, window, cache_k, cache_v, L):
    """The reference after a shared prefix of L cache positions: every token also sees
    positions 0 .. L - 1 (its own position L + its offset in its row; within the window)."""
    T, Dh = q.shape[1], q.shape[-1]
    t = np.arange(T)
    own = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= first[:, :, None])
    position = L + t - first[0]  # [T]
    seen = np.arange(cache_k.shape[2])[None, :] < L  # [1, S]
    if window:
        own &= (t[:, None] - t[None, :] < window)[None]
        seen = seen & (position[:, None] - np.arange(cache_k.shape[2])[None, :] < window)
    mask = np.concatenate([np.broadcast_to(seen, (1, T, seen.shape[1])), own], axis=-1)
    keys, values = np.concatenate([cache_k, k], axis=2), np.concatenate([cache_v, v], axis=2)
    s = np.einsum("btkqe,bkue->bktqu", q, keys) / np.sqrt(Dh)
    s = np.where(mask[:, None, :, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bktqu,bkue->btkqe", p / p.sum(-1, keepdims=True), values)


@pytest.mark.parametrize(
    "lengths, tail, block, window, cache_block",
    [
        ([3, 6, 2], 2, 4, 0, 8),  # a pass padded to its blocks; the cache read in blocks
        ([3, 6, 2], 2, 4, 5, 8),  # a window shorter than the prefix
        ([17, 1, 9], 0, 128, 0, 0),  # one block holds the pass; the cache read whole
    ],
)
def test_segment_attention_after_a_shared_prefix_is_the_masked_softmax(
    lengths, tail, block, window, cache_block
):  # fmt: skip
    """segment_attention with `prefix` (decode_state.SharedPrefix's pass): every token sees
    the cache's first L positions too, float64; the CPU kernel's read of them (float32),
    and of the pass's own keys too, agrees with XLA's to float32 rounding."""
    rng = np.random.default_rng(len(lengths) + block + window)
    T, K, Q, Dh, S, L = sum(lengths) + tail, 2, 3, 8, 24, 19
    q = rng.normal(size=(1, T, K, Q, Dh))
    k, v = rng.normal(size=(1, K, T, Dh)), rng.normal(size=(1, K, T, Dh))
    cache_k, cache_v = rng.normal(size=(1, K, S, Dh)), rng.normal(size=(1, K, S, Dh))
    first = _first(lengths, tail)
    positions = (L + np.arange(T) - first[0])[None].astype(np.int32)

    def run(dtype, kernel, segments=False):
        cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
        prefix = (cast(cache_k), cast(cache_v), jnp.array([L]), positions, cache_block, kernel)
        return segment_attention(
            cast(q), cast(k), cast(v), jnp.asarray(first), window, block, prefix, segments
        )

    with jax.enable_x64(True):
        got = run(jnp.float64, False)
    want = _with_prefix(q, k, v, first, window, cache_k, cache_v, L)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-12)
    if cache_block and cpu_kernel_runs():  # (the kernel: float32)
        kernel, xla = run(jnp.float32, True), run(jnp.float32, False)
        np.testing.assert_allclose(kernel, xla, rtol=2e-5, atol=2e-5)
        both = run(jnp.float32, True, segments=True)  # (the pass's own part too)
        np.testing.assert_allclose(both, xla, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not cpu_kernel_runs(), reason="the CPU kernel runs on a CPU only")
def test_a_causal_pass_by_the_kernel_is_the_masked_one():
    """LlamaLM.apply_causal with packed float32 params (the CPU kernel's ragged pass, one
    prompt a row) against `apply` under the lower-triangular mask: the same logits and
    K/V to float32 rounding, from scratch and after a cache of different lengths a row,
    with a sliding window in layer 0."""
    cfg = dataclasses.replace(tiny.llama_config(), attention_windows=(5, 0))
    lm = LlamaLM(cfg)
    params = split_layers(init_params(cfg, jax.random.PRNGKey(4), jnp.float32, scale=0.5))
    params = packed.pack_params(params, cfg)
    assert packed.is_packed(params)
    B, T, S = 2, 13, 32
    tokens = jnp.asarray(np.random.default_rng(4).integers(3, 32, (B, T)), jnp.int32)
    lengths = jnp.array([5, 9], jnp.int32)
    cache = lm.init_cache(B, S, jnp.float32)
    cached = jnp.asarray(np.random.default_rng(5).normal(size=cache.k[0].shape), jnp.float32)
    cache = dataclasses.replace(cache, k=(cached,) * 2, v=(-cached,) * 2, lengths=lengths)
    mask = seam.causal_mask(T)
    scratch = jax.jit(lm.apply_causal).lower(params, tokens, jnp.zeros_like(tokens)).as_text()
    assert cpu_kernel.ATTENTION_TARGET in scratch  # (the kernel's pass, not the mask)
    for c, start in ((None, jnp.zeros((B,), jnp.int32)), (cache, lengths)):
        positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
        got = jax.jit(lm.apply_causal)(params, tokens, positions, c)
        want = jax.jit(lm.apply)(params, tokens, positions, mask, c)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("windows", [(), (5, 0)])  # (5, 0): a sliding window in layer 0
def test_a_ragged_prefill_fills_what_the_padded_one_does(windows):
    """The same prompts (of 1 to 13 tokens, some rows padding) prefilled right-padded in
    rows [n, P] and packed in one pass of Tr tokens: the same first tokens, lengths and
    K/V at every prompt position, float64."""
    prompts = [[5, 9, 3, 7, 11, 4, 6, 8, 10, 12, 13, 14, 15], [20], [21, 22, 23, 24, 25]]
    n, P, Tr = 4, 16, 24
    cfg = dataclasses.replace(tiny.llama_config(), attention_windows=windows)
    with jax.enable_x64(True):
        params = split_layers(init_params(cfg, jax.random.PRNGKey(3), jnp.float64, scale=0.5))
        spec = DecodeSpec(lm=LlamaLM(cfg), eos_ids=(2,), cache_dtype="float64")
        prompt_np, length_n = np.zeros((n, P), np.int32), np.ones((n,), np.int32)
        ragged = RaggedPrompts(
            np.zeros((1, Tr), np.int32), np.full((1, Tr), n, np.int32),
            np.zeros((1, Tr), np.int32), np.zeros((n,), np.int32),
        )  # fmt: skip
        at = 0
        for i, ids in enumerate(prompts):
            prompt_np[i, : len(ids)], length_n[i] = ids, len(ids)
            ragged.tokens[0, at : at + len(ids)], ragged.row[0, at : at + len(ids)] = ids, i
            ragged.position[0, at : at + len(ids)], ragged.start[i] = np.arange(len(ids)), at
            at += len(ids)
        sampling = RowSampling.of([SamplingConfig()] * n)
        rows = (prompt_np, length_n, np.full((n,), 4, np.int32), row_keys(0, n), sampling)
        run = jax.jit(prefill, static_argnames=("spec", "new_positions"))
        padded = run(params, *rows, spec=spec, new_positions=8)
        packed = run(params, *rows, ragged, spec=spec, new_positions=8)
    np.testing.assert_array_equal(packed.tokens, padded.tokens)
    np.testing.assert_array_equal(packed.cache.lengths, padded.cache.lengths)
    for i, ids in enumerate(prompts):
        pairs = zip(packed.cache.k + packed.cache.v, padded.cache.k + padded.cache.v, strict=True)
        for a, b in pairs:
            np.testing.assert_allclose(a[i, :, : len(ids)], b[i, :, : len(ids)], atol=1e-12)


@pytest.mark.parametrize("windows", [(), (5, 0)])  # (5, 0): a window shorter than the prefix
def test_a_pass_after_a_shared_prefix_fills_what_the_padded_prefill_does(windows):
    """Prompts that share their first two blocks (8 tokens), prefilled right-padded in
    rows and as one ragged pass of their rest after those blocks, gathered from a pool
    (decode_state.SharedPrefix): the same first tokens, lengths and K/V at every prompt
    position, float64."""
    shared = [5, 9, 3, 7, 11, 4, 6, 8]
    prompts = [shared + [10, 12, 13, 14, 15], shared + [20], shared + [21, 22, 23, 24, 25]]
    n, P, Tr, Sb = 4, 16, 16, 4
    cfg = dataclasses.replace(tiny.llama_config(), attention_windows=windows)
    with jax.enable_x64(True):
        params = split_layers(init_params(cfg, jax.random.PRNGKey(3), jnp.float64, scale=0.5))
        spec = DecodeSpec(lm=LlamaLM(cfg), eos_ids=(2,), cache_dtype="float64")
        prompt_np, length_n = np.zeros((n, P), np.int32), np.ones((n,), np.int32)
        for i, ids in enumerate(prompts):
            prompt_np[i, : len(ids)], length_n[i] = ids, len(ids)
        sampling = RowSampling.of([SamplingConfig()] * n)
        rows = (prompt_np, length_n, np.full((n,), 4, np.int32), row_keys(0, n), sampling)
        run = jax.jit(prefill, static_argnames=("spec", "new_positions"))
        padded = run(params, *rows, spec=spec, new_positions=8)
        # the shared blocks into pool blocks 3 and 1 of 5 (out of order, others zeros)
        pool = kv_pool.init_pool(padded.cache, 5, Sb)
        pool = kv_pool.store_blocks(pool, padded.cache, *np.array([[0, 0], [0, 4], [3, 1]]))
        blocks = np.array([[3, 1, 0, 0]], np.int32)  # Mb = P // Sb
        ragged = prefill_args.ragged([types.SimpleNamespace(ids=p) for p in prompts], n, Tr, 8)
        prefix = SharedPrefix(pool, blocks, np.array([8], np.int32), ragged)
        packed = run(params, *rows, prefix, spec=spec, new_positions=8)
    real = len(prompts)  # (row 3 is padding: nothing of it runs in the pass)
    np.testing.assert_array_equal(packed.tokens[:real], padded.tokens[:real])
    np.testing.assert_array_equal(packed.cache.lengths, padded.cache.lengths)
    for i, ids in enumerate(prompts):
        pairs = zip(packed.cache.k + packed.cache.v, padded.cache.k + padded.cache.v, strict=True)
        for a, b in pairs:
            np.testing.assert_allclose(a[i, :, : len(ids)], b[i, :, : len(ids)], atol=1e-12)


def test_a_ragged_pass_runs_where_it_costs_less_than_the_cut():
    """prefill_shapes.ragged_pays: prompts run as one ragged pass where it costs less
    than their cut, priced alike (positions, a call's, a compile in the foreground): a
    pass that compiles beats a cut that compiles and runs more; a compiled cut beats it;
    a warmed pass that holds it beats a cut that would compile, not a compiled cut of two
    short prompts. Where only its own shape would cost less, the positions it would have
    saved (charged once an admission) pay for its compile, in the background."""
    shapes, soon = PaddedShapes(), []
    nothing = lambda rows, side: False
    compile_soon = lambda rows, side: soon.append((rows, side))
    shapes.compile_s = [10.0]  # a compile: 10 s, 1,000 positions at 100 a second
    pays = lambda n, side, cut, charge=False: shapes.ragged_pays(
        n, side, cut, 100.0, nothing, compile_soon, charge
    )
    assert pays(4, 160, (1300.0, 300))  # 176 + a compile against 300 + one
    assert not pays(4, 160, (200.0, 200), charge=True)  # a compiled cut
    assert shapes.spent_s[("ragged", 4, 160)] == pytest.approx(0.24) and not soon
    shapes.ran("ragged", 16, 2048, 0.0)  # the warmed pass: any rows, up to 2,048 tokens
    assert pays(16, 1536, (3064.0, 2064))  # 2,064 against [16, 128] and its compile
    assert not pays(2, 96, (144.0, 144))  # against a compiled [2, 64]: nothing charged
    assert ("ragged", 2, 96) not in shapes.spent_s
    shapes.compile_s = [1.0]
    for _ in range(4):  # 32 positions an admission: 0.32 s, until a compile's 1 s
        assert not pays(2, 96, (144.0, 144), charge=True)
    assert soon == [(2, 96)]


def test_a_ragged_pass_pads_to_a_compiled_one_rather_than_compile_in_the_foreground():
    """A prompt's run whose padding alone costs more than a compile compiles its own
    shape now ("dear"); a ragged pass never does: its side is its admission's tokens, met
    once, and its compile costs more than the mean (4 rows of 448 tokens: 1,600 positions
    padded, 3.2 s at 500 a second, against a 2.9 s mean compile)."""
    shapes = PaddedShapes()
    shapes.compile_s = [2.9]
    shapes.ran("ragged", 16, 2048, 0.0)  # the warmed pass
    shapes.ran("prompt", 16, 2048, 0.0)
    nothing = lambda rows, side: False
    assert shapes.plan("ragged", 4, 448, 500.0, nothing, True) == ((16, 2048), "padded")
    assert shapes.plan("prompt", 1, 448, 500.0, nothing, True) == ((1, 448), "dear")


def test_an_admission_longer_than_the_compiled_pass_runs_in_passes_that_fit_it():
    """A ragged admission whose own pass would compile in the foreground runs instead in
    passes packed to fit the largest compiled one, where that costs less, padding
    included (sixteen chats of 3,072 tokens in all compiled for 8.5 s inside a server's
    admission); what they run beyond its own shape is spent for want of it, which then
    compiles in the background. One pass where it is compiled, or a prompt alone does
    not fit."""
    from lookahead_jax.engine.prefill_planning import PrefillPlanner

    shapes, soon = PaddedShapes(), []
    shapes.compile_s = [3.0]  # 1,920 positions at 640 a second
    shapes.ran("ragged", 16, 2048, 0.0)  # the warmed pass
    stats = types.SimpleNamespace(prefill_rate=lambda: 640.0)
    nothing = lambda pool: lambda rows, side: False
    compile_soon = lambda pool: lambda rows, side: soon.append((rows, side))
    planner = PrefillPlanner(shapes, 16, True, stats, nothing, compile_soon)
    chats = [types.SimpleNamespace(ids=[1] * 192) for _ in range(16)]  # 3,072 tokens
    # 3,088 + 1,920 for its own pass, against two runs of the warmed one: 4,128
    groups = planner.prefill_groups(chats)
    assert [len(g) for g, _ in groups] == [10, 6] and all(ragged for _, ragged in groups)
    assert sorted(i for g, _ in groups for i in g) == list(range(16))
    assert shapes.spent_s[("ragged", 16, 3072)] == pytest.approx(1040 / 640) and not soon
    assert len(planner.prefill_groups(chats)) == 2 and soon == [(16, 3072)]  # 3.25 s: paid
    assert len(planner.prefill_groups(chats)) == 2  # (paid: parts until it is compiled)
    long = [types.SimpleNamespace(ids=[1] * n) for n in (2100, 300)]  # one does not fit
    assert planner.prefill_groups(long) == [([0, 1], True)]
    shapes.ran("ragged", 16, 3072, 0.0)
    assert planner.prefill_groups(chats) == [(list(range(16)), True)]  # compiled
    # parts fit a pass's rows too, and the compiled pass that costs them least
    shapes = PaddedShapes()
    shapes.compile_s = [6.0]  # 3,840 positions
    shapes.ran("ragged", 4, 2048, 0.0)
    planner = PrefillPlanner(shapes, 16, True, stats, nothing, compile_soon)
    # 6 chats (8, 1280): 1,296 + 3,840 against two runs of (4, 2048) for 4 + 2 of them
    assert [len(g) for g, _ in planner.prefill_groups(chats[:6])] == [4, 2]
    shapes.ran("ragged", 16, 2048, 0.0)
    shapes.compile_s = [0.5]  # 3,088 + 320 against 4,128: its own pass compiles
    assert planner.prefill_groups(chats) == [(list(range(16)), True)]
    shapes.compile_s = [6.0]
    assert [len(g) for g, _ in planner.prefill_groups(chats)] == [10, 6]  # not 4 x (4, 2048)


def test_rows_that_share_cached_blocks_run_in_one_pass_after_them_where_it_costs_less():
    """prefill_planning.shared_pays: fifteen chats behind a 496-token system prompt whose
    blocks are cached (their own 68 tokens each past it) run in the warmed shared pass
    (16, 1024), 1,040 positions, where their suffixes cut as [16, 128] run 2,064 and
    from scratch a pass of 10,240 would compile; not where their suffix cut is compiled and
    runs fewer positions (two short turns as a compiled [2, 64]: 144 against 1,040), nor
    rows that share no block, nor a lone row."""
    from lookahead_jax.engine.prefill_planning import PrefillPlanner

    shapes = PaddedShapes()
    shapes.compile_s = [3.0]
    shapes.ran(SHARED, 16, 1024, 0.0)  # the warmed pass (continuous.warm_up)
    shapes.ran("suffix", 16, 128, 0.0)
    shapes.ran("suffix", 2, 64, 0.0)
    stats = types.SimpleNamespace(prefill_rate=lambda: 640.0)
    nothing = lambda pool: lambda rows, side: False
    planner = PrefillPlanner(shapes, 16, True, stats, nothing, lambda pool: None)
    pool = types.SimpleNamespace(block=16)
    system = list(range(31))  # 31 blocks: 496 tokens
    chats = [types.SimpleNamespace(ids=[1] * (496 + 68)) for _ in range(15)]
    assert planner.shared_pays(chats, [system] * 15, pool)
    turns = [types.SimpleNamespace(ids=[1] * (496 + 40)) for _ in range(2)]
    assert not planner.shared_pays(turns, [system] * 2, pool)
    others = [system, [99, *system[1:]]]  # (a different first block: nothing shared)
    assert not planner.shared_pays(chats[:2], others, pool)
    assert not planner.shared_pays(chats[:1], [system], pool)


def test_a_pass_holds_more_tokens_where_its_rows_are_at_least_a_block_long():
    """prefill_planning's bound on one ragged pass: sixteen chats of 540 tokens (8,640, a
    pass of 10,240) fit one, where the bound before them (8,192) ran them padded as [16,
    1024]; as many tokens in rows shorter than an attention block do not (they paid a
    block each: MAX_SHORT_ROWS_PASS_TOKENS), nor a pass beyond MAX_PASS_TOKENS."""
    from lookahead_jax.engine import prefill_planning

    stats = types.SimpleNamespace(prefill_rate=lambda: 640.0)
    nothing = lambda pool: lambda rows, side: False
    planner = prefill_planning.PrefillPlanner(
        PaddedShapes(), 512, True, stats, nothing, lambda pool: None
    )
    rows = lambda n, tokens: [types.SimpleNamespace(ids=[1] * tokens) for _ in range(n)]
    assert planner._pass(rows(16, 540))[:2] == (16, 10240)
    assert planner._pass(rows(300, 31)) is None  # 9,300 tokens, rows of 31
    assert planner._pass(rows(250, 31)) is not None  # 7,750
    assert planner._pass(rows(16, 1100)) is None  # 17,600 > MAX_PASS_TOKENS


@engine_packs
@pytest.mark.parametrize("split", [False, True])
def test_a_burst_after_warm_up_runs_as_one_ragged_pass_at_the_warmed_shape(
    tiny_ckpts, monkeypatch, split
):
    """An online engine's warm-up compiles every row's chat-sized prompt in one ragged
    pass; four prompts arriving together right after it, whose one-row prefills at the
    warmed side would run more positions, run as one pass at that very program (its key,
    prefill_args.prefix_shapes, is the real call's: nothing compiles), with the tokens of
    each decoded alone, float64. `split`: the admission cut in two passes (as one too
    long for the compiled pass is: the test above), rows 0 and 2, 1 and 3, each padded
    to that program: the same tokens."""
    from lookahead_jax.engine.prefill_planning import PrefillPlanner

    if split:
        real = PrefillPlanner._passes
        halves = lambda self, requests, *one: ([[0, 2], [1, 3]], real(self, requests, *one)[1])
        monkeypatch.setattr(PrefillPlanner, "_passes", halves)
    kw = dict(max_new_tokens=4, lookahead=None, max_prompt_tokens=32)
    # 114 tokens: a pass of 128 (144 positions with a call's), four [1, 32] run 192
    prompts = [list(range(3, 3 + n)) for n in (30, 28, 31, 25)]
    results = {}
    listen = lambda u: u.result and results.setdefault(u.result.id, u.result)
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts["gqa"][1], dtype="float64")
        alone = [next(iter(lj.Engine(model, batch=1, **kw).run([p]))).token_ids for p in prompts]
        engine = lj.Engine(model, batch=4, sampled=True, **kw)
        engine.warm_up(lj.Request([1], max_new_tokens=1, logprobs=0))  # (as the server's)
        for i, ids in enumerate(prompts):
            engine.submit(lj.Request(ids, id=i), listen)
        while engine.round():
            pass
    runs = {"4x128 ragged": 2 if split else 1}  # (4 x 32 tokens)
    assert engine.online_stats.prefill_shapes == runs
    assert engine.online_stats.compile_s == 0
    assert [results[i].token_ids for i in range(4)] == alone


@engine_packs
@pytest.mark.parametrize("split", [False, True])
def test_an_admission_with_cached_blocks_run_as_one_ragged_pass_keeps_the_tokens(
    tiny_ckpts, monkeypatch, split
):
    """Rows with cached blocks admitted together, run from scratch in one ragged pass
    (the rule forced: its own test above) beside a row without: a cold decode's tokens,
    float64, their blocks not counted as hits, their suffix shapes set compiling; the
    blocks the pass stored serve a later request. `split`: in two passes (as an
    admission too long for the compiled pass runs), the admission's first and third
    rows, its second and fourth."""
    from lookahead_jax.engine.prefill_planning import PrefillPlanner
    from lookahead_jax.engine.prefix_cache import BLOCK
    from tests.test_prefix_cache import MAX_NEW, PROMPTS

    # (an admission of several rows runs as one pass: a lone one as a suffix; from
    # scratch, not after the blocks they share)
    monkeypatch.setattr(PaddedShapes, "ragged_pays", lambda self, n, *a, **k: n > 1)
    monkeypatch.setattr(PrefillPlanner, "shared_pays", lambda *args: False)
    passes, halved = PrefillPlanner._passes, []

    def halves(self, requests, *one):  # (the admission of four; others as they come)
        if len(requests) != 4:
            return passes(self, requests, *one)
        halved.append(True)
        return [[0, 2], [1, 3]], passes(self, requests, *one)[1]

    if split:
        monkeypatch.setattr(PrefillPlanner, "_passes", halves)
    real, soon = PrefillPlanner._suffixes_soon, []

    def suffixes_soon(self, requests, hits, pool):
        soon.append([r.id for r in requests])
        real(self, requests, hits, pool)

    monkeypatch.setattr(PrefillPlanner, "_suffixes_soon", suffixes_soon)
    kw = dict(batch=4, max_new_tokens=MAX_NEW, lookahead=None)
    with jax.enable_x64(True):
        model = lj.load(tiny_ckpts["gqa"][1], dtype="float64")
        cold = {r.id: r.token_ids for r in lj.Engine(model, **kw).run(PROMPTS)}
        engine = lj.Engine(model, prefix_cache_mb=1, **kw)
        engine.run(PROMPTS[:1])  # its two blocks cached
        hits = engine.stats.prefix_hits
        later = [lj.Request(PROMPTS[i], id=i) for i in (1, 2, 3, 5)]
        hot = {r.id: r.token_ids for r in engine.run(later)}
        assert any(shape.endswith("ragged") for shape in engine.stats.prefill_shapes)
        assert bool(halved) == split  # (the four in two passes, through the admission)
        assert engine.stats.prefix_hits == hits, engine.stats.prefill_shapes
        # the rows with hits of a pass: their suffix shapes compiling, for later admissions
        assert soon and all(set(ids) <= {1, 2, 3} for ids in soon), soon
        # alone, from three blocks: two of the first prompt's, one the ragged pass stored
        # (from them, not from scratch while its suffix shape compiles: prompt_instead's
        # rule, which runs where no compile was measured yet, as where the pass ran at
        # shapes other tests of the process compiled)
        monkeypatch.setattr(PrefillPlanner, "prompt_instead", lambda *args, **kwargs: False)
        again = next(iter(engine.run([lj.Request(PROMPTS[2], id=2)])))
        assert engine.stats.prefix_hit_tokens == 3 * BLOCK
    assert hot == {i: cold[i] for i in hot}
    assert again.token_ids == cold[2]
