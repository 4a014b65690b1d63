"""The CPU kernels (models/cpu_kernel/) and the packed weights (models/packed.py): the small-M
matmul against XLA's matmul at every M the tile code has a path for, float32 and int8; a
row's result independent of the other rows (what makes a lookahead step's logits those of a
one-token step, bit for bit); the AVX-512 tile's bits those of the AVX2 tile; the embedding
lookup out of the panels; the cache attention against llama.attention's own (ragged and
empty rows, lookahead masks, sliding windows, head dims of one and several tiles) and a
query's result independent of the other queries; the packed model's forward against the
unpacked one's; lookahead == plain on a packed model; and which weights `lj.load` packs."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import lookahead_jax as lj
from lookahead_jax.decoding import sampling
from lookahead_jax.models import cpu_kernel, fused, packed, quantize
from lookahead_jax.models.llama import attention, forward
from lookahead_jax.models.packed import PackedWeight
from tests.helpers import cpu_kernel_runs

pytestmark = pytest.mark.skipif(
    not cpu_kernel_runs(), reason="the CPU kernel does not run here (a CPU, x86-64, AVX2, g++)"
)


def _weight(rng, K, N):
    return jnp.asarray((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32))


# rows in 4 groups of 12 a core and a last of 4: a prefill's many groups, which the
# AVX-512 tile's transpose shares out between XLA's threads (one a core; small_m.cc)
MANY_ROWS = 48 * (os.cpu_count() or 1) + 4


@pytest.mark.parametrize("M", [1, 2, 5, 7, 13, 25, MANY_ROWS])
def test_kernel_is_xlas_matmul(M):
    """One row, partial tiles (2, 5), groups of unequal size (the AVX2 tile's 7 = 4 + 3
    and 13 = 5 + 4 + 4; the AVX-512 tile's 7 in one group, 13 = 7 + 6, 25 = 9 + 9 + 7;
    MANY_ROWS: groups of 12 and a last of 4, transposed by several threads), K not a
    multiple of anything, N of several panels; float32 and per-channel int8."""
    rng = np.random.default_rng(M)
    K, N = 37, 80
    w = _weight(rng, K, N)
    x = jnp.asarray(rng.standard_normal((M, K)).astype(np.float32))
    got = packed.einsum("mk,kn->mn", x, packed.pack(w, (0,)))
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)
    q = quantize.quantize(w, (0,))
    got = packed.einsum("mk,kn->mn", x, packed.pack(q, (0,)))
    want = (x @ q.q.astype(jnp.float32)) * q.scale
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Row r of an M-row product equals, bit for bit, the one-row product of row r (rows
    at the edges of the AVX2 tile's groups, 16 rows 6 + 5 + 5 and 8 rows 4 + 4, where the
    CPU has no AVX-512; with it, 16 rows go 8 + 8 and 8 rows in one group)."""
    rng = np.random.default_rng(0)
    w = packed.pack(_weight(rng, 576, 192), (0,))
    x = jnp.asarray(rng.standard_normal((16, 576)).astype(np.float32))
    for M, rows in ((16, (0, 5, 6, 11, 15)), (8, (3, 4, 7))):
        many = np.asarray(packed.einsum("mk,kn->mn", x[:M], w))
        for r in rows:
            one = np.asarray(packed.einsum("mk,kn->mn", x[r : r + 1], w))
            np.testing.assert_array_equal(many[r : r + 1], one)


_TILE_CHECK = """
import os, sys
import jax.numpy as jnp, numpy as np
from lookahead_jax.models import cpu_kernel, fused, packed, quantize
rng = np.random.default_rng(7)
# 4 x cores + 3 panels: every thread's chunk holds a pair of panels and a single one
n = 16 * (4 * os.cpu_count() + 3)
w = jnp.asarray(rng.standard_normal((96, n)).astype(np.float32))
f, i = [], []
for m in (2, 8, 12, 13, 29):  # up to 6 rows AVX2 in both; one group; 7 + 6; 10 + 10 + 9
    x = jnp.asarray(rng.standard_normal((m, 96)).astype(np.float32))
    f.append(np.asarray(packed.einsum("mk,kn->mn", x, packed.pack(w, (0,)))).ravel())
    q = packed.pack(quantize.quantize(w, (0,)), (0,))
    i.append(np.asarray(packed.einsum("mk,kn->mn", x, q)).ravel())
# the attention's (AVX-512 from 7 tokens a call, for a pass's segments and units of
# more than 6 queries: a unit is a kv head's R queries over 2 x threads / heads, so these
# shapes take it below 11 and 16 threads): a 16-token step with a window, an 8-token one,
# 64 tokens of a head dim of 16 + 8, a ragged pass's two segments (head dim 16 + 8), each
# over two tiles of positions or more, and 16 rows of one token (AVX2 in both)
a = []
for B, K, T, S, Dh, window, segments in (
    (1, 3, 16, 50, 64, 20, False), (1, 3, 8, 50, 64, 0, False), (1, 1, 64, 100, 24, 0, False),
    (2, 3, 32, 32, 24, 0, True), (16, 3, 1, 40, 64, 0, False),
):
    q, k, v = (jnp.asarray(rng.standard_normal((B, K, n, Dh)).astype(np.float32))
               for n in (3 * T, S, S))
    lengths = jnp.asarray(rng.integers((S - T) // 2, S - T + 1, B), jnp.int32)
    lengths = jnp.full((B,), T, jnp.int32) if segments else lengths  # (a pass: its T)
    first = jnp.asarray(np.repeat([[0] * 9 + [9] * (T - 9)], B, 0), jnp.int32)
    positions = first if segments else lengths[:, None] + jnp.arange(T, dtype=jnp.int32)
    out = cpu_kernel.cache_attention(q, k, v, lengths, positions, window, 0.125, segments)
    a += [np.asarray(o).ravel() for o in out]
# the logsumexp's (row_logsumexp.cc: its AVX-512 path whenever the CPU has it): whole
# 16-element blocks and a tail, rows over 1 and 2 threads
for M, N in ((1, 40), (5, 1003), (3, 49152)):
    x = jnp.asarray(rng.standard_normal((M, N)).astype(np.float32) * 4)
    a.append(np.asarray(cpu_kernel.logsumexp(x)))
# and threefry_bits.cc's (16 lanes or 8, then the scalar tail; several work items a key)
keys = jnp.asarray(rng.integers(0, 2**32, (3, 2), dtype=np.uint32))
a.append(np.asarray(cpu_kernel.threefry_bits(keys, 8192 + 29)).view(np.float32))
np.save(sys.argv[1], np.concatenate(f + i + [x.ravel() for x in a]))
print(cpu_kernel._load().lj_small_m_tile_bits())
"""


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx512(), reason="no AVX-512 here: only the AVX2 tile runs")
def test_the_avx512_tile_gives_the_avx2_tiles_bits(tmp_path):
    """small_m.cc's two tiles (AVX-512 where the CPU has it, AVX2 with
    LOOKAHEAD_JAX_CPU_KERNEL=avx2: chosen once a process) compute the same FMA chains:
    the same bits, float32 and int8, through pairs of panels and single ones, one group
    of rows and several (the AVX-512 tile takes 7 rows and more); each process says
    which tile it ran. So do cache_attention.cc's two (group512, group256): a step's tokens
    with a window, a head dim of 16 + 8, a pass's segments; and row_logsumexp.cc's and
    threefry_bits.cc's two."""
    env = {k: v for k, v in os.environ.items() if k != "LOOKAHEAD_JAX_CPU_KERNEL"}
    got = {}
    for bits, extra in ((512, {}), (256, {"LOOKAHEAD_JAX_CPU_KERNEL": "avx2"})):
        out = tmp_path / f"{bits}.npy"
        ran = subprocess.run(
            [sys.executable, "-c", _TILE_CHECK, str(out)],
            env={**env, "JAX_PLATFORMS": "cpu", **extra},
            check=True,
            capture_output=True,
            text=True,
        )
        assert ran.stdout.split()[-1] == str(bits), ran.stdout
        got[bits] = np.load(out)
    np.testing.assert_array_equal(got[512].view(np.uint32), got[256].view(np.uint32))  # bits


def _attention_inputs(rng, B, K, T, Q, S, Dh):
    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32))

    lengths = jnp.asarray(rng.integers(0, S - T + 1, B), jnp.int32)
    lengths = lengths.at[0].set(S - T).at[-1].set(0)  # a full row and an empty one
    positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    # a lookahead-like mask: each token sees itself and a few tokens before it
    t = np.arange(T)
    mask = jnp.asarray((t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < 3))[None]
    new = (normal(B, T, K, Q, Dh), normal(B, K, T, Dh), normal(B, K, T, Dh), mask)
    return new, (normal(B, K, S, Dh), normal(B, K, S, Dh), lengths, positions)


@pytest.mark.parametrize(
    "B, K, T, Q, S, Dh, window",
    [
        (3, 3, 1, 3, 100, 64, 0),  # a one-token step of SmolLM2's heads, ragged rows
        (2, 2, 5, 2, 70, 8, 0),  # several tokens, one register of head dim
        (3, 1, 4, 3, 90, 24, 9),  # a sliding window; a head dim of 16 + 8
    ],
)
def test_cache_attention_is_llamas(B, K, T, Q, S, Dh, window):
    """llama.attention with the cache read by the kernel equals its XLA loop over blocks
    (float32 rounding), for every row including an empty one."""
    new, cache = _attention_inputs(np.random.default_rng(S), B, K, T, Q, S, Dh)

    def run(kernel):
        return jax.jit(attention, static_argnames=("window", "kernel"))(
            *new, *cache, window=window, kernel=kernel
        )

    np.testing.assert_allclose(run(True), run(False), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window", [0, 20])
def test_a_querys_attention_does_not_depend_on_the_other_queries(window):
    """A 16-token step's first token gets, bit for bit, what that token gets alone (with a
    window the step's queries start their visible cache at different positions)."""
    (q, *_), (k, v, lengths, positions) = _attention_inputs(
        np.random.default_rng(7), 2, 3, 16, 3, 80, 64
    )
    q_bkre = jnp.swapaxes(q, 1, 2).reshape(2, 3, 16 * 3, 64)
    many = cpu_kernel.cache_attention(q_bkre, k, v, lengths, positions, window, 0.125)
    one = cpu_kernel.cache_attention(
        q_bkre[:, :, :3], k, v, lengths, positions[:, :1], window, 0.125
    )
    for m, o in zip(many, one, strict=True):
        np.testing.assert_array_equal(np.asarray(m)[:, :, :3], np.asarray(o))


def _argmax_rows(rng, M: int, N: int) -> list[np.ndarray]:
    """[M, N] float32 rows that make an argmax's order show: random values, ties, +inf,
    NaNs (scattered, last, everywhere), all -inf, -0 beside +0, two equal maxima, and
    values placed where the kernel's lanes meet (below)."""
    x = rng.standard_normal((M, N)).astype(np.float32)
    ties, inf, nan, last_nan, twice = (x.copy() for _ in range(5))
    ties = np.round(ties * 2) / 2
    inf[:, ::3] = np.inf
    nan[rng.random((M, N)) < 0.05] = np.nan
    last_nan[:, -1] = np.nan
    twice[:, [N // 2, N - 1]] = 100.0
    zeros = np.where(rng.random((M, N)) < 0.5, np.float32(-0.0), np.float32(0.0))
    every = (np.full((M, N), v, np.float32) for v in (-np.inf, np.nan))
    # where the kernel's lanes meet (N > 70): equal maxima, then NaNs, at 37 and 66 (its
    # first chain's lanes 5 and 2: a merge by lane, not by index, would take 66); +inf
    # before a NaN; a NaN last after +inf (in the tail where N is not a multiple of 32);
    # and the smallest denormal among zeros
    placed = []
    if N > 70:
        for at, values in (
            ((37, 66), (100.0, 100.0)),
            ((37, 66), (np.nan, np.nan)),
            ((0, 70), (np.inf, np.nan)),
            ((5, N - 1), (np.inf, np.nan)),
        ):
            y = x.copy()
            y[:, at[0]], y[:, at[1]] = values
            placed.append(y)
    tiny = np.zeros((M, N), np.float32)
    tiny[:, min(40, N - 1)] = np.float32(1e-45)
    return [x, ties, inf, nan, last_nan, twice, zeros.astype(np.float32), *every, *placed, tiny]


@pytest.mark.parametrize("N", [1, 63, 64, 96, 128, 1003, 49152])
def test_first_max_index_is_jnps_argmax(N):
    """The argmax kernel (row_argmax.cc, sampling.first_max_index's on a CPU) gives
    jnp.argmax's index bit for bit: the first of equal maxima, the first NaN, a vector
    lane's and the scalar tail's candidates merged in one order; over 1, 3 and 16 rows,
    a [2, 3, N] batch and under vmap."""
    rng = np.random.default_rng(N)
    argmax = jax.jit(cpu_kernel.first_max_index)
    assert argmax(jnp.zeros((0, N), jnp.float32)).shape == (0,)
    for M in (1, 3, 16):
        for x in _argmax_rows(rng, M, N):
            want = np.asarray(jnp.argmax(x, axis=-1))
            np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))), want)
    x = jnp.asarray(np.stack(_argmax_rows(rng, 3, N)[:2]))  # [2, 3, N]
    np.testing.assert_array_equal(np.asarray(argmax(x)), np.asarray(jnp.argmax(x, axis=-1)))
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(cpu_kernel.first_max_index)(x)), np.asarray(jnp.argmax(x, axis=-1))
    )


@pytest.mark.parametrize(
    "fn, target",
    [
        (sampling.first_max_index, cpu_kernel.ARGMAX_TARGET),
        (sampling.logsumexp, cpu_kernel.LOGSUMEXP_TARGET),
    ],
    ids=["first_max_index", "logsumexp"],
)
def test_the_logits_reductions_take_the_kernel_only_when_asked(fn, target):
    """sampling.first_max_index and sampling.logsumexp call their kernels where the model
    runs the CPU kernel (`kernel`: its params are packed) and the logits are float32;
    else XLA's reductions (bfloat16, or unpacked params as on a GPU:
    tests/test_sampling_filter.py checks those)."""

    def program(kernel: bool, dtype=jnp.float32) -> str:
        x = jax.ShapeDtypeStruct((3, 100), dtype)
        return jax.jit(lambda x: fn(x, kernel)).lower(x).as_text()

    assert target in program(True)
    assert target not in program(False)
    assert target not in program(True, jnp.bfloat16)


def _logsumexp_rows(rng, M: int, N: int) -> list[np.ndarray]:
    """[M, N] float32 rows for a logsumexp: logits-like values, one far above the rest,
    values whose exp underflows, -inf among numbers, and the rows the result is not a
    sum's: a NaN (last, or beside +inf), +inf (alone, or among -inf), all -inf."""
    x = (rng.standard_normal((M, N)) * 4).astype(np.float32)
    peak, low, some_inf, nan, inf = (x.copy() for _ in range(5))
    both_inf = np.full((M, N), -np.inf, np.float32)
    both_inf[:, N // 2] = np.inf
    peak[:, N // 3] = 80.0
    low[:, : N // 2] = -200.0
    some_inf[:, ::4] = -np.inf
    nan[:, -1] = np.nan
    nan[:, 0] = np.inf
    inf[:, N // 2] = np.inf
    every = np.full((M, N), -np.inf, np.float32)
    return [x, peak, low, some_inf, nan, inf, every, both_inf]


@pytest.mark.parametrize("N", [1, 15, 16, 17, 1003, 49152])
def test_logsumexp_is_jaxs(N):
    """The logsumexp kernel (row_logsumexp.cc, sampling.logsumexp's on a CPU) against the
    float64 logsumexp (scipy's, whose NaN, +inf and all -inf rows jax.nn.logsumexp's
    follow) within 1e-6 (of the result, or of 1 near 0); over 0, 1 and 15 rows, a [2, 3, N] batch
    and under vmap."""
    rng = np.random.default_rng(N)
    lse = jax.jit(cpu_kernel.logsumexp)
    assert lse(jnp.zeros((0, N), jnp.float32)).shape == (0,)
    for M in (1, 15):
        for x in _logsumexp_rows(rng, M, N):
            want = scipy.special.logsumexp(x.astype(np.float64), axis=-1)
            got = np.asarray(lse(jnp.asarray(x)))
            assert got.dtype == np.float32
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    x = jnp.asarray(np.stack(_logsumexp_rows(rng, 3, N)[:2]))  # [2, 3, N]
    want = np.asarray(jax.nn.logsumexp(x, axis=-1))
    np.testing.assert_allclose(np.asarray(lse(x)), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(jax.vmap(cpu_kernel.logsumexp)(x)), np.asarray(lse(x)))


@pytest.mark.parametrize("N", [1, 15, 16, 17, 8192 + 29])
def test_threefry_bits_are_jaxs(N):
    """The threefry kernel (threefry_bits.cc) gives jax.random.bits's uint32 values bit for
    bit (JAX's default partitionable threefry): over counters that end in a vector's
    lanes or in the scalar tail, and in a second work item (from 8192: vector lanes, then
    a tail); for keys [3, 2], [2, 2, 2] and under vmap."""
    keys = jax.random.split(jax.random.PRNGKey(N), 4)
    bits = jax.jit(cpu_kernel.threefry_bits, static_argnums=1)

    def want(keys):
        one = lambda k: jax.random.bits(k, (N,), jnp.uint32)  # noqa: E731
        return np.asarray(jax.vmap(one)(keys.reshape(-1, 2))).reshape(*keys.shape[:-1], N)

    np.testing.assert_array_equal(np.asarray(bits(keys[:3], N)), want(keys[:3]))
    square = keys.reshape(2, 2, 2)
    np.testing.assert_array_equal(np.asarray(bits(square, N)), want(square))
    vmapped = jax.vmap(lambda k: cpu_kernel.threefry_bits(k, N))(square)
    np.testing.assert_array_equal(np.asarray(vmapped), want(square))


def test_the_noise_from_the_kernels_bits_is_jaxs():
    """sampling.gumbel_noise with the kernel's bits gives jax.random.gumbel's values bit
    for bit (its transform of the bits, repeated), the kernel in the program only when
    asked and only for JAX's default threefry bits: not with partitionable bits off, nor
    for gumbel's high-range mode, nor for typed keys."""
    rng = jax.random.split(jax.random.PRNGKey(1), 3)
    index = jnp.asarray([[0, 5], [1, 2], [7, 300]], jnp.int32)

    def noise(kernel: bool):
        return jax.jit(lambda r, i: sampling.gumbel_noise(r, i, 1003, kernel))

    np.testing.assert_array_equal(
        np.asarray(noise(True)(rng, index)), np.asarray(noise(False)(rng, index))
    )
    assert cpu_kernel.THREEFRY_TARGET in noise(True).lower(rng, index).as_text()
    assert cpu_kernel.THREEFRY_TARGET not in noise(False).lower(rng, index).as_text()
    with jax.threefry_partitionable(False):
        assert cpu_kernel.THREEFRY_TARGET not in noise(True).lower(rng, index).as_text()
    high_range = jax.config.jax_high_dynamic_range_gumbel
    jax.config.update("jax_high_dynamic_range_gumbel", True)
    try:
        assert cpu_kernel.THREEFRY_TARGET not in noise(True).lower(rng, index).as_text()
    finally:
        jax.config.update("jax_high_dynamic_range_gumbel", high_range)
    typed = jax.random.split(jax.random.key(1), 3)
    assert cpu_kernel.THREEFRY_TARGET not in noise(True).lower(typed, index).as_text()


def test_lookup_and_lm_head_out_of_the_panels():
    """A [V, D] embedding packed over D: its rows come back exactly (float and int8),
    and as the LM head it is x @ E.T."""
    rng = np.random.default_rng(1)
    emb = jnp.asarray(rng.standard_normal((48, 24)).astype(np.float32))
    ids = jnp.asarray([[0, 17, 47], [16, 15, 1]])
    p = packed.pack(emb, (1,))
    assert isinstance(p, PackedWeight) and p.panels.shape == (3, 24, 16)
    np.testing.assert_array_equal(packed.take_rows(p, ids), emb[ids])
    q = quantize.quantize(emb, (1,))
    np.testing.assert_allclose(
        packed.take_rows(packed.pack(q, (1,)), ids), quantize.take_rows(q, ids), rtol=1e-6
    )
    x = jnp.asarray(rng.standard_normal((2, 3, 24)).astype(np.float32))
    np.testing.assert_allclose(packed.einsum("brd,vd->brv", x, p), x @ emb.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot take the einsum"):
        packed.einsum("brv,vd->brd", x, p)  # contracting the kept axis


def test_what_is_packed():
    """A weight whose N is not a multiple of 16, a float64 one and a Q8_0 one stay as they are."""
    rng = np.random.default_rng(2)
    assert not isinstance(packed.pack(_weight(rng, 16, 24), (0,)), PackedWeight)
    with jax.enable_x64(True):
        assert not isinstance(packed.pack(jnp.zeros((16, 32), jnp.float64), (0,)), PackedWeight)
    q8 = quantize.quantize(_weight(rng, 64, 32), (0,), block=32)
    assert packed.pack(q8, (0,)) is q8


@pytest.mark.parametrize("variant", ["gqa", "tied"])
def test_load_packs_and_the_forward_agrees(tiny_ckpts, variant):
    """gqa: an untied LM head [D, V]; tied: the embedding packed from its transpose serves
    the lookup and the LM head. Both int8 and float32 packed, Q/K/V and gate/up fused
    (packed.pack_group): the same bits as the unfused panels."""
    path = tiny_ckpts[variant][1]
    plain, kern, int8 = (lj.load(path, cpu_kernel=False), lj.load(path),
                         lj.load(path, weights="int8"))  # fmt: skip
    apart = lj.load(path, fuse=False)
    assert not packed.is_packed(plain.params) and not fused.has_fused(plain.params)
    lp = kern.params.layers[0]
    assert all(isinstance(w, PackedWeight) for w in (lp.wqkv, lp.wo, lp.w_gate_up, lp.w_down))
    assert isinstance(kern.params.embed, PackedWeight)
    assert isinstance(apart.params.layers[0].wq, PackedWeight)
    assert isinstance(int8.params.layers[0].w_gate_up, PackedWeight)
    assert int8.params.layers[0].w_gate_up.panels.dtype == jnp.int8
    cfg = plain.lm.cfg
    tokens = jnp.asarray([[5, 9, 14, 3, 7, 2]], jnp.int32)
    pos = jnp.arange(6)[None]
    mask = jnp.tril(jnp.ones((1, 6, 6), bool))
    want = forward(plain.params, cfg, tokens, pos, mask)[0]
    got = forward(kern.params, cfg, tokens, pos, mask)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got, forward(apart.params, cfg, tokens, pos, mask)[0])
    int8_apart = lj.load(path, weights="int8", fuse=False)  # (the scales fused in order)
    np.testing.assert_array_equal(
        forward(int8.params, cfg, tokens, pos, mask)[0],
        forward(int8_apart.params, cfg, tokens, pos, mask)[0],
    )


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_lookahead_equals_plain_on_the_packed_model(tiny_ckpts, weights):
    """float32, the kernel in every matmul (float32 or int8 panels; test_int8's exactness
    runs in float64, unpacked): lookahead's tokens are plain decoding's, and lookahead
    accepted guesses (not a vacuous pass)."""
    kern = lj.load(tiny_ckpts["gqa"][1], weights=weights)
    assert packed.is_packed(kern.params)
    prompts = [[5, 9, 14, 3, 7, 2, 5, 9, 14, 3], [11, 12, 13, 11, 12, 13, 11]]
    plain = lj.generate(kern, prompts, max_new_tokens=24, lookahead=None)
    la = lj.generate(kern, prompts, max_new_tokens=24, lookahead=lj.LookaheadConfig.for_tokens(8))
    assert la.token_ids == plain.token_ids
    assert la.stats.compression > 1.0


def test_what_cannot_take_packed_params(tiny_ckpts):
    """Checkpoint names, training and a kernel asked for where it cannot run: each says so."""
    from lookahead_jax.errors import UserInputError
    from lookahead_jax.models.llama_params import flat_names
    from lookahead_jax.training import TrainConfig, train

    path = tiny_ckpts["gqa"][1]
    model = lj.load(path)
    with pytest.raises(ValueError, match="cpu_kernel=False"):
        flat_names(model.params)
    with pytest.raises(UserInputError, match="cpu_kernel=False"):
        train(model, None, "unused", TrainConfig(), progress=False)
    with pytest.raises(UserInputError, match="cpu_kernel=True needs"):
        lj.load(path, weights="q8_0", cpu_kernel=True)


def test_a_failing_build_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    """A compiler that fails: OSError with its message, and no library (nor half of one)
    where the cache would look for it."""
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\necho 'no such luck' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    out = tmp_path / "kernels.so"
    with pytest.raises(OSError, match="no such luck"):
        cpu_kernel._build(out)
    assert list(tmp_path.iterdir()) == [fake]


def test_the_librarys_key_holds_the_compiler(monkeypatch, tmp_path):
    """A library another compiler built is not reused (the build cache's key)."""
    fake = tmp_path / "other-c++"
    fake.write_text("#!/bin/sh\necho 'other-c++ (Fake) 99.1'\n")
    fake.chmod(0o755)
    monkeypatch.delenv("CXX", raising=False)
    default = cpu_kernel._library_path()
    monkeypatch.setenv("CXX", str(fake))
    assert cpu_kernel._compiler_id(str(fake)) == f"{fake} other-c++ (Fake) 99.1"
    assert cpu_kernel._library_path() != default
