"""Lookahead decoding: one pure, fixed-shape step that emits one or more tokens per
forward pass, exactly the tokens plain decoding would.

Each step runs one forward pass (lookahead_layout.py) over

* the input token (the newest accepted token, not yet in the cache);
* the Jacobi window [N-1, W]: N-1 levels of guessed tokens. Column j is a Jacobi
  trajectory; the model's token after its newest level becomes the new newest level,
  the oldest level is dropped, and the column (oldest level .. new token) is an n-gram
  that goes into the pool;
* a draft tree of D slots (draft_tree.py) merged from the guess sources:
    - pool      the pool's (N-1)-grams whose key is the input (ngram_pool.py);
    - suffix    continuations of earlier occurrences of the row's last tokens in its
                prompt and output (suffix_match.py), up to `suffix_span` tokens long;
    - recycle   token recycling: each token's top-k next tokens from earlier logits,
                expanded into a static tree template (token_recycling.py);
  and, with `verify_window`, the window's own paths.

Acceptance (draft_tree.verify): the deepest tree path whose every token equals the
model's token after its parent, plus the model's token after it (the bonus); only the
input's and the accepted path's K/V are committed — computed in this pass with exactly
plain decoding's context, so the cache stays what plain decoding would have built. "The
model's token" is the greedy argmax, or under sampling the seeded Gumbel-max choice of
sampling.py, which makes the one rule exact for sampling too.

Window feeding: the new level takes the model's token at the position it guesses — the
argmax, or under sampling the sample with that position's noise (`window_sampling`), so
that the Jacobi iteration converges to the sampled text. The pool receives the prompt's
n-grams before the first step (`prompt_pool`), the W window n-grams of each step, and
the n-grams of the emitted text that end at the new tokens. The recycling table is
refreshed from the logits of every token fed.

Window initialisation: every slot starts as a prompt token drawn uniformly at random
(with the row's seed-derived key) from the row's prompt, as the reference does.

Stages of `lookahead_step`: propose (sources -> Proposals) -> merge (-> DraftTree) ->
forward -> choose tokens -> verify -> commit and emit -> feed the sources.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax import draft_tree, kv_cache, ngram_pool, suffix_match, token_recycling
from lookahead_jax.decode_state import DecodeSpec, DecodeState, emit, input_tokens
from lookahead_jax.errors import UserInputError
from lookahead_jax.lookahead_layout import StepLayout
from lookahead_jax.model import Params, forward
from lookahead_jax.sampling import SamplingConfig, choose_tokens, gumbel_noise

# Guess sources, in the order of the per-source stats.
SOURCES = ("pool", "suffix", "recycle", "window")
POOL, SUFFIX, RECYCLE, WINDOW = range(len(SOURCES))

# Modelled chance that a guessed token is right when its parent is: they order the
# proposals when more are offered than the tree has slots.
POOL_RATES = (0.35, 0.5)  # without, with the 2-token context matching
SUFFIX_RATES = (0.0, 0.3, 0.45, 0.6, 0.7, 0.75, 0.8, 0.8, 0.85)  # by match length
# by candidate rank (token_recycling.candidates: up to 2k per node)
RECYCLE_RATES = (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02) + (0.015,) * 2 + (0.01,) * 6


@dataclasses.dataclass(frozen=True)
class LookaheadConfig:
    """What one lookahead step feeds and verifies (all static: a jit argument).

    n, w, g     the paper's knobs: n-gram size N (window levels + 1), window columns W
                (0: no window), pool candidates G verified per step
    suffix      suffix-match continuations proposed, each up to `suffix_span` tokens,
                keyed on up to `suffix_key` of the row's last tokens
    recycle     token-recycling template nodes; `recycle_k` next tokens kept per token
    tree        draft-tree slots D fed per step (None: one per proposed node)
    pool_capacity  n-grams kept per key (None: g)
    prompt_pool seed the pool with the prompt's n-grams
    verify_window  also verify the window's own paths
    window_sampling  under sampling, the window's new level is the sample at its
                position (True) rather than the argmax
    """

    n: int = 5
    w: int = 7
    g: int = 7
    prompt_pool: bool = True
    verify_window: bool = False
    suffix: int = 0
    suffix_span: int = 8
    suffix_key: int = 4
    recycle: int = 0
    recycle_k: int = 8
    tree: int | None = None
    pool_capacity: int | None = None
    window_sampling: bool = True
    budget: int | None = None  # set by for_budget: the tokens-per-step budget it served

    def __post_init__(self):
        lows = (
            ("N", self.n, 2),
            ("W", self.w, 0),
            ("G", self.g, 0),
            ("suffix", self.suffix, 0),
            ("suffix_span", self.suffix_span, 1),
            ("suffix_key", self.suffix_key, 1),
            ("recycle", self.recycle, 0),
            ("recycle_k", self.recycle_k, 1),
        )
        for name, value, low in lows:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserInputError(f"lookahead {name} must be an integer >= {low}, got {value!r}")
        for name, value, low in (("tree", self.tree, 0), ("pool_capacity", self.pool_capacity, 1)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < low
            ):
                raise UserInputError(
                    f"lookahead {name} must be None or an integer >= {low}, got {value!r}"
                )
        if self.pool_capacity is not None and self.pool_capacity < self.g:
            raise UserInputError(
                f"lookahead pool_capacity ({self.pool_capacity}) must be at least G ({self.g})"
            )
        if 2 * self.recycle_k > len(RECYCLE_RATES):
            raise UserInputError(f"lookahead recycle_k must be at most {len(RECYCLE_RATES) // 2}")
        if self.suffix_key >= len(SUFFIX_RATES):
            raise UserInputError(f"lookahead suffix_key must be at most {len(SUFFIX_RATES) - 1}")

    # ------------------------------------------------------------ derived shape

    @property
    def m(self) -> int:
        return self.n - 1

    @functools.cached_property
    def recycle_template(self) -> token_recycling.Template:
        return token_recycling.template(self.recycle, RECYCLE_RATES[: 2 * self.recycle_k])

    @property
    def proposed_nodes(self) -> int:
        """Draft nodes the sources offer per step (before merging)."""
        return self.g * self.m + self.suffix * self.suffix_span + self.recycle

    @property
    def tree_slots(self) -> int:
        return self.proposed_nodes if self.tree is None else self.tree

    @property
    def tree_depth(self) -> int:
        """The deepest draft-tree node any source can offer."""
        depths = [0]
        if self.g:
            depths.append(self.m)
        if self.suffix:
            depths.append(self.suffix_span)
        if self.recycle:
            depths.append(self.recycle_template.max_depth)
        return max(depths)

    @property
    def layout(self) -> StepLayout:
        return StepLayout(self.n, self.w, self.tree_slots, self.verify_window)

    @property
    def verify_depth(self) -> int:
        """The longest path verification can accept (tree, or window with verify_window)."""
        window = int(self.layout.window_depths.max(initial=0)) if self.verify_window else 0
        return max(self.tree_depth, window)

    @property
    def max_emit(self) -> int:
        """Most tokens one step emits: the longest accepted path plus the bonus token."""
        return self.verify_depth + 1

    @property
    def key(self) -> tuple[int, int, int] | int:
        """What autotune keeps this config's measurements under: the budget for a
        for_budget layout, (N, W, G) otherwise."""
        return self.budget if self.budget is not None else (self.n, self.w, self.g)

    @property
    def name(self) -> str:
        """'tokens=T' for a for_budget layout, 'N,W,G' otherwise (as the CLI takes it)."""
        if self.budget is not None:
            return f"tokens={self.budget}"
        return f"{self.n},{self.w},{self.g}"

    @classmethod
    def for_budget(cls, tokens: int) -> LookaheadConfig:
        """The best measured layout that feeds at most `tokens` tokens per step (see
        BUDGET_LAYOUTS; tokens >= 2)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer) or tokens < 2:
            raise UserInputError(
                f"lookahead tokens per step must be an integer >= 2, got {tokens!r}"
            )
        budget = max(t for t in BUDGET_LAYOUTS if t <= tokens)
        return dataclasses.replace(BUDGET_LAYOUTS[budget], budget=budget)

    @property
    def tokens_per_step(self) -> int:
        return self.layout.num_tokens

    def describe(self) -> dict:
        return {
            "name": self.name,
            "n": self.n,
            "w": self.w,
            "g": self.g,
            "suffix": self.suffix,
            "suffix_span": self.suffix_span,
            "recycle": self.recycle,
            "tree": self.tree_slots,
            "step_tokens": self.tokens_per_step,
            "prompt_pool": self.prompt_pool,
            "verify_window": self.verify_window,
        }


# Draft layouts by tokens fed per step (T = 1 + (N-1)*W + tree): the best measured at
# each budget with SmolLM2-135M on MT-bench and code, greedy (benchmarks/cpu/budgets.md).
# Small budgets spend every token on the draft tree; from 16 on, a one-column window
# feeding the pool pays its tokens.
BUDGET_LAYOUTS: dict[int, LookaheadConfig] = {
    2: LookaheadConfig(2, 0, 0, recycle=4, suffix=1, suffix_span=4, tree=1),
    4: LookaheadConfig(2, 0, 0, recycle=12, suffix=1, suffix_span=4, tree=3),
    8: LookaheadConfig(2, 0, 0, recycle=20, suffix=2, tree=7),
    12: LookaheadConfig(2, 0, 0, recycle=30, suffix=2, tree=11),
    16: LookaheadConfig(3, 1, 2, recycle=40, suffix=2, tree=13),
    32: LookaheadConfig(3, 1, 4, recycle=80, suffix=3, suffix_span=12, tree=29),
    64: LookaheadConfig(4, 2, 4, recycle=120, suffix=4, suffix_span=16, tree=57),
    128: LookaheadConfig(5, 4, 8, recycle=200, suffix=4, suffix_span=16, tree=111),
}
for _t, _la in BUDGET_LAYOUTS.items():
    assert _la.tokens_per_step == _t, (_t, _la.tokens_per_step)

# A fixed layout for callers that want one (the CLI's default is "auto", which measures
# the machine instead).
DEFAULT_LOOKAHEAD = LookaheadConfig.for_budget(16)

# A window slot's draw key is the row key folded with this (new-token indices,
# used for sampling noise, never reach it).
_WINDOW_KEY_SALT = 0x7FFFFFFF


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftState:
    """Per-row state of the guess sources, and which of them supplied accepted paths.

    window          [B, N-1, W] int32
    pool            NGramPool (capacity 0 without pool candidates)
    recycle         RecycleTable, or None without token recycling
    paths_by_source [B, len(SOURCES)] int32  steps whose accepted path came from each
    tokens_by_source [B, len(SOURCES)] int32 guessed tokens accepted from each
    """

    window: jax.Array
    pool: ngram_pool.NGramPool
    recycle: token_recycling.RecycleTable | None
    paths_by_source: jax.Array
    tokens_by_source: jax.Array


def init_lookahead(state: DecodeState, spec: DecodeSpec, prompt_bucket: int) -> DecodeState:
    """Add the window, the (seeded) pool and recycling table to a prefilled state.

    prompt_bucket: P, the padded prompt length of the prefill.
    """
    la: LookaheadConfig = spec.lookahead
    B = state.tokens.shape[0]
    n, m = la.n, la.m

    def draw_window(key, prompt_len, tokens):
        key = jax.random.fold_in(key, _WINDOW_KEY_SALT)
        idx = jax.random.randint(key, (m, la.w), 0, prompt_len)
        return tokens[idx]

    window = jax.vmap(draw_window)(state.keys, state.prompt_len, state.tokens)
    capacity = la.pool_capacity or la.g
    pool = ngram_pool.init_pool(B, spec.model.vocab_size, capacity, m)
    # The n-grams of prompt + first new token (prompt_pool), or only the one ending
    # at the first new token; later steps add those ending at their new tokens.
    end = state.prompt_len + state.n_out
    if la.prompt_pool:  # every n-gram ending at or before position P (prompt bucket)
        start, count = jnp.zeros((B,), jnp.int32), max(prompt_bucket - n + 2, 0)
    else:
        start, count = end - n, 1
    keys, tails, ok, prev = ngram_pool.sequence_ngrams(state.tokens, start, count, n, end)
    pool = ngram_pool.insert(pool, keys, tails, ok & ~state.done[:, None], prev)
    recycle = None
    if la.recycle:
        recycle = token_recycling.init_table(B, spec.model.vocab_size, la.recycle_k)
        recycle = token_recycling.seed_from_text(recycle, state.tokens, end)
    zeros = jnp.zeros((B, len(SOURCES)), jnp.int32)
    draft = DraftState(window, pool, recycle, zeros, zeros)
    return dataclasses.replace(state, draft=draft)


# ------------------------------------------------------------------ the step's stages


def previous_tokens(state: DecodeState):
    """The token before each row's input [B] (the input is at cache.lengths >= 1)."""
    before = jnp.maximum(state.cache.lengths - 1, 0)[:, None]
    return jnp.take_along_axis(state.tokens, before, axis=1)[:, 0]


def propose(
    state: DecodeState, la: LookaheadConfig, sampling: SamplingConfig, input_b
) -> draft_tree.Proposals:
    """Every source's guesses for the tokens after each row's input."""
    d = state.draft
    B = input_b.shape[0]
    parts = []
    prev_b = previous_tokens(state)
    if la.g:
        tails_bgm, valid_bg, match_bg = ngram_pool.lookup(d.pool, input_b, prev_b, la.g)
        rate = jnp.asarray(POOL_RATES, jnp.float32)[match_bg.astype(jnp.int32)]  # [B, G]
        score = rate[:, :, None] ** jnp.arange(1, la.m + 1)[None, None]
        parts.append(draft_tree.chains(tails_bgm, valid_bg * la.m, score, POOL))
    if la.suffix:
        end = state.prompt_len + state.n_out
        cont_bcl, length_bc, key_bc = suffix_match.propose(
            state.tokens, end, key_max=la.suffix_key, span=la.suffix_span, count=la.suffix
        )
        rate = jnp.asarray(SUFFIX_RATES, jnp.float32)[key_bc]  # [B, C]
        score = rate[:, :, None] ** jnp.arange(1, la.suffix_span + 1)[None, None]
        parts.append(draft_tree.chains(cont_bcl, length_bc, score, SUFFIX))
    if la.recycle:
        tmpl = la.recycle_template
        noise = None
        if not sampling.greedy:  # the noise of the new-token indices the nodes guess
            index = state.n_out[:, None] + jnp.arange(tmpl.max_depth)[None]
            noise = (
                sampling.temperature,
                gumbel_noise(state.keys, index, d.recycle.by_token.shape[1]),
            )
        parts.append(token_recycling.expand(d.recycle, prev_b, input_b, tmpl, RECYCLE, noise))
    if not parts:
        empty = lambda dt: jnp.zeros((B, 0), dt)  # noqa: E731
        return draft_tree.Proposals(
            empty(jnp.int32),
            empty(jnp.int32),
            empty(jnp.int32),
            empty(jnp.float32),
            empty(bool),
            empty(jnp.int32),
        )
    return draft_tree.concat(parts)


def window_tree(lay: StepLayout, window_bk) -> draft_tree.DraftTree:
    """The window's own paths as a verifiable tree (verify_window): static shape."""
    B, K = window_bk.shape
    bcast = lambda x: jnp.broadcast_to(jnp.asarray(x), (B, *np.shape(x)))  # noqa: E731
    return draft_tree.DraftTree(
        tokens=window_bk,
        parent=bcast(lay.window_parents),
        depth=bcast(lay.window_depths),
        valid=jnp.ones((B, K), bool),
        source=jnp.full((B, K), WINDOW, jnp.int32),
        ancestors=bcast(lay.window_ancestors),
    )


def lookahead_step(params: Params, state: DecodeState, spec: DecodeSpec) -> DecodeState:
    """One forward pass; every active row emits 1..max_emit tokens."""
    la: LookaheadConfig = spec.lookahead
    lay = la.layout
    d = state.draft
    m, w = la.m, la.w
    B = state.tokens.shape[0]
    active = ~state.done
    length = state.cache.lengths
    input_b = input_tokens(state)
    window_bk = d.window.reshape(B, m * w)

    # propose and merge
    proposals = propose(state, la, spec.sampling, input_b)
    if lay.slots:
        tree = draft_tree.merge(proposals, lay.slots, la.tree_depth)
    else:
        tree = draft_tree.empty(B)

    # forward
    step_tokens = jnp.concatenate([input_b[:, None], window_bk, tree.tokens], axis=1)
    positions = length[:, None] + lay.offsets(tree.depth)
    rows = jnp.broadcast_to(jnp.asarray(lay.logits_rows), (B, len(lay.logits_rows)))
    logits_brv, new_k, new_v = forward(
        params, spec.model, step_tokens, positions, lay.mask(tree.ancestors), state.cache, rows
    )

    # the model's token after each fed row: the new-token index of the position it
    # predicts is n_out + (the row's offset from the input)
    row_offsets = jnp.take_along_axis(positions - length[:, None], rows, axis=1)  # [B, R]
    chosen_br = choose_tokens(
        logits_brv, spec.sampling, state.keys, state.n_out[:, None] + row_offsets
    )
    after_input = chosen_br[:, 0]
    after_window = chosen_br[:, 1 : 1 + lay.window_rows]
    after_tree = chosen_br[:, 1 + lay.window_rows :]
    if la.window_sampling:
        new_level = after_window[:, lay.window_rows - w :]  # [B, W]
    else:
        new_level = jnp.argmax(logits_brv[:, 1 + lay.window_rows - w : 1 + lay.window_rows], -1)
        new_level = new_level.astype(jnp.int32)

    # verify: the draft tree, and with verify_window the window's paths as well
    if la.verify_window:
        verified = draft_tree.concat_trees(window_tree(lay, window_bk), tree)
        after_verified, first_index = jnp.concatenate([after_window, after_tree], axis=1), 1
    else:
        verified, after_verified, first_index = tree, after_tree, lay.tree_start
    acc = draft_tree.verify(verified, after_input, after_verified, la.verify_depth)

    # commit the input's and the accepted path's K/V; emit
    src = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), first_index + acc.path], axis=1)
    a = acc.accepted
    cache = kv_cache.commit(state.cache, new_k, new_v, src, jnp.where(active, a + 1, 0))
    counted = active & (a > 0)
    by_source = jax.nn.one_hot(acc.source, len(SOURCES), dtype=jnp.int32)  # -1: all zero
    draft = dataclasses.replace(
        d,
        paths_by_source=d.paths_by_source + by_source * counted[:, None],
        tokens_by_source=d.tokens_by_source + by_source * jnp.where(counted, a, 0)[:, None],
    )
    out_before = state.n_out
    state_before = state
    state = dataclasses.replace(
        state,
        cache=cache,
        steps=state.steps + active,
        accept_hist=state.accept_hist.at[jnp.arange(B), a].add(active.astype(jnp.int32)),
        draft=draft,
    )
    state = emit(state, spec, acc.emitted, a + 1)

    # feed the sources; each fed row's previous token is its parent's (the input's is
    # the token before it)
    fed_tokens = jnp.take_along_axis(step_tokens, rows, axis=1)
    parent_index = jnp.concatenate(
        [
            jnp.zeros((B, 1), jnp.int32),  # placeholder for the input
            jnp.broadcast_to(
                jnp.asarray(lay.parent_of_rows[1 : 1 + lay.window_rows]), (B, lay.window_rows)
            ),
            jnp.where(tree.parent == draft_tree.ROOT, 0, lay.tree_start + tree.parent),
        ],
        axis=1,
    )
    fed_prev = jnp.take_along_axis(step_tokens, parent_index, axis=1)
    fed_prev = fed_prev.at[:, 0].set(previous_tokens(state_before))
    fed_ok = (
        jnp.concatenate([jnp.ones((B, 1 + lay.window_rows), bool), tree.valid], axis=1)
        & active[:, None]
    )
    draft = feed_sources(
        state,
        la,
        draft,
        out_before,
        input_b,
        new_level,
        active,
        fed_prev,
        fed_tokens,
        logits_brv,
        fed_ok,
        acc,
    )
    return dataclasses.replace(state, draft=draft)


def feed_sources(
    state,
    la,
    d: DraftState,
    out_before,
    input_b,
    new_level_bw,
    active_b,
    fed_prev_br,
    fed_tokens_br,
    logits_brv,
    fed_ok_br,
    acc,
):
    """Window shift, pool inserts and recycling-table refresh after a step."""
    B = new_level_bw.shape[0]
    n, w = la.n, la.w
    pool = d.pool
    if pool.capacity:
        # the W window n-grams, then the emitted text's n-grams ending at new tokens
        win_tails = jnp.concatenate([d.window[:, 1:], new_level_bw[:, None]], axis=1)  # [B, M, W]
        # a level-0 token follows the one left of it, column 0 the step's input
        win_prev = jnp.concatenate([input_b[:, None], d.window[:, 0, :-1]], axis=1)
        pool = ngram_pool.insert(
            pool,
            d.window[:, 0],
            jnp.swapaxes(win_tails, 1, 2),
            jnp.broadcast_to(active_b[:, None], (B, w)),
            win_prev,
        )
        end = state.prompt_len + state.n_out
        keys, tails, ok, prev = ngram_pool.sequence_ngrams(
            state.tokens, state.prompt_len + out_before - n + 1, n, n, end
        )
        pool = ngram_pool.insert(pool, keys, tails, ok & active_b[:, None], prev)
    window = jnp.where(
        active_b[:, None, None],
        jnp.concatenate([d.window[:, 1:], new_level_bw[:, None]], 1),
        d.window,
    )
    recycle = d.recycle
    if recycle is not None:
        R = fed_tokens_br.shape[1]
        # rows whose logits saw the true context (the input and the accepted path) win
        # over other rows holding the same token; then earlier rows win
        path_rows = 1 + (0 if la.verify_window else la.layout.window_rows) + acc.path  # [B, P]
        on_path = (jnp.arange(acc.path.shape[1])[None] < acc.accepted[:, None])[:, :, None] & (
            path_rows[:, :, None] == jnp.arange(R)[None, None]
        )
        prio = R - jnp.arange(R)[None] + R * jnp.any(on_path, axis=1)
        recycle = token_recycling.update(
            recycle, fed_prev_br, fed_tokens_br, logits_brv, prio, fed_ok_br
        )
    return dataclasses.replace(d, window=window, pool=pool, recycle=recycle)
