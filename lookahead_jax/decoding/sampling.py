"""Choosing the next token: greedy, or sampling with temperature / top-k / top-p.

Sampling uses the Gumbel-max trick with noise that depends only on (seed, row,
output index):

    token_j = argmax(process(logits_j) + gumbel(fold_in(row_key, j)))

where j is the index of the token among the row's new tokens. Because the noise
for position j is independent of everything the model saw before j, token_j is
an exact sample from softmax(process(logits_j)) given the context — the model's
sampling distribution, unchanged. Because the noise is a fixed function of j,
the choice is a deterministic function of the context, so:

* plain decoding and lookahead decoding with the same seed give the *same*
  tokens, and verifying a guess under sampling is the same exact-match test as
  under greedy decoding;
* this *is* the multi-candidate rejection rule of the lookahead paper, with one
  particular coupling of its random draws: a deterministic draft token x is
  accepted iff the Gumbel argmax equals x, which has probability p(x); given
  that it is not x, the argmax is distributed as p with x removed and
  renormalised, so the next distinct candidate y is accepted with probability
  p(y) / (1 - p(x)); when no candidate matches, the argmax is a draw from the
  residual. (tests/test_sampling_distribution.py checks this statistically.)
* a row's tokens depend on (seed, row index, prompt) only, never on the other
  rows of the batch.

Logit processing follows Hugging Face's order and semantics: temperature, then
top-k (keep ties with the k-th value), then top-p (drop the tokens whose
ascending cumulative probability is <= 1 - top_p, always keep the most likely;
tokens tied with the least likely kept one are kept too).

Settings are per row, on the device (`RowSampling`: temperature, top-k, top-p as [B]
arrays), so rows with different settings share one batch and one compiled program: a
greedy row takes the argmax, a sampling row the Gumbel-max of its processed logits.
Whether any row of a program may sample is static (`DecodeSpec.sampled`): an all-greedy
program carries no sampling code at all, and one that may sample skips it at run time
(`lax.cond`) in a step where every row is greedy. The filtering sorts nothing: top-k's
k-th value and top-p's cut-off are found by bisection on the value, a vectorised count
or sum over the vocabulary per step (`_top_k_top_p`), each only in a step where some row
asks for it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from lookahead_jax.errors import UserInputError
from lookahead_jax.models import cpu_kernel


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not 0 <= self.temperature < float("inf"):  # also rejects NaN
            raise UserInputError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise UserInputError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UserInputError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def describe(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RowSampling:
    """Each row's settings on the device: how it chooses tokens, and what it reports.

    temperature  [B] float32   0: greedy
    top_k        [B] int32     0: off
    top_p        [B] float32   1: off
    logprobs     [B] bool      keep its new tokens' logprobs (DecodeSpec.logprobs)
    prompt_logprobs [B] bool   and its prompt's (prompt_logprobs.py), at the prefill
    """

    temperature: Float[Array, " B"]
    top_k: Int[Array, " B"]
    top_p: Float[Array, " B"]
    logprobs: Bool[Array, " B"]
    prompt_logprobs: Bool[Array, " B"]

    @classmethod
    def of(cls, configs, logprobs=None, prompt_logprobs=None) -> RowSampling:
        """numpy [B] arrays for a list of SamplingConfig, one per row (logprobs,
        prompt_logprobs: a bool per row; default: none asks)."""
        no = np.zeros(len(configs), bool)
        return cls(
            temperature=np.asarray([c.temperature for c in configs], np.float32),
            # top-k past int32 is top-k off (no vocabulary is that large)
            top_k=np.asarray([min(c.top_k or 0, 2**31 - 1) for c in configs], np.int32),
            top_p=np.asarray([1.0 if c.top_p is None else c.top_p for c in configs], np.float32),
            logprobs=no if logprobs is None else np.asarray(logprobs, bool),
            prompt_logprobs=no if prompt_logprobs is None else np.asarray(prompt_logprobs, bool),
        )

    @classmethod
    def shaped(cls, batch: int) -> RowSampling:
        """Each field's jax.ShapeDtypeStruct for `batch` rows (a program's argument)."""
        row = lambda dtype: jax.ShapeDtypeStruct((batch,), dtype)  # noqa: E731
        return cls(
            row(jnp.float32), row(jnp.int32), row(jnp.float32), row(jnp.bool_), row(jnp.bool_)
        )

    def greedy(self) -> jax.Array:
        """[B] bool: rows that take the argmax (temperature 0, or top-k 1)."""
        return (self.temperature == 0) | (self.top_k == 1)


def row_keys(seed: int, batch: int) -> jax.Array:
    """Raw uint32 keys [B, 2]: row b's key is fold_in(PRNGKey(seed), b)."""
    return jnp.asarray(keys_for(seed, np.arange(batch, dtype=np.uint32)))


def keys_for(seed: int, keys_b) -> jax.Array | np.ndarray:
    """Raw uint32 keys [B, 2]: fold_in(PRNGKey(seed), keys_b[b]) for uint32 keys_b [B]
    (the engine keys a prompt by its id, so its slot never changes its noise).

    A seed in 0 .. 2^32 - 1 (every seed the engine takes from a request) is hashed here
    with numpy (`fold_in_np`, the same bits as JAX's threefry): JAX's own eager ops
    compile on their first call, 0.4 s of every CLI call's first prefill."""
    traced = isinstance(keys_b, jax.core.Tracer)  # (inside a jitted function)
    if not traced and isinstance(seed, int | np.integer) and 0 <= seed < 2**32:
        return fold_in_np(np.array([0, seed], np.uint32), np.asarray(keys_b, np.uint32))
    base = jax.random.PRNGKey(seed)
    keys_b = jnp.asarray(keys_b, jnp.uint32)
    return jax.vmap(lambda k: jax.random.fold_in(base, k))(keys_b)


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def fold_in_np(key_2, data_b) -> np.ndarray:
    """[B, 2] uint32: jax.random.fold_in(key_2, data_b[b]) for the default (threefry2x32)
    PRNG, in numpy: the Threefry-2x32 hash (20 rounds, JAX's
    _threefry2x32_lowering) of the count (0, data) under the key."""
    k0, k1 = (np.uint32(k) for k in key_2)
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = np.zeros(np.shape(data_b), np.uint32) + ks[0]
    x1 = np.asarray(data_b, np.uint32) + ks[1]
    with np.errstate(over="ignore"):
        for i in range(5):  # 5 x 4 rounds, the key injected after each 4
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
                x1 = x0 ^ x1
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return np.stack([x0, x1], axis=-1)


def process_logits(logits_brv, rows: RowSampling):
    """Temperature, top-k, top-p on logits [B, R, V] with each row's settings; removed
    tokens get -inf (a greedy row's logits come back as they were: it takes the argmax)."""
    greedy_b = rows.greedy()
    x = logits_brv.astype(jnp.promote_types(logits_brv.dtype, jnp.float32))
    x = x / jnp.where(greedy_b, 1.0, rows.temperature).astype(x.dtype)[:, None, None]
    vocab = x.shape[-1]
    k_b = jnp.where((rows.top_k > 0) & (rows.top_k < vocab) & ~greedy_b, rows.top_k, vocab)
    p_b = jnp.where(greedy_b, 1.0, rows.top_p)
    filtered = jnp.any(k_b < vocab) | jnp.any(p_b < 1.0)
    return jax.lax.cond(filtered, _top_k_top_p, lambda x, k, p: x, x, k_b, p_b)


def _top_k_top_p(x, k_b, p_b):
    """Top-k (k_b [B], V = off) then top-p (p_b [B], 1 = off) of x [B, R, V], with no sort:
    each filter is a threshold on the value, found by bisection over the values' bit
    patterns (`_float_key`), one vectorised pass over V per step, so at most 32 passes
    each for float32 (64 for float64), and exact: the threshold is a value present in x.

    The kept set is the one a sort defines (HF's rule), written without the order:

    * top-k keeps x >= kth, kth the k-th largest value counting repeats, that is the
      largest value v with count(x >= v) >= k (ties with it stay);
    * top-p, on the probabilities q of the top-k-filtered logits, drops the tokens whose
      ascending cumulative probability is <= 1 - p, always keeping the most likely, and
      keeps every token tied with the least likely kept one: it keeps x >= cutoff, cutoff
      the smallest value v with sum(q[x <= v]) > 1 - p (the end of v's group in the
      ascending order is where the cumulative sum first passes 1 - p), or the largest
      value when there is none.

    A value's group of ties is dropped or kept whole, so how a sort orders tied tokens
    never enters. Only the rounding of the sum differs from a cumulative sum over a
    sorted copy: where p is within float rounding of a partial sum, the cut may fall one
    value group to either side (tests/test_sampling_filter.py checks both: the same
    kept sets for p off those sums, ties and signed zeros included, and at most one
    group's difference for p on them). NaN logits are not handled."""
    neg_inf = jnp.asarray(-jnp.inf, x.dtype)
    key = _float_key(x)  # [B, R, V]
    lowest = jnp.min(key, axis=-1, keepdims=True)
    highest = jnp.max(key, axis=-1, keepdims=True)
    vocab = x.shape[-1]

    def top_k(x):
        # invariant: count(key >= lo) >= k > count(key >= hi); lo ends as the k-th largest
        k = k_b[:, None, None]

        def k_or_more(mid):
            return jnp.sum(key >= mid, axis=-1, keepdims=True) >= k

        kth = _float_of_key(_bisect(k_or_more, lowest, highest + 1)[0], x.dtype)
        return jnp.where(x < kth, neg_inf, x), kth

    x, kth = jax.lax.cond(
        jnp.any(k_b < vocab), top_k, lambda x: (x, jnp.full_like(x[..., :1], neg_inf)), x
    )

    def top_p(x):
        # q of a token top-k removed is 0, so it adds nothing to the sums below, and the
        # search starts just under the k-th largest value.
        # invariant: sum(q[key <= lo]) <= 1 - p < sum(q[key <= hi]), or hi is the
        # largest value (the most likely token always stays); hi ends as the cutoff.
        q = jax.nn.softmax(x, axis=-1)
        p = p_b[:, None, None]

        def within_one_minus_p(mid):
            return jnp.sum(jnp.where(key <= mid, q, 0), axis=-1, keepdims=True) <= 1.0 - p

        lo = jnp.maximum(_float_key(kth), lowest) - 1
        cutoff = _float_of_key(_bisect(within_one_minus_p, lo, highest)[1], x.dtype)
        return jnp.where((p < 1.0) & (x < cutoff), neg_inf, x)

    return jax.lax.cond(jnp.any(p_b < 1.0), top_p, lambda x: x, x)


def _bisect(pred, lo, hi):
    """(lo, hi) with hi = lo + 1 where pred(lo) and not pred(hi), for integer keys lo < hi
    (any shape) with pred(lo) True and pred(hi) False and a pred that is True up to some
    key and False from there on. One step per bit at most; every row steps until the
    last is done (a done row's mid is its lo, which changes nothing)."""

    def step(lo_hi):
        lo, hi = lo_hi
        mid = lo + (hi - lo) // 2  # lo < mid < hi while hi - lo > 1
        ok = pred(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    return jax.lax.while_loop(lambda lo_hi: jnp.any(lo_hi[1] - lo_hi[0] > 1), step, (lo, hi))


def _float_key(x):
    """Unsigned integer keys in x's float order: -inf < ... < -0.0 = 0.0 < ... < inf
    (jnp.sort's order; NaN is not handled). The sign bit flips for x >= 0, every bit for
    x < 0."""
    utype = jnp.uint64 if x.dtype.itemsize == 8 else jnp.uint32
    sign = utype(1 << (8 * x.dtype.itemsize - 1))
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.zeros_like(x), x), utype)
    return jnp.where(bits & sign, ~bits, bits | sign)


def _float_of_key(key, dtype):
    """The float of a `_float_key` key (0.0 for the key of -0.0)."""
    sign = key.dtype.type(1 << (8 * key.dtype.itemsize - 1))
    return jax.lax.bitcast_convert_type(jnp.where(key & sign, key ^ sign, ~key), dtype)


def gumbel_noise(rng_b2, out_index_br, vocab: int, kernel: bool = False):
    """Gumbel noise [B, R, V] for the new-token indices [B, R] of each row:
    jax.random.gumbel(fold_in(row key, index), (V,)). With `kernel` (as first_max_index's)
    and JAX's default threefry bits, the bits come from the CPU kernel
    (cpu_kernel.threefry_bits: XLA:CPU's loop over the hash took 4.4 ms for a 16-row
    step's [16, 49152] bits, Intel Xeon model 207; the kernel 0.6 ms) and go through
    jax.random.gumbel's own transform: the same values, bit for bit."""
    keys_br2 = jax.vmap(lambda rng, js: jax.vmap(lambda j: jax.random.fold_in(rng, j))(js))(
        rng_b2, out_index_br
    )
    if kernel and _threefry_bits_are_jaxs(keys_br2):
        return _gumbel_of_bits(cpu_kernel.threefry_bits(keys_br2, vocab))
    one = lambda key: jax.random.gumbel(key, (vocab,), jnp.float32)  # noqa: E731
    return jax.vmap(jax.vmap(one))(keys_br2)


def _threefry_bits_are_jaxs(keys) -> bool:
    """Whether cpu_kernel.threefry_bits gives jax.random.bits's values for these keys:
    raw uint32 threefry2x32 keys, partitionable bits, and gumbel's default ("low") mode
    reading 32 bits a value."""
    return (
        keys.dtype == jnp.uint32
        and keys.shape[-1] == 2
        and jax.config.jax_default_prng_impl == "threefry2x32"
        and jax.config.jax_threefry_partitionable
        and not jax.config.jax_high_dynamic_range_gumbel
    )


def _gumbel_of_bits(bits):
    """jax.random.gumbel's float32 "low" mode from its random bits: a uniform in
    [tiny, 1) from the top 23 bits (jax.random.uniform's), then -log(-log(u))."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    one = np.float32(1.0)
    mantissa = (bits >> np.uint32(9)) | np.uint32(0x3F800000)
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - one
    uniform = jnp.maximum(tiny, floats * (one - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform))


def first_max_index(x, kernel: bool = False):
    """jnp.argmax over the last axis, int32: the first index of the largest value (a NaN
    counts as the largest, as there). With `kernel` (the CPU kernel runs the model:
    packed.is_packed(params), as its matmuls and attention decide) and float32 x: the
    kernel's one pass (cpu_kernel.first_max_index; over a 16-row step's [16, 49152] logits
    XLA's reductions below took 1.5-1.8 ms, Intel Xeon). Else a max, then the smallest
    index holding it: two single-output reductions, where argmax is one over (value,
    index) pairs, which XLA:CPU runs unvectorized (over a 16-token step's [15, 49152]
    logits 1.44 ms alone against 0.82 ms, Intel Xeon; 2.3 ms of the step in the loop)."""
    if kernel and x.dtype == jnp.float32 and x.shape[-1]:
        return cpu_kernel.first_max_index(x)
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where((x == top) | jnp.isnan(x), index, x.shape[-1]), axis=-1)


def logsumexp(x, kernel: bool = False):
    """jax.nn.logsumexp over the last axis, x [..., V] -> [...]. With `kernel` (as
    first_max_index's) and float32 x: the CPU kernel's two passes (cpu_kernel.logsumexp:
    over a 16-token step's [15, 49152] logits XLA's reduce of exp and its max took 2.0 ms
    of the step in a profile, Intel Xeon model 207, the kernel 0.26 ms)."""
    if kernel and x.dtype == jnp.float32 and x.shape[-1]:
        return cpu_kernel.logsumexp(x)
    return jax.nn.logsumexp(x, axis=-1)


def choose_tokens(
    logits_brv, rows: RowSampling, rng_b2, out_index_br, sampled: bool = True, kernel: bool = False
):
    """The token at each of R positions [B, R]; out_index_br is each one's new-token index.

    A greedy row takes the argmax, a sampling row the argmax of its processed logits plus
    the Gumbel noise of (its key, the index). `sampled` False (static): every row is
    greedy and no sampling code is compiled. `kernel`: first_max_index's."""
    argmax = first_max_index(logits_brv, kernel)
    if not sampled:
        return argmax
    greedy_b = rows.greedy()

    def sample():
        x = process_logits(logits_brv, rows)
        x = x + gumbel_noise(rng_b2, out_index_br, logits_brv.shape[-1], kernel)
        chosen = first_max_index(x, kernel)
        return jnp.where(greedy_b[:, None], argmax, chosen)

    return jax.lax.cond(jnp.all(greedy_b), lambda: argmax, sample)
