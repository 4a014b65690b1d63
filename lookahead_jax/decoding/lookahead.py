"""Lookahead decoding: one pure, fixed-shape step that emits one or more tokens per
forward pass, exactly the tokens plain decoding would.

Each step runs one forward pass (lookahead_layout.py) over

* the input token (the newest accepted token, not yet in the cache);
* the Jacobi window [N-1, W]: N-1 levels of guessed tokens. Column j is a Jacobi
  trajectory; the model's token after its newest level becomes the new newest level,
  the oldest level is dropped, and the column (oldest level .. new token) is an n-gram
  that goes into the pool;
* a draft tree of Z nodes (draft_tree.py) merged from the guess sources, each behind
  one protocol (guesses/guess_source.py: init, propose, feed) — the built-in ones:
    - pool      the pool's (N-1)-grams whose key is the input (ngram_pool.py);
    - suffix    continuations of earlier occurrences of the row's last tokens in its
                prompt and output (suffix_match.py), up to `suffix_span` tokens long;
    - recycle   token recycling: each token's top-k next tokens from earlier logits,
                expanded into a static tree template (token_recycling.py);
  then any `extra_sources` of the config; and, with `verify_window`, the window's own
  paths. With `adapt`, the merge weighs each proposal by what its source got accepted
  at its depth for the row lately (the acceptance record, acceptance_record.py).

Acceptance (draft_tree.verify): the deepest tree path whose every token equals the
model's token after its parent, plus the model's token after it (the bonus); only the
input's and the accepted path's K/V are committed — computed in this pass with exactly
plain decoding's context, so the cache stays what plain decoding would have built. "The
model's token" is the greedy argmax, or under sampling the seeded Gumbel-max choice of
sampling.py, which makes the one rule exact for sampling too.

Window feeding: the new level takes the model's token at the position it guesses — the
argmax, or under sampling the sample with that position's noise (`window_sampling`), so
that the Jacobi iteration converges to the sampled text. Every source is then fed what
the step verified (guess_source.Verified): the pool takes the W window n-grams and the
n-grams of the emitted text that end at the new tokens (and the prompt's before the
first step, `prompt_pool`); the recycling tables are refreshed from the logits of every
token whose logits the step computes (the input, the window's newest level and every
tree node).

Window initialisation: every window cell starts as a prompt token drawn uniformly at random
(with the row's seed-derived key) from the row's prompt, as the reference does.

Stages of `lookahead_step`: propose (each source -> Proposals) -> merge (-> DraftTree,
weighed by the acceptance record) -> forward -> choose tokens -> verify -> commit and
emit, update the record -> feed each source, shift the window.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from lookahead_jax import shapes
from lookahead_jax.decoding import grammar_rows
from lookahead_jax.decoding.decode_state import DecodeSpec, DecodeState, emit, input_tokens
from lookahead_jax.decoding.sampling import (
    choose_tokens,
    first_max_index,
    gumbel_noise,
    logsumexp,
)
from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses import acceptance_record, draft_tree, jacobi_window
from lookahead_jax.guesses.guess_source import Prompt, Sampler, Text, Verified
from lookahead_jax.guesses.lookahead_config import LookaheadConfig
from lookahead_jax.guesses.lookahead_layout import StepLayout
from lookahead_jax.models import kv_cache, packed, seam


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftState:
    """Per-row state of the Jacobi window and the guess sources, and which of them
    supplied accepted paths. J = len(config.source_names): the sources, then the window.

    window            [B, N-1, W] int32
    sources           each of config.sources' own state, in its order (None: keeps none)
    record            AcceptanceRecord [B, J, verify_depth], or None unless `adapt`: what
                      each source got accepted at each depth, lately
    paths_by_source   [B, J] int32  steps whose accepted path came from each
    tokens_by_source  [B, J] int32  guessed tokens accepted from each
    nodes_by_source   [B, J] int32  nodes each proposed (well-formed ones; two sources
                                    proposing one path share its node, and the merge
                                    credits it to one: a source can propose much and be
                                    credited nothing)
    """

    window: Int[Array, "B M W"]  # M = N-1 levels
    sources: tuple[Any, ...]
    record: acceptance_record.AcceptanceRecord | None
    paths_by_source: Int[Array, "B J"]
    tokens_by_source: Int[Array, "B J"]
    nodes_by_source: Int[Array, "B J"]


def prompt_of(state: DecodeState, spec: DecodeSpec, prompt_bucket: int) -> Prompt:
    """What the guess sources' `init` (and `recall`) read of a prefilled state."""
    return Prompt(
        tokens=state.tokens,
        end=state.prompt_len + state.n_out,
        active=~state.done,
        keys=state.rng,
        bucket=prompt_bucket,
        vocab=spec.lm.vocab_size,
    )


def init_lookahead(state: DecodeState, spec: DecodeSpec, prompt_bucket: int) -> DecodeState:
    """Add the window and every guess source's state (its `init`) to a prefilled state.

    prompt_bucket: P, the padded prompt length of the prefill.
    """
    config: LookaheadConfig = spec.lookahead
    B = state.tokens.shape[0]
    window = jacobi_window.init(state.rng, state.prompt_len, state.tokens, config.m, config.w)
    prompt = prompt_of(state, spec, prompt_bucket)
    sources = tuple(source.init(prompt) for source in config.sources)
    J = len(config.source_names)
    record = acceptance_record.init(B, J, config.verify_depth) if config.adapt else None
    zeros = jnp.zeros((B, J), jnp.int32)
    draft = DraftState(window, sources, record, zeros, zeros, zeros)
    return dataclasses.replace(state, draft=draft)


# ------------------------------------------------------------------ the step's stages


def previous_tokens(state: DecodeState):
    """The token before each row's input [B] (the input is at cache.lengths >= 1)."""
    before = jnp.maximum(state.cache.lengths - 1, 0)[:, None]
    return jnp.take_along_axis(state.tokens, before, axis=1)[:, 0]


def propose(
    state: DecodeState, config: LookaheadConfig, sampled: bool, input_b, prev_b, kernel: bool
) -> draft_tree.Proposals:
    """Stage 1: every source's guesses for the tokens after each row's input (prev_b [B]:
    the token before it), source j's marked j. sampled: whether rows may sample
    (DecodeSpec.sampled); kernel: the CPU kernel runs the model (the noise's bits too)."""
    sampler = None
    if sampled:
        sampler = Sampler(
            sampling=~state.sampling.greedy(),
            temperature=state.sampling.temperature,
            n_out=state.n_out,
            noise=lambda index_ba, vocab: gumbel_noise(state.rng, index_ba, vocab, kernel),
        )
    text = Text(
        tokens=state.tokens,
        end=state.prompt_len + state.n_out,
        input=input_b,
        prev=prev_b,
        active=~state.done,
        sampler=sampler,
        grammar=None if state.grammar is None else grammar_rows.chains(state.grammar),
    )
    parts = []
    for j, (source, own) in enumerate(zip(config.sources, state.draft.sources, strict=True)):
        p = source.propose(own, text)
        shapes.check(text, p, names=("Text", f"{source.name}.propose()"))
        if p.tokens.shape != (input_b.shape[0], source.nodes):
            raise UserInputError(
                f"guess source {source.name!r} proposed {p.tokens.shape[1:]} nodes a row; it "
                f"declares nodes={source.nodes}"
            )
        parts.append(
            dataclasses.replace(
                p, valid=well_formed(p, source.depth), source=jnp.full_like(p.source, j)
            )
        )
    if not any(p.count for p in parts):
        return draft_tree.no_proposals(input_b.shape[0])
    return draft_tree.concat(parts)


def well_formed(p: draft_tree.Proposals, max_depth: int):
    """[B, count] bool: p.valid, and the node keeps the proposal rules (guess_source.py):
    its parent is ROOT or an earlier proposal, its depth is its parent's + 1 and at most
    the source's `depth`. A node that breaks them is never verified (a wrong depth would
    give it the wrong position and a path deeper than the tree's ancestor masks)."""
    index = jnp.arange(p.count)[None]
    from_root = p.parent == draft_tree.ROOT
    parent_ok = from_root | ((p.parent >= 0) & (p.parent < index))
    parent_depth = jnp.take_along_axis(p.depth, jnp.clip(p.parent, 0, None), axis=1)
    depth_ok = p.depth == jnp.where(from_root, 1, parent_depth + 1)
    return p.valid & parent_ok & depth_ok & (p.depth <= max_depth)


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
    kernel = packed.is_packed(params)  # (the CPU kernel runs the model: argmax, noise too)

    # 1-2. propose and merge into the draft tree (with `adapt`, scores weighed by what
    #      each source got accepted at each depth for this row lately)
    proposals = propose(state, config, spec.sampled, input_b, prev_b, kernel)
    record = state.draft.record
    if layout.nodes:
        weight_bja = None if record is None else acceptance_record.weights(record)
        tree = draft_tree.merge(proposals, layout.nodes, config.tree_depth, weight_bja)
    else:
        tree = draft_tree.empty(B)

    # 3. one forward pass over input + window + tree
    step_tokens_bt = jnp.concatenate([input_b[:, None], window_flat, tree.tokens], axis=1)
    offsets_bt = layout.offsets(tree.depth)
    logits_rows_br = jnp.broadcast_to(jnp.asarray(layout.logits_rows), (B, len(layout.logits_rows)))
    logits_brv, new_k, new_v = seam.apply(
        spec.lm,
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

    # 4. the model's token after each row (under a grammar, from its logits masked by the
    #    state the row's path reaches), and the window's new level
    if state.grammar is not None:
        logits_brv = grammar_mask(logits_brv, state.grammar, config, tree, logits_rows_br)
    chosen_br, new_level_bw = choose(logits_brv, state, spec, offsets_bt, logits_rows_br, kernel)

    # 5. verify: the draft tree, and with verify_window the window's paths as well
    verified, acc, first_index = verify(config, tree, window_flat, chosen_br)

    # 6. commit the input's and the accepted path's K/V; emit; count per source
    a_b = acc.accepted
    src_be = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), first_index + acc.path], axis=1)
    cache = kv_cache.commit(state.cache, new_k, new_v, src_be, jnp.where(active_b, a_b + 1, 0))
    draft = counted(state.draft, len(config.source_names), proposals, verified, acc, active_b)
    before = state
    state = dataclasses.replace(
        state,
        cache=cache,
        steps=state.steps + active_b,
        accept_hist=state.accept_hist.at[jnp.arange(B), a_b].add(active_b.astype(jnp.int32)),
        draft=draft,
    )
    # emitted token e was chosen from the input's logits row (e = 0) or from accepted
    # node e - 1's
    path_rows_ba = first_verified_row(config) + acc.path
    rows_be = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), path_rows_ba], axis=1)
    state = emit(state, spec, acc.emitted, a_b + 1, (logits_brv, rows_be))

    # 7. feed the sources what the step verified; shift the window by its new level
    computed_br, computed_prev_br, computed_ok_br = computed_rows(
        prev_b, layout, step_tokens_bt, logits_rows_br, tree, active_b
    )
    shifted_bmw = jacobi_window.shift(draft.window, new_level_bw)
    verified_step = Verified(
        tokens=state.tokens,
        end=state.prompt_len + state.n_out,
        start=state.prompt_len + before.n_out,
        max_emit=config.max_emit,
        active=active_b,
        window=jacobi_window.ngrams(draft.window, shifted_bmw, input_b, active_b),
        computed=computed_br,
        computed_prev=computed_prev_br,
        computed_ok=computed_ok_br,
        logits=logits_brv,
        log_norm=logsumexp(logits_brv, kernel),
        chosen=chosen_br,
        on_path=accepted_rows(config, acc, computed_br.shape[1]),
        accepted_source=acc.source,
    )
    shapes.check(verified_step)
    sources = tuple(
        source.feed(own, verified_step)
        for source, own in zip(config.sources, draft.sources, strict=True)
    )
    for source, own, new in zip(config.sources, draft.sources, sources, strict=True):
        shapes.check(own, new, names=(f"{source.name} state", f"{source.name}.feed()"))
    window = jnp.where(active_b[:, None, None], shifted_bmw, draft.window)
    draft = dataclasses.replace(draft, window=window, sources=sources)
    return dataclasses.replace(state, draft=draft)


def grammar_mask(logits_brv, rows: grammar_rows.GrammarRows, config, tree, logits_rows_br):
    """The logits rows [B, R, V] masked by each row's grammar state: the input's by the
    row's, each tree node's by the state its path reaches (grammar_rows.node_states); the
    window's rows are left free (they only make the window's next guesses), so the
    window's own paths may not be verified under a grammar."""
    if config.verify_window:  # (the engine refuses the pair before it gets here)
        raise UserInputError("a grammar cannot be followed with verify_window=True")
    B = logits_brv.shape[0]

    def masked():
        node_bz = grammar_rows.node_states(rows, tree.tokens, tree.parent, config.tree_depth)
        window_bk = jnp.full((B, config.layout.window_tokens), grammar_rows.FREE, jnp.int32)
        step_bt = jnp.concatenate([rows.state_b[:, None], window_bk, node_bz], axis=1)
        state_br = jnp.take_along_axis(step_bt, logits_rows_br, axis=1)
        return grammar_rows.mask(logits_brv, state_br, rows.tables)

    # only in a step where some row follows a grammar (all FREE: every node FREE too, the
    # mask the identity): the node states' gathers are skipped with the mask
    return jax.lax.cond(jnp.any(rows.state_b != grammar_rows.FREE), masked, lambda: logits_brv)


def choose(logits_brv, state: DecodeState, spec: DecodeSpec, offsets_bt, logits_rows_br, kernel):
    """Stage 4: the model's token after each logits row [B, R] (the argmax, or a sampling
    row's seeded draw: the row at offset o predicts the token at offset o + 1, whose
    new-token index is n_out + o; the input's is n_out - 1), and the window's new level
    [B, W] (the model's own token there, or with window_sampling off the argmax)."""
    config: LookaheadConfig = spec.lookahead
    layout = config.layout
    row_offsets_br = jnp.take_along_axis(offsets_bt, logits_rows_br, axis=1)
    index_br = state.n_out[:, None] + row_offsets_br
    chosen_br = choose_tokens(logits_brv, state.sampling, state.rng, index_br, spec.sampled, kernel)
    newest = slice(1 + layout.window_rows - config.w, 1 + layout.window_rows)
    if config.window_sampling:
        return chosen_br, chosen_br[:, newest]
    return chosen_br, first_max_index(logits_brv[:, newest], kernel)


def verify(config: LookaheadConfig, tree, window_flat, chosen_br):
    """Stage 5: (the verified tree, its Acceptance, first_index): the draft tree, and
    with verify_window the window's paths before it (window_flat [B, M*W]), checked
    against the model's tokens chosen_br [B, R]. Verified node k is step token
    first_index + k."""
    layout = config.layout
    after_input_b = chosen_br[:, 0]
    after_window_bw = chosen_br[:, 1 : 1 + layout.window_rows]
    after_tree_bz = chosen_br[:, 1 + layout.window_rows :]
    if config.verify_window:
        window = jacobi_window.as_tree(layout, window_flat, len(config.sources))
        verified = draft_tree.concat_trees(window, tree)
        after_verified = jnp.concatenate([after_window_bw, after_tree_bz], axis=1)
        first_index = 1
    else:
        verified, after_verified, first_index = tree, after_tree_bz, layout.tree_start
    acc = draft_tree.verify(verified, after_input_b, after_verified, config.verify_depth)
    return verified, acc, first_index


def counted(draft: DraftState, J: int, proposals, verified, acc, active_b) -> DraftState:
    """Stage 6's counts of J sources (the window included): the acceptance record after
    this step, and each source's proposed nodes, credited paths and tokens."""
    a_b = acc.accepted
    counted_b = active_b & (a_b > 0)
    by_source = jax.nn.one_hot(acc.source, J, dtype=jnp.int32)  # -1: all zero
    record = draft.record
    if record is not None:
        record = acceptance_record.update(record, verified, acc, active_b)
    hot_bzj = jax.nn.one_hot(proposals.source, J, dtype=jnp.int32)
    proposed_bj = jnp.sum(hot_bzj * proposals.valid[..., None], axis=1, dtype=jnp.int32)
    return dataclasses.replace(
        draft,
        record=record,
        paths_by_source=draft.paths_by_source + by_source * counted_b[:, None],
        tokens_by_source=draft.tokens_by_source + by_source * jnp.where(counted_b, a_b, 0)[:, None],
        nodes_by_source=draft.nodes_by_source + proposed_bj * active_b[:, None],
    )


def computed_rows(prev_b, layout: StepLayout, step_tokens_bt, logits_rows_br, tree, active_b):
    """The R tokens of a step whose logits were computed: tokens [B, R], the token each
    follows [B, R] (its parent's; the input's is the token before it, prev_b) and which
    are real [B, R] (not padding, and the row active)."""
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
    return tokens_br, prev_br, ok_br & active_b[:, None]


def first_verified_row(config: LookaheadConfig) -> int:
    """Verified node k's logits row is this + k: the window's first (verify_window: its
    paths come first) or the tree's, after the input's row."""
    return 1 + (0 if config.verify_window else config.layout.window_rows)


def accepted_rows(config: LookaheadConfig, acc: draft_tree.Acceptance, R: int):
    """[B, R] bool: the logits rows of the accepted path's nodes."""
    path_rows_ba = first_verified_row(config) + acc.path
    on_path = (jnp.arange(acc.path.shape[1])[None] < acc.accepted[:, None])[:, :, None] & (
        path_rows_ba[:, :, None] == jnp.arange(R)[None, None]
    )
    return jnp.any(on_path, axis=1)
