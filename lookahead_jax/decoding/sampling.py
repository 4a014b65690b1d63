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
(`lax.cond`) in a step where every row is greedy. The filtering sorts each position's
logits once (top-k's k-th value and top-p's cumulative sum from the same sort), and only
in a step where some row asks for top-k or top-p.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.errors import UserInputError


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
    """Each row's sampling settings on the device.

    temperature  [B] float32   0: greedy
    top_k        [B] int32     0: off
    top_p        [B] float32   1: off
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def of(cls, configs) -> RowSampling:
        """numpy [B] arrays for a list of SamplingConfig, one per row."""
        return cls(
            temperature=np.asarray([c.temperature for c in configs], np.float32),
            # top-k past int32 is top-k off (no vocabulary is that large)
            top_k=np.asarray([min(c.top_k or 0, 2**31 - 1) for c in configs], np.int32),
            top_p=np.asarray([1.0 if c.top_p is None else c.top_p for c in configs], np.float32),
        )

    def greedy(self) -> jax.Array:
        """[B] bool: rows that take the argmax (temperature 0, or top-k 1)."""
        return (self.temperature == 0) | (self.top_k == 1)


def row_keys(seed: int, batch: int) -> jax.Array:
    """Raw uint32 keys [B, 2]: row b's key is fold_in(PRNGKey(seed), b)."""
    return keys_for(seed, jnp.arange(batch, dtype=jnp.uint32))


def keys_for(seed: int, keys_b) -> jax.Array:
    """Raw uint32 keys [B, 2]: fold_in(PRNGKey(seed), keys_b[b]) for uint32 keys_b [B]
    (the engine keys a prompt by its id, so its slot never changes its noise)."""
    base = jax.random.PRNGKey(seed)
    keys_b = jnp.asarray(keys_b, jnp.uint32)
    return jax.vmap(lambda k: jax.random.fold_in(base, k))(keys_b)


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
    """Top-k (k_b [B], V = off) then top-p (p_b [B], 1 = off) of x [B, R, V] from one
    ascending sort of each position's logits."""
    neg_inf = jnp.asarray(-jnp.inf, x.dtype)
    vocab = x.shape[-1]
    sorted_x = jnp.sort(x, axis=-1)  # ascending
    # top-k: the k-th largest value; tokens below it go, ties with it stay
    kth = jnp.take_along_axis(sorted_x, (vocab - k_b)[:, None, None], axis=-1)
    kth = jnp.broadcast_to(kth, (*x.shape[:-1], 1))
    x = jnp.where(x < kth, neg_inf, x)
    sorted_x = jnp.where(sorted_x < kth, neg_inf, sorted_x)  # still ascending
    # top-p: sorted positions with cum <= 1 - top_p are dropped; cum only grows, so they
    # are a prefix, and the kept tokens are those >= the first kept value (the most
    # likely token is always kept). Ties at the cut are all kept.
    cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
    p = p_b[:, None, None]
    n_drop = jnp.minimum(jnp.sum(cum <= 1.0 - p, axis=-1, keepdims=True), vocab - 1)
    cutoff = jnp.take_along_axis(sorted_x, n_drop, axis=-1)
    return jnp.where((p < 1.0) & (x < cutoff), neg_inf, x)


def gumbel_noise(rng_b2, out_index_br, vocab: int):
    """Gumbel noise [B, R, V] for the new-token indices [B, R] of each row."""

    def one(rng, j):
        return jax.random.gumbel(jax.random.fold_in(rng, j), (vocab,), jnp.float32)

    return jax.vmap(lambda rng, js: jax.vmap(lambda j: one(rng, j))(js))(rng_b2, out_index_br)


def choose_tokens(logits_brv, rows: RowSampling, rng_b2, out_index_br, sampled: bool = True):
    """The token at each of R positions [B, R]; out_index_br is each one's new-token index.

    A greedy row takes the argmax, a sampling row the argmax of its processed logits plus
    the Gumbel noise of (its key, the index). `sampled` False (static): every row is
    greedy and no sampling code is compiled."""
    argmax = jnp.argmax(logits_brv, axis=-1).astype(jnp.int32)
    if not sampled:
        return argmax
    greedy_b = rows.greedy()

    def sample():
        x = process_logits(logits_brv, rows)
        x = x + gumbel_noise(rng_b2, out_index_br, logits_brv.shape[-1])
        chosen = jnp.argmax(x, axis=-1).astype(jnp.int32)
        return jnp.where(greedy_b[:, None], argmax, chosen)

    return jax.lax.cond(jnp.all(greedy_b), lambda: argmax, sample)
