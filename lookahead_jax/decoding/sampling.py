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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

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


def row_keys(seed: int, batch: int) -> jax.Array:
    """Raw uint32 keys [B, 2]: row b's key is fold_in(PRNGKey(seed), b)."""
    return keys_for(seed, jnp.arange(batch, dtype=jnp.uint32))


def keys_for(seed: int, keys_b) -> jax.Array:
    """Raw uint32 keys [B, 2]: fold_in(PRNGKey(seed), keys_b[b]) for uint32 keys_b [B]
    (the engine keys a prompt by its id, so its slot never changes its noise)."""
    base = jax.random.PRNGKey(seed)
    keys_b = jnp.asarray(keys_b, jnp.uint32)
    return jax.vmap(lambda k: jax.random.fold_in(base, k))(keys_b)


def process_logits(logits, cfg: SamplingConfig):
    """Temperature, top-k, top-p on float32 logits [..., V]; removed tokens get -inf."""
    x = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) / cfg.temperature
    neg_inf = jnp.asarray(-jnp.inf, x.dtype)
    vocab = x.shape[-1]
    if cfg.top_k and cfg.top_k < vocab:
        kth = jax.lax.top_k(x, cfg.top_k)[0][..., -1:]
        x = jnp.where(x < kth, neg_inf, x)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)  # ascending
        cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
        # Sorted positions with cum <= 1 - top_p are dropped; cum only grows, so they
        # are a prefix, and the kept tokens are those >= the first kept value (the
        # most likely token is always kept). Ties at the cut are all kept.
        n_drop = jnp.minimum(jnp.sum(cum <= 1.0 - cfg.top_p, axis=-1, keepdims=True), vocab - 1)
        cutoff = jnp.take_along_axis(sorted_x, n_drop, axis=-1)
        x = jnp.where(x < cutoff, neg_inf, x)
    return x


def gumbel_noise(rng_b2, out_index_br, vocab: int):
    """Gumbel noise [B, R, V] for the new-token indices [B, R] of each row."""

    def one(rng, j):
        return jax.random.gumbel(jax.random.fold_in(rng, j), (vocab,), jnp.float32)

    return jax.vmap(lambda rng, js: jax.vmap(lambda j: one(rng, j))(js))(rng_b2, out_index_br)


def choose_tokens(logits_brv, cfg: SamplingConfig, rng_b2, out_index_br):
    """The token at each of R positions [B, R]; out_index_br is each one's new-token index."""
    if cfg.greedy:
        return jnp.argmax(logits_brv, axis=-1).astype(jnp.int32)
    x = process_logits(logits_brv, cfg)
    x = x + gumbel_noise(rng_b2, out_index_br, logits_brv.shape[-1])
    return jnp.argmax(x, axis=-1).astype(jnp.int32)
