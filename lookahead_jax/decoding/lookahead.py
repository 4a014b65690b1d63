"""Lookahead decoding: one pure, fixed-shape step that emits one or more tokens per
forward pass, exactly the tokens plain decoding would.

Each step runs one forward pass (lookahead_layout.py) over

* the input token (the newest accepted token, not yet in the cache);
* the Jacobi window [N-1, W]: N-1 levels of guessed tokens. Column j is a Jacobi
  trajectory; the model's token after its newest level becomes the new newest level,
  the oldest level is dropped, and the column (oldest level .. new token) is an n-gram
  that goes into the pool;
* a draft tree of Z slots (draft_tree.py) merged from the guess sources:
    - pool      the pool's (N-1)-grams whose key is the input (ngram_pool.py);
    - suffix    continuations of earlier occurrences of the row's last tokens in its
                prompt and output (suffix_match.py), up to `suffix_span` tokens long;
    - recycle   token recycling: each token's top-k next tokens from earlier logits,
                expanded into a static tree template (token_recycling.py);
  and, with `verify_window`, the window's own paths. With `adapt`, the merge weighs each
  proposal by what its source got accepted at its depth for the row lately (the
  acceptance record, acceptance_record.py).

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
the n-grams of the emitted text that end at the new tokens. The recycling tables are
refreshed from the logits of every token whose logits the step computes (the input, the
window's newest level and every tree slot).

Window initialisation: every slot starts as a prompt token drawn uniformly at random
(with the row's seed-derived key) from the row's prompt, as the reference does.

Stages of `lookahead_step`: propose (sources -> Proposals) -> merge (-> DraftTree, weighed
by the acceptance record) -> forward -> choose tokens -> verify -> commit and emit, update
the record -> feed the sources.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState, emit, input_tokens
from lookahead_jax.decoding.sampling import choose_tokens, gumbel_noise
from lookahead_jax.guesses import (
    acceptance_record,
    draft_tree,
    ngram_pool,
    suffix_match,
    token_recycling,
)
from lookahead_jax.guesses.lookahead_config import (
    POOL,
    POOL_RATES,
    RECYCLE,
    SOURCES,
    SUFFIX,
    SUFFIX_RATES,
    WINDOW,
    LookaheadConfig,
)
from lookahead_jax.guesses.lookahead_layout import StepLayout
from lookahead_jax.models import kv_cache

# A window slot's draw key is the row key folded with this (new-token indices,
# used for sampling noise, never reach it).
_WINDOW_KEY_SALT = 0x7FFFFFFF


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftState:
    """Per-row state of the guess sources, and which of them supplied accepted paths.

    window            [B, N-1, W] int32
    pool              NGramPool (capacity pool_capacity or G; 0 without the pool)
    recycle           RecycleTable, or None without token recycling
    record            AcceptanceRecord [B, J, verify_depth] (J = len(SOURCES)), or None unless
                      `adapt`: what each source got accepted at each depth, lately
    paths_by_source   [B, len(SOURCES)] int32  steps whose accepted path came from each
    tokens_by_source  [B, len(SOURCES)] int32  guessed tokens accepted from each
    """

    window: jax.Array
    pool: ngram_pool.NGramPool
    recycle: token_recycling.RecycleTable | None
    record: acceptance_record.AcceptanceRecord | None
    paths_by_source: jax.Array
    tokens_by_source: jax.Array


def init_lookahead(state: DecodeState, spec: DecodeSpec, prompt_bucket: int) -> DecodeState:
    """Add the window, the (seeded) pool and recycling table to a prefilled state.

    prompt_bucket: P, the padded prompt length of the prefill.
    """
    config: LookaheadConfig = spec.lookahead
    B = state.tokens.shape[0]
    n, m, vocab = config.n, config.m, spec.lm.vocab_size

    def draw_window(rng, prompt_len, tokens):
        rng = jax.random.fold_in(rng, _WINDOW_KEY_SALT)
        idx = jax.random.randint(rng, (m, config.w), 0, prompt_len)
        return tokens[idx]

    window = jax.vmap(draw_window)(state.rng, state.prompt_len, state.tokens)
    pool = ngram_pool.init_pool(B, vocab, config.pool_capacity or config.g, m)
    # The n-grams of prompt + first new token (prompt_pool), or only the one ending
    # at the first new token; later steps add those ending at their new tokens.
    end = state.prompt_len + state.n_out
    if config.prompt_pool:  # every n-gram ending at or before position P (prompt bucket)
        start, count = jnp.zeros((B,), jnp.int32), max(prompt_bucket - n + 2, 0)
    else:
        start, count = end - n, 1
    key_tokens, tails, ok, prev = ngram_pool.sequence_ngrams(state.tokens, start, count, n, end)
    pool = ngram_pool.insert(pool, key_tokens, tails, ok & ~state.done[:, None], prev)
    recycle = None
    if config.recycle:
        recycle = token_recycling.init_table(B, vocab, config.recycle_k)
        recycle = token_recycling.seed_from_text(recycle, state.tokens, end)
    record = None
    if config.adapt:
        record = acceptance_record.init(B, len(SOURCES), config.verify_depth)
    zeros = jnp.zeros((B, len(SOURCES)), jnp.int32)
    draft = DraftState(window, pool, recycle, record, zeros, zeros)
    return dataclasses.replace(state, draft=draft)


# ------------------------------------------------------------------ the step's stages


def previous_tokens(state: DecodeState):
    """The token before each row's input [B] (the input is at cache.lengths >= 1)."""
    before = jnp.maximum(state.cache.lengths - 1, 0)[:, None]
    return jnp.take_along_axis(state.tokens, before, axis=1)[:, 0]


def propose(
    state: DecodeState, config: LookaheadConfig, sampled: bool, input_b, prev_b
) -> draft_tree.Proposals:
    """Stage 1: every source's guesses for the tokens after each row's input (prev_b [B]:
    the token before it). sampled: whether rows may sample (DecodeSpec.sampled)."""
    d = state.draft
    B = input_b.shape[0]
    parts = []
    if config.g:
        tails_bgm, valid_bg, match_bg = ngram_pool.lookup(d.pool, input_b, prev_b, config.g)
        rate_bg = jnp.asarray(POOL_RATES, jnp.float32)[match_bg.astype(jnp.int32)]
        score_bgm = rate_bg[:, :, None] ** jnp.arange(1, config.m + 1)[None, None]
        parts.append(draft_tree.chains(tails_bgm, valid_bg * config.m, score_bgm, POOL))
    if config.suffix:
        end_b = state.prompt_len + state.n_out
        cont_bcm, length_bc, key_len_bc = suffix_match.propose(
            state.tokens,
            end_b,
            key_max=config.suffix_key,
            span=config.suffix_span,
            count=config.suffix,
        )
        rate_bc = jnp.asarray(SUFFIX_RATES, jnp.float32)[key_len_bc]
        score_bcm = rate_bc[:, :, None] ** jnp.arange(1, config.suffix_span + 1)[None, None]
        parts.append(draft_tree.chains(cont_bcm, length_bc, score_bcm, SUFFIX))
    if config.recycle:
        template = config.recycle_template
        expand = functools.partial(
            token_recycling.expand, d.recycle, prev_b, input_b, template, RECYCLE
        )
        if not sampled:
            parts.append(expand())
        else:  # sampling rows rank candidates with the noise of the indices nodes guess
            sampling_b = ~state.sampling.greedy()

            def with_noise():
                index_ba = state.n_out[:, None] + jnp.arange(template.max_depth)[None]
                vocab = d.recycle.by_token.shape[1]
                noise_bav = gumbel_noise(state.rng, index_ba, vocab)
                return expand((state.sampling.temperature, noise_bav, sampling_b))

            parts.append(jax.lax.cond(jnp.any(sampling_b), with_noise, expand))
    if not parts:
        return draft_tree.no_proposals(B)
    return draft_tree.concat(parts)


def window_tree(layout: StepLayout, window_flat) -> draft_tree.DraftTree:
    """The window's own paths as a verifiable tree (verify_window): static shape.

    window_flat [B, M*W]: the window's tokens in window order (its M*W slots)."""
    B, k = window_flat.shape
    bcast = lambda x: jnp.broadcast_to(jnp.asarray(x), (B, *np.shape(x)))  # noqa: E731
    return draft_tree.DraftTree(
        tokens=window_flat,
        parent=bcast(layout.window_parents),
        depth=bcast(layout.window_depths),
        valid=jnp.ones((B, k), bool),
        source=jnp.full((B, k), WINDOW, jnp.int32),
        score=jnp.zeros((B, k), jnp.float32),
        ancestors=bcast(layout.window_ancestors),
    )


def lookahead_step(params, state: DecodeState, spec: DecodeSpec) -> DecodeState:
    """One forward pass; every active row emits 1..max_emit tokens."""
    config: LookaheadConfig = spec.lookahead
    layout = config.layout
    B = state.tokens.shape[0]
    active_b = ~state.done
    length_b = state.cache.lengths
    input_b = input_tokens(state)
    prev_b = previous_tokens(state)
    window_flat = state.draft.window.reshape(B, layout.window_tokens)  # [B, M*W]

    # 1-2. propose and merge into the draft tree (with `adapt`, scores weighed by what
    #      each source got accepted at each depth for this row lately)
    proposals = propose(state, config, spec.sampled, input_b, prev_b)
    record = state.draft.record
    if layout.slots:
        weight_bja = None if record is None else acceptance_record.weights(record)
        tree = draft_tree.merge(proposals, layout.slots, config.tree_depth, weight_bja)
    else:
        tree = draft_tree.empty(B)

    # 3. one forward pass over input + window + tree
    step_tokens_bt = jnp.concatenate([input_b[:, None], window_flat, tree.tokens], axis=1)
    offsets_bt = layout.offsets(tree.depth)
    logits_rows_br = jnp.broadcast_to(jnp.asarray(layout.logits_rows), (B, len(layout.logits_rows)))
    logits_brv, new_k, new_v = spec.lm.apply(
        params,
        step_tokens_bt,
        # a guess may sit past the model's last position; clamped, it is never kept
        # (a row's kept tokens stay within prompt + budget <= max_context) and a model
        # with a position table never indexes past it
        jnp.minimum(length_b[:, None] + offsets_bt, spec.lm.max_context - 1),
        layout.mask(tree.ancestors),
        state.cache,
        logits_rows_br,
    )

    # 4. the model's token after each row: the row at offset o predicts the token at
    #    offset o + 1, whose new-token index is n_out + o (the input's is n_out - 1)
    row_offsets_br = jnp.take_along_axis(offsets_bt, logits_rows_br, axis=1)
    index_br = state.n_out[:, None] + row_offsets_br
    chosen_br = choose_tokens(logits_brv, state.sampling, state.rng, index_br, spec.sampled)
    after_input_b = chosen_br[:, 0]
    after_window_bw = chosen_br[:, 1 : 1 + layout.window_rows]
    after_tree_bz = chosen_br[:, 1 + layout.window_rows :]
    newest = slice(1 + layout.window_rows - config.w, 1 + layout.window_rows)
    if config.window_sampling:  # the window's new level: the model's own token there
        new_level_bw = chosen_br[:, newest]
    else:
        new_level_bw = jnp.argmax(logits_brv[:, newest], axis=-1).astype(jnp.int32)

    # 5. verify: the draft tree, and with verify_window the window's paths as well. A
    #    verified node k is step token first_index + k in both cases.
    if config.verify_window:
        verified = draft_tree.concat_trees(window_tree(layout, window_flat), tree)
        after_verified = jnp.concatenate([after_window_bw, after_tree_bz], axis=1)
        first_index = 1
    else:
        verified, after_verified, first_index = tree, after_tree_bz, layout.tree_start
    acc = draft_tree.verify(verified, after_input_b, after_verified, config.verify_depth)

    # 6. commit the input's and the accepted path's K/V; emit; count per source
    a_b = acc.accepted
    src_be = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), first_index + acc.path], axis=1)
    cache = kv_cache.commit(state.cache, new_k, new_v, src_be, jnp.where(active_b, a_b + 1, 0))
    counted_b = active_b & (a_b > 0)
    by_source = jax.nn.one_hot(acc.source, len(SOURCES), dtype=jnp.int32)  # -1: all zero
    if record is not None:
        record = acceptance_record.update(record, verified, acc, active_b)
    draft = dataclasses.replace(
        state.draft,
        record=record,
        paths_by_source=state.draft.paths_by_source + by_source * counted_b[:, None],
        tokens_by_source=state.draft.tokens_by_source
        + by_source * jnp.where(counted_b, a_b, 0)[:, None],
    )
    before = state
    state = dataclasses.replace(
        state,
        cache=cache,
        steps=state.steps + active_b,
        accept_hist=state.accept_hist.at[jnp.arange(B), a_b].add(active_b.astype(jnp.int32)),
        draft=draft,
    )
    state = emit(state, spec, acc.emitted, a_b + 1)

    # 7. feed the sources
    fed = FedRows.of(prev_b, layout, step_tokens_bt, logits_rows_br, tree, active_b)
    draft = feed_window_and_pool(state, config, draft, before, input_b, new_level_bw, active_b)
    draft = feed_recycling(config, draft, fed, logits_brv, acc)
    return dataclasses.replace(state, draft=draft)


@dataclasses.dataclass
class FedRows:
    """The R tokens of a step whose logits were computed: tokens [B, R], the token each
    follows [B, R] (its parent's; the input's is the token before it) and which are
    real [B, R] (not padding, and the row active)."""

    tokens: jax.Array
    prev: jax.Array
    ok: jax.Array

    @classmethod
    def of(cls, prev_b, layout: StepLayout, step_tokens_bt, logits_rows_br, tree, active_b):
        B = step_tokens_bt.shape[0]
        window_parents = jnp.asarray(layout.parent_of_rows[1 : 1 + layout.window_rows])
        parent_index_br = jnp.concatenate(
            [
                jnp.zeros((B, 1), jnp.int32),  # the input: replaced below
                jnp.broadcast_to(window_parents, (B, layout.window_rows)),
                jnp.where(tree.parent == draft_tree.ROOT, 0, layout.tree_start + tree.parent),
            ],
            axis=1,
        )
        prev_br = jnp.take_along_axis(step_tokens_bt, parent_index_br, axis=1)
        prev_br = prev_br.at[:, 0].set(prev_b)
        ok_br = jnp.concatenate([jnp.ones((B, 1 + layout.window_rows), bool), tree.valid], axis=1)
        tokens_br = jnp.take_along_axis(step_tokens_bt, logits_rows_br, axis=1)
        return cls(tokens_br, prev_br, ok_br & active_b[:, None])


def feed_window_and_pool(
    state: DecodeState,
    config: LookaheadConfig,
    d: DraftState,
    before: DecodeState,
    input_b,
    new_level_bw,
    active_b,
) -> DraftState:
    """Shift the window by its new level; put the window's n-grams and those of the
    emitted text that end at new tokens into the pool."""
    B = new_level_bw.shape[0]
    n, w = config.n, config.w
    pool = d.pool
    if pool.capacity:
        tails_bmw = jnp.concatenate([d.window[:, 1:], new_level_bw[:, None]], axis=1)
        # a level-0 token follows the one left of it, column 0 the step's input
        prev_bw = jnp.concatenate([input_b[:, None], d.window[:, 0, :-1]], axis=1)
        ok_bw = jnp.broadcast_to(active_b[:, None], (B, w))
        pool = ngram_pool.insert(
            pool, d.window[:, 0], jnp.swapaxes(tails_bmw, 1, 2), ok_bw, prev_bw
        )
        end_b = state.prompt_len + state.n_out
        first_b = state.prompt_len + before.n_out - n + 1
        key_tokens, tails, ok, prev = ngram_pool.sequence_ngrams(
            state.tokens, first_b, config.max_emit, n, end_b
        )
        pool = ngram_pool.insert(pool, key_tokens, tails, ok & active_b[:, None], prev)
    window = jnp.where(
        active_b[:, None, None],
        jnp.concatenate([d.window[:, 1:], new_level_bw[:, None]], axis=1),
        d.window,
    )
    return dataclasses.replace(d, window=window, pool=pool)


def feed_recycling(config: LookaheadConfig, d: DraftState, fed: FedRows, logits_brv, acc):
    """Refresh the recycling tables from every fed row's logits."""
    if d.recycle is None:
        return d
    R = fed.tokens.shape[1]
    # rows whose logits saw the true context (the input and the accepted path) win over
    # other rows holding the same token; then earlier rows win
    first_row = 1 + (0 if config.verify_window else config.layout.window_rows)
    path_rows_ba = first_row + acc.path
    on_path = (jnp.arange(acc.path.shape[1])[None] < acc.accepted[:, None])[:, :, None] & (
        path_rows_ba[:, :, None] == jnp.arange(R)[None, None]
    )
    priority_br = R - jnp.arange(R)[None] + R * jnp.any(on_path, axis=1)
    recycle = token_recycling.update(
        d.recycle, fed.prev, fed.tokens, logits_brv, priority_br, fed.ok
    )
    return dataclasses.replace(d, recycle=recycle)
