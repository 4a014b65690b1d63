"""Token recycling (Luo et al., 2024): guesses from the model's own earlier runners-up.

Every forward pass computes a full next-token distribution at each fed token, and
decoding keeps one token of it. Token recycling keeps the top-k tokens the model
predicted the last time it read a context, in two tables per row:

    by_token   [B, V, k]             keyed by the last token t
    by_pair    [B, PAIR_BUCKETS, k]  keyed by the last two tokens (s, t), hashed into
                                     PAIR_BUCKETS buckets; pair_key [B, PAIR_BUCKETS, 2]
                                     holds the pair a bucket belongs to

(int32 token ids, EMPTY = -1 where nothing was seen). A node's *candidates* are the
pair table's tokens for (its parent's token, its token), then the token table's tokens
for its token that the pair entry does not already hold: up to 2k, best first. The
longer context is more specific (in the project's simulations on MT-bench greedy
outputs it added about a tenth to the tokens per step); the token table fills in where
the pair was never seen.

The step's input is expanded into a draft tree of fixed shape: a node of the static
*template* is (parent node, rank r) and its token is its parent's r-th candidate. Both
tables are refreshed from the logits of every token whose logits the step computes (the
input, the window's newest level, every tree node) — tokens the step does not keep,
recycled. Before the first step the token table is
seeded from the prompt: each token's entry 0 is the token that followed its last
occurrence.

`template` builds the static tree: given how often a rank-r guess is right when its
parent is, it adds nodes best-path-first — the tree that maximises the expected number
of accepted tokens for its size, under that model (ties: the earlier node's child
first). Example, `template(6, (0.5, 0.2, 0.1, 0.05))`, nodes in the order added:

    root ─┬─ 0: r0 (0.5) ── 1: r0 (0.25) ── 3: r0 (0.125)
          ├─ 2: r1 (0.2) ── 5: r0 (0.1)
          └─ 4: r2 (0.1)
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from lookahead_jax.errors import UserInputError
from lookahead_jax.guesses.draft_tree import ROOT, Proposals
from lookahead_jax.guesses.guess_source import Prompt, Text, Verified, check_int
from lookahead_jax.vocab_top_k import top_k

EMPTY = -1
SEED_PROB = 0.5  # the probability given to a prompt bigram's follower (no logits seen)
PAIR_BITS = 14
PAIR_BUCKETS = 1 << PAIR_BITS  # 2-token contexts a row remembers (a few thousand are seen)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RecycleTable:
    by_token: Int[Array, "B V k"]
    by_pair: Int[Array, f"B {PAIR_BUCKETS} k"]
    pair_key: Int[Array, f"B {PAIR_BUCKETS} 2"]  # (previous, last) token of the bucket's pair
    token_probs: Float[Array, "B V k"]  # each entry's probability when recorded
    pair_probs: Float[Array, f"B {PAIR_BUCKETS} k"]

    @property
    def k(self) -> int:
        return self.by_token.shape[2]


@dataclasses.dataclass(frozen=True)
class Template:
    """A static tree: node i has parent `parents[i]` (< i, or ROOT) and takes its
    parent's rank-`ranks[i]` candidate; `scores[i]` is the modelled chance that the
    whole path to it is right."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    scores: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return tuple(out)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)


def template(nodes: int, rank_rates: tuple[float, ...], max_depth: int = 16) -> Template:
    """The `nodes`-node tree that adds, one at a time, the node whose path is most
    likely right (a node's chance = its parent's x the rate of its rank). Ties go to the
    shallower, then lower rank node. Children of a node are added in rank order."""
    parents: list[int] = []
    ranks: list[int] = []
    scores: list[float] = []
    # frontier: (-chance, depth, rank, parent index); each node offers its next rank
    frontier = [(-rank_rates[0], 1, 0, ROOT)]
    while frontier and len(parents) < nodes:
        neg, depth, rank, parent = heapq.heappop(frontier)
        idx = len(parents)
        parents.append(parent)
        ranks.append(rank)
        scores.append(-neg)
        parent_chance = 1.0 if parent == ROOT else scores[parent]
        if rank + 1 < len(rank_rates):  # the sibling with the next rank
            sibling = (-parent_chance * rank_rates[rank + 1], depth, rank + 1, parent)
            heapq.heappush(frontier, sibling)
        if depth < max_depth:  # this node's first child
            heapq.heappush(frontier, (-scores[idx] * rank_rates[0], depth + 1, 0, idx))
    return Template(tuple(parents), tuple(ranks), tuple(scores))


def init_table(batch: int, vocab: int, k: int) -> RecycleTable:
    return RecycleTable(
        by_token=jnp.full((batch, vocab, k), EMPTY, jnp.int32),
        by_pair=jnp.full((batch, PAIR_BUCKETS, k), EMPTY, jnp.int32),
        pair_key=jnp.full((batch, PAIR_BUCKETS, 2), EMPTY, jnp.int32),
        token_probs=jnp.zeros((batch, vocab, k), jnp.float32),
        pair_probs=jnp.zeros((batch, PAIR_BUCKETS, k), jnp.float32),
    )


def pair_bucket(prev, last):
    """Bucket of the 2-token context (prev, last), any shape (a multiplicative hash)."""
    mix = lambda x, c: x.astype(jnp.uint32) * jnp.uint32(c)  # noqa: E731
    h = mix(prev, 0x9E3779B1) ^ mix(last, 0x85EBCA77)
    return (h >> jnp.uint32(32 - PAIR_BITS)).astype(jnp.int32)


def seed_from_text(table: RecycleTable, tokens_bs, end_b) -> RecycleTable:
    """Entry 0 of each token seen in `tokens[:, :end]` := the token after its last
    occurrence (that has a successor)."""
    B, S = tokens_bs.shape
    V = table.by_token.shape[1]
    j = jnp.arange(S)[None]
    has_next = j < (end_b - 1)[:, None]
    last = jnp.full((B, V), -1, jnp.int32)
    last = jax.vmap(lambda dst, t, pos: dst.at[t].max(pos))(
        last, tokens_bs, jnp.where(has_next, j, -1).astype(jnp.int32)
    )
    follower = jnp.take_along_axis(tokens_bs, jnp.clip(last + 1, 0, S - 1), axis=1)  # [B, V]
    seen = last >= 0
    entry0 = jnp.where(seen, follower, table.by_token[:, :, 0])
    prob0 = jnp.where(seen, SEED_PROB, table.token_probs[:, :, 0])
    return dataclasses.replace(
        table,
        by_token=table.by_token.at[:, :, 0].set(entry0),
        token_probs=table.token_probs.at[:, :, 0].set(prob0),
    )


def _first_writer(index_br, prio_br, ok_br, size: int):
    """Which of R writes into `size` entries go through: per entry, the ok writer with the
    highest (distinct) priority; the rest get index `size` (dropped)."""
    prio = jnp.where(ok_br, prio_br, -1).astype(jnp.int32)
    best = jax.vmap(lambda i, p: jnp.full((size,), -1, jnp.int32).at[i].max(p))(index_br, prio)
    wins = ok_br & (jnp.take_along_axis(best, index_br, axis=1) == prio)
    return jnp.where(wins, index_br, size)


def update(table: RecycleTable, prev_br, tokens_br, logits_brv, priority_br, ok_br, lse_br=None):
    """Refresh the entries of the R fed tokens (and of their 2-token contexts
    (prev, token)) from their logits [B, R, V] (lse_br [B, R]: their logsumexp, where
    the caller has it; else computed here).

    Where several fed tokens share an entry, the one with the highest `priority`
    (distinct per row) writes: the result does not depend on scatter order.
    """
    V, buckets = table.by_token.shape[1], table.by_pair.shape[1]
    top_logits, top = top_k(logits_brv, table.k)  # [B, R, k] (ties: any order)
    if lse_br is None:
        lse_br = jax.nn.logsumexp(logits_brv, axis=-1)
    probs = jnp.exp(top_logits - lse_br[..., None])
    probs = probs.astype(jnp.float32)
    write = jax.vmap(lambda dst, i, v: dst.at[i].set(v, mode="drop"))
    token_at = _first_writer(tokens_br, priority_br, ok_br, V)
    bucket = _first_writer(pair_bucket(prev_br, tokens_br), priority_br, ok_br, buckets)
    return RecycleTable(
        by_token=write(table.by_token, token_at, top),
        by_pair=write(table.by_pair, bucket, top),
        pair_key=write(table.pair_key, bucket, jnp.stack([prev_br, tokens_br], axis=-1)),
        token_probs=write(table.token_probs, token_at, probs),
        pair_probs=write(table.pair_probs, bucket, probs),
    )


def candidates(table: RecycleTable, prev, last):
    """Each node's candidates [B, nodes, 2k] int32, best first, EMPTY-padded at the end,
    and their recorded probabilities [B, nodes, 2k], for nodes whose token is `last` and
    whose parent's is `prev` (both [B, nodes])."""
    B = last.shape[0]
    rows = jnp.arange(B)[:, None]
    bucket = pair_bucket(prev, last)
    key = table.pair_key[rows, bucket]  # [B, nodes, 2]
    hit = (key[..., 0] == prev) & (key[..., 1] == last)
    pair = jnp.where(hit[..., None], table.by_pair[rows, bucket], EMPTY)  # [B, nodes, k]
    pair_p = jnp.where(hit[..., None], table.pair_probs[rows, bucket], 0.0)
    single = table.by_token[rows, last]  # [B, nodes, k]
    single_p = table.token_probs[rows, last]
    dup = jnp.any(single[..., :, None] == pair[..., None, :], axis=-1)
    single = jnp.where(dup, EMPTY, single)
    both = jnp.concatenate([pair, single], axis=-1)  # [B, nodes, 2k]
    both_p = jnp.concatenate([pair_p, single_p], axis=-1)
    # by recorded probability (the pair's entry first on ties), EMPTY last
    order = jnp.argsort(jnp.where(both == EMPTY, jnp.inf, -both_p), axis=-1, stable=True)
    take = lambda x: jnp.take_along_axis(x, order, axis=-1)  # noqa: E731
    return take(both), take(both_p)


def expand(
    table: RecycleTable, prev_b, root_b, tmpl: Template, source: int = 0, noise=None
) -> Proposals:
    """The template filled from the tables, rooted at each row's input token `root_b`
    (whose previous token is `prev_b`).

    noise: under sampling, (temperature [B], gumbel [B, A, V], sampling [B] bool), A the
    template's max depth: the Gumbel noise of the positions the nodes guess (depth d: the
    d-th token after the input). In a sampling row the token sampled there is the argmax
    of log(p)/temperature + noise (sampling.py), so a node's candidates are ranked by that
    key instead of by p, and a candidate's score is its share of the softmax of the keys
    over the candidates instead of p: a heuristic estimate of the chance that it is the
    token sampled there (a candidate whose noise lifts it far above the rest is nearly
    sure whatever its p; the recorded p stands in for the unknown logits). Rows where
    `sampling` is False (greedy) keep the order by p.
    """
    B = root_b.shape[0]
    n = tmpl.size
    parents = np.asarray(tmpl.parents, np.int32)
    ranks = np.asarray(tmpl.ranks, np.int32)
    depths = np.asarray(tmpl.depths, np.int32)
    grand = np.where(parents >= 0, parents[np.maximum(parents, 0)], ROOT)  # parent's parent
    tokens = jnp.zeros((B, n), jnp.int32)
    valid = jnp.zeros((B, n), bool)
    score = jnp.zeros((B, n), jnp.float32)
    for d in range(1, tmpl.max_depth + 1):  # parents are filled before their children
        nodes = np.nonzero(depths == d)[0]
        par = parents[nodes]
        width = len(nodes)
        if d == 1:
            last = jnp.broadcast_to(root_b[:, None], (B, width))
            prev = jnp.broadcast_to(prev_b[:, None], (B, width))
            parent_ok = jnp.ones((B, width), bool)
            parent_score = jnp.ones((B, width), jnp.float32)
        else:
            last, parent_ok, parent_score = tokens[:, par], valid[:, par], score[:, par]
            gp = grand[nodes]
            prev = jnp.where(gp[None] >= 0, tokens[:, np.maximum(gp, 0)], root_b[:, None])
        cands, cand_p = candidates(table, prev, last)  # [B, width, 2k]
        if noise is not None:
            temperature_b, gumbel_bav, sampling_b = noise
            g = jnp.take_along_axis(
                gumbel_bav[:, d - 1], jnp.maximum(cands, 0).reshape(B, -1), axis=1
            )
            empty = cands == EMPTY
            t = jnp.where(sampling_b, temperature_b, 1.0)[:, None, None]
            key = jnp.log(cand_p) / t + g.reshape(cands.shape)
            key = jnp.where(empty, -1e30, key)  # finite: a node with no candidate gets 0s
            order = jnp.argsort(-key, axis=-1, stable=True)
            share = jnp.where(empty, 0.0, jax.nn.softmax(key, axis=-1))
            on = sampling_b[:, None, None]
            cands = jnp.where(on, jnp.take_along_axis(cands, order, axis=-1), cands)
            cand_p = jnp.where(on, jnp.take_along_axis(share, order, axis=-1), cand_p)
        rank = jnp.broadcast_to(ranks[nodes][None, :, None], (B, width, 1))
        tok = jnp.take_along_axis(cands, rank, axis=-1)[..., 0]
        p = jnp.take_along_axis(cand_p, rank, axis=-1)[..., 0]
        score = score.at[:, nodes].set(parent_score * p)
        tokens = tokens.at[:, nodes].set(jnp.maximum(tok, 0))
        valid = valid.at[:, nodes].set(parent_ok & (tok != EMPTY))
    bcast = lambda x: jnp.broadcast_to(jnp.asarray(x), (B, n))  # noqa: E731
    return Proposals(
        tokens=tokens,
        parent=bcast(parents),
        depth=bcast(depths),
        score=score,
        valid=valid,
        source=jnp.full((B, n), source, jnp.int32),
    )


# Modelled chance that a recycled guess is right when its parent is, by candidate rank
# (candidates: up to 2k per node); the template is built from them and the merge orders
# proposals by them (guess_source.py). Ranks 16-31 serve recycle_k up to 16, which keeps
# more of a sampled text's tokens (at t=1.0 a quarter lie outside the top 8:
# benchmarks/cpu/adapt.md).
RECYCLE_RATES = (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02) + (0.015,) * 2 + (0.01,) * 6
RECYCLE_RATES += (0.005,) * 16


def _remember_row(memory: RecycleTable, row) -> tuple[RecycleTable, None]:
    """scan's body: one row's table (no batch axis) written over the one-row memory where
    it holds entries, if the row is chosen."""
    table, chosen = row
    has_token = chosen & (table.by_token[:, 0] != EMPTY)  # [V]
    has_pair = chosen & (table.pair_key[:, 0] != EMPTY)  # [PAIR_BUCKETS]

    def over(mine, theirs, where):  # mine [1, X, ...], theirs [X, ...], where [X]
        where = where.reshape(where.shape + (1,) * (theirs.ndim - 1))
        return jnp.where(where, theirs, mine[0])[None]

    return RecycleTable(
        by_token=over(memory.by_token, table.by_token, has_token),
        by_pair=over(memory.by_pair, table.by_pair, has_pair),
        pair_key=over(memory.pair_key, table.pair_key, has_pair),
        token_probs=over(memory.token_probs, table.token_probs, has_token),
        pair_probs=over(memory.pair_probs, table.pair_probs, has_pair),
    ), None


@dataclasses.dataclass(frozen=True)
class RecyclingSource:
    """Token recycling as a guess source: a static template of `size` nodes filled from
    each row's tables of the top `k` next tokens, rooted at the row's input. Fed with
    the logits of every token the step computed logits for."""

    size: int
    k: int = 8
    name: str = "recycle"

    @functools.cached_property
    def template(self) -> Template:
        return template(self.size, RECYCLE_RATES[: 2 * self.k])

    @property
    def nodes(self) -> int:
        return self.template.size

    @property
    def depth(self) -> int:
        return self.template.max_depth

    def init(self, prompt: Prompt) -> RecycleTable:
        table = init_table(prompt.tokens.shape[0], prompt.vocab, self.k)
        return seed_from_text(table, prompt.tokens, prompt.end)

    # -- an engine-wide memory (guess_source.py, "Across requests"): finished rows'
    # tables, that new rows start from

    def memory(self, vocab: int) -> RecycleTable:
        """An empty engine-wide table: one row."""
        return init_table(1, vocab, self.k)

    def recall(self, memory: RecycleTable, table: RecycleTable, prompt: Prompt) -> RecycleTable:
        """New rows' tables: the memory's, with each row's prompt seeded over it (a
        token's successor in the prompt is its entry 0, as `init` seeds it)."""
        del table  # replaced whole: `init`'s table is the empty one, seeded
        B = prompt.tokens.shape[0]
        start = jax.tree.map(lambda m: jnp.broadcast_to(m, (B, *m.shape[1:])), memory)
        return seed_from_text(start, prompt.tokens, prompt.end)

    def remember(self, memory: RecycleTable, table: RecycleTable, rows_b, ended) -> RecycleTable:
        """The memory with the tables of rows `rows_b` [B] (bool) written over it: a
        token's (a pair's) entries from the last of those rows that holds any."""
        del ended  # the tables hold what this source learnt from the rows' text
        return jax.lax.scan(_remember_row, memory, (table, rows_b))[0]

    def propose(self, table: RecycleTable, text: Text) -> Proposals:
        fill = functools.partial(expand, table, text.prev, text.input, self.template)
        sampler = text.sampler
        if sampler is None:
            return fill()

        def with_noise():  # sampling rows rank candidates by the noise of the indices
            index_ba = sampler.n_out[:, None] + jnp.arange(self.depth)[None]
            noise_bav = sampler.noise(index_ba, table.by_token.shape[1])
            return fill(noise=(sampler.temperature, noise_bav, sampler.sampling))

        return jax.lax.cond(jnp.any(sampler.sampling), with_noise, fill)

    def feed(self, table: RecycleTable, step: Verified) -> RecycleTable:
        # rows whose logits saw the true context (the input and the accepted path) win
        # over other rows holding the same token; then earlier rows win
        R = step.computed.shape[1]
        priority_br = R - jnp.arange(R)[None] + R * step.on_path
        return update(
            table,
            step.computed_prev,
            step.computed,
            step.logits,
            priority_br,
            step.computed_ok,
            step.log_norm,
        )


@dataclasses.dataclass(frozen=True)
class RecyclingSettings:
    """Token recycling's knobs in LookaheadConfig (guess_source.SourceSettings).

    recycle    template nodes proposed a step (0: none)
    recycle_k  next tokens kept per token
    """

    recycle: int = 0
    recycle_k: int = 8

    def __post_init__(self):
        check_int("recycle", self.recycle, 0)
        check_int("recycle_k", self.recycle_k, 1)
        if 2 * self.recycle_k > len(RECYCLE_RATES):
            raise UserInputError(f"lookahead recycle_k must be at most {len(RECYCLE_RATES) // 2}")

    def check(self, config) -> None:
        pass

    def source(self, config) -> RecyclingSource | None:
        return RecyclingSource(self.recycle, self.recycle_k) if self.recycle else None

    def describe(self, config) -> dict:
        return dataclasses.asdict(self)
