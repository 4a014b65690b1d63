"""Lookahead decoding: one pure, fixed-shape step that emits 1..N tokens per forward pass.

Each step runs one forward pass over (see lookahead_layout.py for the layout):

* the input token (the newest accepted token, not yet in the cache);
* the window [N-1, W]: N-1 levels of guessed tokens. Column j of the window is
  a Jacobi trajectory; the model's prediction after its newest level becomes
  the new newest level, the oldest level is dropped, and the column (oldest
  level .. new token) is an n-gram that goes into the pool;
* up to G candidates: the pool's (N-1)-grams whose key is the input token.

Acceptance. Let y_0 be the model's token after the input and y_{c,i} its token
after candidate c's token i. Candidate c's token i is right iff it equals the
model's token at its position: y_0 for i = 0, y_{c,i-1} otherwise. The longest
right prefix wins (the first such candidate on ties); with a right tokens, the
step emits them and the model's token after them (the bonus): a+1 tokens, and
commits the K/V of the input and the a accepted candidate tokens — both were
computed in this pass with exactly the context of plain decoding, so the cache
stays what plain decoding would have built. "The model's token" is the greedy
argmax, or under sampling the seeded Gumbel-max choice of sampling.py, which
makes this rule exact for sampling too.

Window and pool feeding: the new window level is always the argmax of the
model's predictions (also under sampling). The pool receives, in order: the
prompt's n-grams before the first step (`prompt_pool`, on by default), the W
window n-grams of each step, and the n-grams of the emitted text that end at
the newly emitted tokens.

Window initialisation (a fixed rule): every slot of the window starts as a
prompt token drawn uniformly at random (with the row's seed-derived key) from
the row's prompt, as the reference implementation does.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lookahead_jax import kv_cache, ngram_pool
from lookahead_jax.decode_state import DecodeSpec, DecodeState, emit, input_tokens
from lookahead_jax.errors import UserInputError
from lookahead_jax.lookahead_layout import StepLayout
from lookahead_jax.model import Params, forward
from lookahead_jax.sampling import choose_tokens


@dataclasses.dataclass(frozen=True)
class LookaheadConfig:
    """n: n-gram size (tokens per step at most), w: window columns, g: candidates verified."""

    n: int = 5
    w: int = 7
    g: int = 7
    prompt_pool: bool = True  # seed the pool with the prompt's n-grams
    verify_window: bool = False  # also verify the window's own paths (see verify_window_paths)

    def __post_init__(self):
        for name, value, low in (("N", self.n, 2), ("W", self.w, 1), ("G", self.g, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserInputError(f"lookahead {name} must be an integer >= {low}, got {value!r}")

    @property
    def layout(self) -> StepLayout:
        return StepLayout(self.n, self.w, self.g, self.verify_window)

    @property
    def max_emit(self) -> int:
        return self.layout.max_emit

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.n, self.w, self.g)

    @property
    def tokens_per_step(self) -> int:
        return self.layout.num_tokens

    def describe(self) -> dict:
        return {
            "n": self.n,
            "w": self.w,
            "g": self.g,
            "prompt_pool": self.prompt_pool,
            "verify_window": self.verify_window,
        }


# The best fixed config measured on a 2-core CPU with SmolLM2-135M (README, "Choosing
# N, W, G"); the CLI's default is lookahead "auto", which measures the machine instead.
DEFAULT_LOOKAHEAD = LookaheadConfig(5, 1, 1)

# A window slot's draw key is the row key folded with this (new-token indices,
# used for sampling noise, never reach it).
_WINDOW_KEY_SALT = 0x7FFFFFFF


def init_lookahead(state: DecodeState, spec: DecodeSpec, prompt_bucket: int) -> DecodeState:
    """Add the window and the (seeded) pool to a freshly prefilled state.

    prompt_bucket: P, the padded prompt length of the prefill.
    """
    la: LookaheadConfig = spec.lookahead
    B = state.tokens.shape[0]
    n, m = la.n, la.n - 1

    def draw_window(key, prompt_len, tokens):
        key = jax.random.fold_in(key, _WINDOW_KEY_SALT)
        idx = jax.random.randint(key, (m, la.w), 0, prompt_len)
        return tokens[idx]

    window = jax.vmap(draw_window)(state.keys, state.prompt_len, state.tokens)
    pool = ngram_pool.init_pool(B, spec.model.vocab_size, la.g, m)
    # The n-grams of prompt + first new token (prompt_pool), or only the one ending
    # at the first new token; later steps add those ending at their new tokens.
    end = state.prompt_len + state.n_out
    if la.prompt_pool:  # every n-gram ending at or before position P (prompt bucket)
        start, count = jnp.zeros((B,), jnp.int32), max(prompt_bucket - n + 2, 0)
    else:
        start, count = end - n, 1
    keys, tails, ok = ngram_pool.sequence_ngrams(state.tokens, start, count, n, end)
    pool = ngram_pool.insert(pool, keys, tails, ok & ~state.done[:, None])
    return dataclasses.replace(state, window=window, pool=pool)


def candidate_is_right(cands, expected):
    """[B, G, M] bool: candidate token == the model's token at its position.

    The one acceptance rule. It is exact for greedy decoding and, because the
    model's token is the seeded Gumbel-max choice (sampling.py), for sampling too.
    """
    return cands == expected


def verify(cands, valid, after_input, after_cand):
    """Accept the longest right prefix among the candidates, plus the model's next token.

    cands       [B, G, M]  candidate tokens (G may be 0)
    valid       [B, G]     which candidates are real pool entries
    after_input [B]        the model's token after the input
    after_cand  [B, G, M]  the model's token after each candidate token

    Returns a [B] (accepted candidate tokens, 0..M), best [B] (the candidate,
    first of the longest), and emitted [B, N] whose first a+1 entries are the
    step's tokens: the accepted candidate tokens, then the model's next token.
    """
    B, g, m = cands.shape
    if g == 0:
        zeros = jnp.zeros((B,), jnp.int32)
        return (
            zeros,
            zeros,
            jnp.concatenate([after_input[:, None], jnp.zeros((B, m), jnp.int32)], axis=1),
        )
    # the model's token at candidate position i: after the input (i = 0) or after
    # the candidate's token i-1
    expected = jnp.concatenate(
        [jnp.broadcast_to(after_input[:, None, None], (B, g, 1)), after_cand[:, :, :-1]], axis=2
    )
    right = candidate_is_right(cands, expected) & valid[:, :, None]
    accepted = jnp.sum(jnp.cumprod(right.astype(jnp.int32), axis=2), axis=2)  # [B, G]
    best = jnp.argmax(accepted, axis=1)
    a = jnp.take_along_axis(accepted, best[:, None], axis=1)[:, 0]
    pick = lambda x: jnp.take_along_axis(x, best[:, None, None], axis=1)[:, 0]  # noqa: E731
    model_tokens = jnp.concatenate([after_input[:, None], pick(after_cand)], axis=1)  # [B, N]
    guessed = jnp.concatenate([pick(cands), jnp.zeros((B, 1), jnp.int32)], axis=1)
    # accepted positions take the candidate's token (equal to the model's under the
    # rule above), the next one the model's own token
    emitted = jnp.where(jnp.arange(m + 1)[None] < a[:, None], guessed, model_tokens)
    return a.astype(jnp.int32), best.astype(jnp.int32), emitted


def verify_window_paths(lay: StepLayout, window_bk, after_input, after_window):
    """The longest right path through the window's tree (see StepLayout.window_paths).

    window_bk     [B, K]  window tokens in node order (K = (N-1)*W)
    after_input   [B]     the model's token after the input
    after_window  [B, K]  the model's token after each window node

    A node is right when it equals the model's token after its parent; a path is
    accepted when all its nodes are. Returns a [B] (accepted tokens, the deepest
    right path's depth, 0 if none), node [B] (its last node), the path's tokens
    [B, max depth] and the model's token after it [B].
    """
    parents = jnp.asarray([lay.window_parent(*divmod(k, lay.w)) for k in range(lay.m * lay.w)])
    preds = jnp.concatenate([after_input[:, None], after_window], axis=1)  # row 0: input
    right = window_bk == preds[:, parents + 1]  # [B, K]
    paths = jnp.asarray(lay.window_paths)  # [K, D]
    path_ok = jnp.all(right[:, paths], axis=-1)  # [B, K]
    depth = jnp.where(path_ok, jnp.asarray(lay.window_depths)[None], 0)
    node = jnp.argmax(depth, axis=1)
    a = jnp.take_along_axis(depth, node[:, None], axis=1)[:, 0]
    tokens = jnp.take_along_axis(window_bk, paths[node], axis=1)  # [B, D]
    after = jnp.where(
        a > 0, jnp.take_along_axis(after_window, node[:, None], axis=1)[:, 0], after_input
    )
    return a.astype(jnp.int32), node.astype(jnp.int32), tokens, after


def lookahead_step(params: Params, state: DecodeState, spec: DecodeSpec) -> DecodeState:
    """One forward pass; every active row emits 1..N tokens."""
    la: LookaheadConfig = spec.lookahead
    lay = la.layout
    n, m, w, g = la.n, lay.m, la.w, la.g
    B = state.tokens.shape[0]
    active = ~state.done
    length = state.cache.lengths
    inp = input_tokens(state)
    cands, valid = ngram_pool.lookup(state.pool, inp)  # [B, G, M], [B, G]

    step_tokens = jnp.concatenate(
        [inp[:, None], state.window.reshape(B, m * w), cands.reshape(B, g * m)], axis=1
    )
    positions = length[:, None] + jnp.asarray(lay.offsets)[None]
    rows = jnp.broadcast_to(jnp.asarray(lay.logits_rows), (B, len(lay.logits_rows)))
    logits, new_k, new_v = forward(
        params, spec.model, step_tokens, positions, jnp.asarray(lay.mask)[None], state.cache, rows
    )

    # The model's tokens after the input (new-token index n_out), after each verified
    # window node at depth d (index n_out + d) and after candidate token i (index
    # n_out + 1 + i). The window's new level is the plain argmax, even when sampling.
    nw = lay.window_rows
    j0 = state.n_out[:, None]
    win_idx = j0 + jnp.asarray(lay.window_depths)[None] if la.verify_window else j0[:, :0]
    out_idx = jnp.concatenate([j0, win_idx, j0 + 1 + jnp.tile(jnp.arange(m), g)[None]], axis=1)
    used = logits if la.verify_window else jnp.concatenate([logits[:, :1], logits[:, 1 + w :]], 1)
    chosen = choose_tokens(used, spec.sampling, state.keys, out_idx)
    after_input = chosen[:, 0]  # [B]
    after_cand = chosen[:, chosen.shape[1] - g * m :].reshape(B, g, m)  # [B, G, M]
    new_level = jnp.argmax(logits[:, 1 + nw - w : 1 + nw], axis=-1).astype(jnp.int32)  # [B, W]

    a, best, emitted = verify(cands, valid, after_input, after_cand)
    # K/V to commit: the input (index 0), then the accepted tokens' indices
    src = jnp.zeros((B, 1), jnp.int32)
    if g > 0:
        cand_idx = lay.verify_start + best[:, None] * m + jnp.arange(m)[None]
        src = jnp.concatenate([src, cand_idx.astype(jnp.int32)], axis=1)
    if la.verify_window:  # a longer right window path beats the best candidate
        e = lay.max_emit
        a_w, node, path_tokens, after_path = verify_window_paths(
            lay, state.window.reshape(B, m * w), after_input, chosen[:, 1 : 1 + nw]
        )
        pad = lambda x: jnp.pad(x, ((0, 0), (0, e - x.shape[1])))  # noqa: E731
        i = jnp.arange(e)[None]
        emitted_w = jnp.where(
            i < a_w[:, None], pad(path_tokens), jnp.where(i == a_w[:, None], after_path[:, None], 0)
        )
        src_w = jnp.concatenate([src[:, :1], 1 + jnp.asarray(lay.window_paths)[node]], axis=1)
        use_w = (a_w > a)[:, None]
        emitted = jnp.where(use_w, emitted_w, pad(emitted))
        src = jnp.where(use_w, pad(src_w), pad(src))
        a = jnp.maximum(a, a_w)
    cache = kv_cache.commit(state.cache, new_k, new_v, src, jnp.where(active, a + 1, 0))
    out_before = state.n_out
    state = dataclasses.replace(
        state,
        cache=cache,
        steps=state.steps + active,
        accept_hist=state.accept_hist.at[jnp.arange(B), a].add(active.astype(jnp.int32)),
    )
    state = emit(state, spec, emitted, a + 1)

    # Pool: the W window n-grams, then the emitted text's n-grams ending at new tokens.
    win_tails = jnp.concatenate([state.window[:, 1:], new_level[:, None]], axis=1)  # [B, M, W]
    pool = ngram_pool.insert(
        state.pool,
        state.window[:, 0],
        jnp.swapaxes(win_tails, 1, 2),
        jnp.broadcast_to(active[:, None], (B, w)),
    )
    end = state.prompt_len + state.n_out
    keys, tails, ok = ngram_pool.sequence_ngrams(
        state.tokens, state.prompt_len + out_before - n + 1, n, n, end
    )
    pool = ngram_pool.insert(pool, keys, tails, ok & active[:, None])
    window = jnp.where(
        active[:, None, None],
        jnp.concatenate([state.window[:, 1:], new_level[:, None]], 1),
        state.window,
    )
    return dataclasses.replace(state, pool=pool, window=window)
