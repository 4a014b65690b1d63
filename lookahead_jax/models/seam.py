"""The model seam: all that decoding (prefill, plain and lookahead steps, autotune,
sharding) needs from a causal language model.

A model is any hashable object (it is a static argument of the jitted programs) with:

    vocab_size: int      logits width V; token ids are in [0, V)
    max_context: int     the most positions a row may reach (prompt + new tokens)

    apply(params, tokens [B, T], positions [B, T], mask [B|1, T, T], cache, logits_rows [B, R])
        -> logits [B, R, V] (float32, or float64 for float64 params),
           new_k, new_v (each L arrays [B, K, T, Dh])   the T new tokens' cache entries
    init_cache(batch, positions, dtype) -> KVCache  k, v: L buffers [B, K, S, Dh]; lengths [B] = 0
    param_shardings(mesh) -> the params' structure, one jax Sharding per array (mesh None:
        one device)

and, optionally (the engine prefills several prompts in one pass where a model has it):

    apply_ragged(params, tokens [1, T], positions [1, T], first [1, T], logits_rows [1, R],
                 cache=None)
        -> as `apply` with mask[0, t, u] = first[0, t] <= u <= t: rows packed one after
           another (a ragged prefill), each token seeing its own row's tokens up to
           itself and, with a cache (one row), its positions below its length: a prefix
           every row of the pass shares; a model computes it without the T x T mask
           (llama.LlamaLM: attention.segment_attention)

and, optionally (a causal pass without the T x T mask, where a model has a faster way):

    apply_causal(params, tokens [B, T], positions [B, T], cache=None, logits_rows [B, R])
        -> as `apply` with mask[t, u] = u <= t (positions[b, t] = positions[b, 0] + t):
           prompt prefills, a prompt's chunks and suffixes (llama.LlamaLM: the CPU
           kernel's ragged pass, one prompt a row)

The contract of `apply`, which exactness rests on:

* tokens t of the pass sit at `positions[b, t]` and see the row's cache positions
  `0 .. cache.lengths[b] - 1` (the cache's entry s holds position s) and the new tokens u with
  `mask[b, t, u]`, nothing else; a row never sees another row;
* it reads the cache only below each row's length and never writes it: the caller
  commits the entries of the tokens it keeps (kv_cache.commit), so guesses that turn
  out wrong leave no trace;
* `cache` is None for the prefill (the prompt attends only to itself);
* logits are returned only for the rows `logits_rows` asks for.

Exactness also needs the model to be *consistent*: a token's logits must not depend on
how many other tokens share its pass, i.e. a T-token pass must agree numerically with
1-token passes over the same context. Dense attention and matmuls do (bit-for-bit in
float64, to float32 rounding otherwise); anything that mixes rows or positions of a
pass (batch norm, a mixture-of-experts capacity limit shared by the pass's tokens)
does not. `lj.testing.assert_lookahead_matches_plain` checks it for a model.

The Llama forward (llama.LlamaLM) is one implementation; nnx_model.from_nnx adapts a
Flax NNX module.

Decoding calls a model through `apply` below, which checks these shapes (ForwardPass:
one binding per letter of docs/architecture.md's legend, shapes.py) when the step is
traced, so a model that breaks them fails with the field's name, not deep inside a step.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Shaped

from lookahead_jax import shapes
from lookahead_jax.errors import UserInputError
from lookahead_jax.models.kv_cache import KVCache

REQUIRED = ("vocab_size", "max_context", "apply", "init_cache", "param_shardings")


@runtime_checkable
class CausalLM(Protocol):
    vocab_size: int
    max_context: int

    def apply(self, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br=None): ...

    def init_cache(self, batch: int, positions: int, dtype): ...

    def param_shardings(self, mesh): ...


def check_model(lm) -> None:
    """A clear error when `lm` does not implement the seam (or cannot be a jit static)."""
    missing = [name for name in REQUIRED if not hasattr(lm, name)]
    if missing:
        raise UserInputError(
            f"{type(lm).__name__} does not implement the model seam (lookahead_jax.models.seam): "
            f"missing {', '.join(missing)}"
        )
    try:
        hash(lm)
    except TypeError:
        raise UserInputError(
            f"{type(lm).__name__} must be hashable (it is a static argument of the jitted "
            "programs): make it a frozen dataclass"
        ) from None


@dataclasses.dataclass(frozen=True)
class ForwardPass:
    """One `apply` call, its arguments and results, as the contract above shapes them."""

    tokens: Int[Array, "B T"]
    positions: Int[Array, "B T"]
    mask: Bool[Array, "#B T T"] | None  # for every row or one a row; None: ragged, causal
    cache: KVCache | None
    logits_rows: Int[Array, "B R"] | None  # None: every one of the T rows (R = T)
    logits: Float[Array, "B R V"]
    new_k: tuple[Shaped[Array, "B K T Dh"], ...]  # one per layer
    new_v: tuple[Shaped[Array, "B K T Dh"], ...]


def apply(lm: CausalLM, params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br=None):
    """`lm.apply(...)` with its shapes checked (ForwardPass; under jit, once, at trace time):
    logits [B, R, V] and each layer's new K/V [B, K, T, Dh], as many layers as the cache."""
    logits, new_k, new_v = lm.apply(
        params, tokens_bt, positions_bt, mask_btu, cache, logits_rows_br
    )
    call = ForwardPass(
        tokens_bt, positions_bt, mask_btu, cache, logits_rows_br, logits, tuple(new_k), tuple(new_v)
    )
    return _checked(lm, f"{type(lm).__name__}.apply", call)


def apply_causal(lm, params, tokens_bt, positions_bt, cache, logits_rows_br=None):
    """`apply` under the lower-triangular mask (each new token sees the row's cache below
    its length and the pass's tokens up to itself; positions[b, t] = positions[b, 0] +
    t): `lm.apply_causal(...)` where the model has it (`_with_apply`), else `lm.apply`
    with the mask; its shapes checked as `apply`'s."""
    if not _with_apply(lm, "apply_causal"):
        mask_1tt = causal_mask(tokens_bt.shape[1])
        return apply(lm, params, tokens_bt, positions_bt, mask_1tt, cache, logits_rows_br)
    logits, new_k, new_v = lm.apply_causal(
        params, tokens_bt, positions_bt, cache=cache, logits_rows_br=logits_rows_br
    )
    call = ForwardPass(
        tokens_bt, positions_bt, None, cache, logits_rows_br, logits, tuple(new_k), tuple(new_v)
    )
    return _checked(lm, f"{type(lm).__name__}.apply_causal", call)


def _checked(lm, name: str, call: ForwardPass):
    """The call's (logits, new_k, new_v), its shapes checked as `apply` says."""
    logits, new_k, new_v = call.logits, call.new_k, call.new_v
    shapes.check(call, names=(name,))
    rows = call.tokens.shape[1] if call.logits_rows is None else call.logits_rows.shape[1]
    if logits.shape[1:] != (rows, lm.vocab_size):
        raise shapes.ShapeError(
            f"{name}: logits {list(logits.shape)}, expected [B, {rows}, {lm.vocab_size}] "
            "(a row per logits_rows entry, vocab_size wide)"
        )
    cache = call.cache
    if cache is not None and not len(new_k) == len(new_v) == len(cache.k):
        raise shapes.ShapeError(
            f"{name}: {len(new_k)} new K and {len(new_v)} new V layers for a cache of "
            f"{len(cache.k)} layers"
        )
    return logits, new_k, new_v


def reads_cache_by_row(lm) -> bool:
    """Whether `lm`'s attention reads a step's cache only as far as its rows go (in blocks
    up to the longest row: a LlamaLM's `attention_block` > 0, what lj.load sets on a CPU),
    rather than the cache's whole capacity S every step (on a GPU or TPU, and a model
    that does not say)."""
    return getattr(lm, "attention_block", 0) > 0


def has_ragged(lm) -> bool:
    """Whether `lm` runs ragged passes (`apply_ragged`, `_with_apply`)."""
    return _with_apply(lm, "apply_ragged")


def causal_mask(t: int) -> jax.Array:
    """[1, T, T] lower-triangular mask for a plain causal pass."""
    return jnp.tril(jnp.ones((t, t), dtype=bool))[None]


def _with_apply(lm, name: str) -> bool:
    """Whether `lm`'s optional method `name` (a faster way to a pass `apply` also
    computes) is defined where its `apply` is, or in a subclass of that class: a
    subclass that overrides only `apply` (or a wrapper delegating attributes) must not
    reach an inherited `name` that bypasses its override."""
    owner = lambda attr: next((c for c in type(lm).__mro__ if attr in vars(c)), None)  # noqa: E731
    method, apply_ = owner(name), owner("apply")
    defined = method is not None and apply_ is not None and issubclass(method, apply_)
    return defined and callable(getattr(lm, name))  # (None there turns it off)


def apply_ragged(lm, params, tokens_bt, positions_bt, first_bt, logits_rows_br, cache=None):
    """`lm.apply_ragged(...)` with its shapes checked as `apply`'s (ForwardPass, with no
    mask): logits [B, R, V] and each layer's new K/V [B, K, T, Dh]. cache: the row's
    positions below its length, which every token of the row sees (a prefix the rows
    packed in it share; None: none)."""
    logits, new_k, new_v = lm.apply_ragged(
        params, tokens_bt, positions_bt, first_bt, logits_rows_br, cache=cache
    )
    call = ForwardPass(
        tokens_bt, positions_bt, None, cache, logits_rows_br, logits, tuple(new_k), tuple(new_v)
    )
    return _checked(lm, f"{type(lm).__name__}.apply_ragged", call)
