"""Property-based tests (hypothesis) of the invariants the lookahead step rests on.

* the n-gram pool against a pure-Python model of a deduplicated FIFO ring per key;
* the step's attention mask (window + a tree of candidate chains): a row sees only its
  own branch and the input, never a later position, one token per earlier position — in
  the layout and in the model;
* acceptance of candidate chains through the draft tree (`draft_tree.verify`) against a
  pure-Python reference, and emission (`decode_state.emit`): EOS, budget, never past
  the budget;
* `kv_cache.commit`: each row writes only at its own length, the chosen K/V.

Functions under test are jitted once per shape (shapes come from small strategies).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead_jax.decoding import decode_state
from lookahead_jax.decoding.sampling import RowSampling, SamplingConfig
from lookahead_jax.guesses import draft_tree, ngram_pool
from lookahead_jax.guesses.lookahead_layout import StepLayout
from lookahead_jax.models import kv_cache
from lookahead_jax.models.llama import LlamaLM, forward
from lookahead_jax.models.llama_params import init_params
from tests import tiny

# Examples per property: each new shape compiles, so the suite's time goes with them (a
# run draws fresh examples: database=None, so CI runs add up to many more)
SETTINGS = settings(deadline=None, max_examples=25, database=None)
FEW = settings(deadline=None, max_examples=12, database=None)  # ~1 s of compiling each

# ------------------------------------------------------------------ the n-gram pool

POOL_VOCAB = 6
INSERTS_PER_CALL = 3

_insert = jax.jit(ngram_pool.insert)
_lookup = jax.jit(ngram_pool.lookup, static_argnums=3)


@st.composite
def pool_runs(draw):
    """(batch, capacity, tail length, [(keys [B, I], tails [B, I, M], ok [B, I]), ...])."""
    b = draw(st.integers(1, 2))
    g = draw(st.integers(1, 4))
    m = draw(st.integers(1, 3))
    # few distinct keys and tail tokens, so that duplicates and evictions are common
    key_hi = draw(st.integers(0, POOL_VOCAB - 1))
    tok_hi = draw(st.integers(0, 2))
    n_calls = draw(st.integers(1, 6))
    calls = []
    for _ in range(n_calls):
        shape = (b, INSERTS_PER_CALL)
        keys = draw(st.lists(st.integers(0, key_hi), min_size=b * 3, max_size=b * 3))
        tails = draw(st.lists(st.integers(0, tok_hi), min_size=b * 3 * m, max_size=b * 3 * m))
        ok = draw(st.lists(st.booleans(), min_size=b * 3, max_size=b * 3))
        prev = draw(st.lists(st.integers(0, 2), min_size=b * 3, max_size=b * 3))
        calls.append(
            (
                np.asarray(keys, np.int32).reshape(shape),
                np.asarray(tails, np.int32).reshape(*shape, m),
                np.asarray(ok, bool).reshape(shape),
                np.asarray(prev, np.int32).reshape(shape),
            )
        )
    return b, g, m, calls


class ReferencePool:
    """Per (row, key): the stored tails, oldest first, each with its latest previous token
    and hit count, and how many inserts were real."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rings: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        self.meta: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}  # [prev, hits]
        self.inserted: dict[tuple[int, int], int] = {}

    def insert(self, row: int, key: int, tail: tuple[int, ...], prev: int) -> None:
        ring = self.rings.setdefault((row, key), [])
        if tail in ring:  # deduplicated: a hit, and the newest context
            self.meta[(row, key, tail)] = [prev, self.meta[(row, key, tail)][1] + 1]
            return
        ring.append(tail)
        self.meta[(row, key, tail)] = [prev, 1]
        self.inserted[(row, key)] = self.inserted.get((row, key), 0) + 1
        if len(ring) > self.capacity:  # full: the oldest goes
            ring.pop(0)

    def lookup(self, row: int, key: int, prev: int) -> list[tuple[int, ...]]:
        """Context match first, then hits, then the newest."""
        ring = self.rings.get((row, key), [])
        order = sorted(
            range(len(ring)),
            key=lambda i: (
                -(self.meta[(row, key, ring[i])][0] == prev),
                -self.meta[(row, key, ring[i])][1],
                -i,
            ),
        )
        return [ring[i] for i in order]


@SETTINGS
@given(pool_runs())
def test_pool_is_a_deduplicated_fifo_ring_per_key(run):
    b, g, m, calls = run
    pool = ngram_pool.init_pool(b, POOL_VOCAB, g, m)
    ref = ReferencePool(g)
    for keys, tails, ok, prev in calls:
        pool = _insert(pool, *(jnp.asarray(x) for x in (keys, tails, ok, prev)))
        for i in range(INSERTS_PER_CALL):  # item i of every row, then item i + 1
            for row in range(b):
                if ok[row, i]:
                    ref.insert(
                        row, int(keys[row, i]), tuple(tails[row, i].tolist()), int(prev[row, i])
                    )

    tokens, head, fill = (np.asarray(x) for x in (pool.tokens, pool.head, pool.fill))
    for key, prev in itertools.product(range(POOL_VOCAB), range(3)):
        looked = _lookup(pool, jnp.full((b,), key), jnp.full((b,), prev), g)
        looked_tails, looked_valid = (np.asarray(x) for x in looked[:2])
        for row in range(b):
            want = ref.rings.get((row, key), [])
            n = int(fill[row, key])
            assert 0 <= n <= g  # capacity
            # the ring read oldest first: slot head - fill, ..., head - 1 (mod capacity)
            got = [tuple(tokens[row, key, (head[row, key] - n + j) % g].tolist()) for j in range(n)]
            assert got == want, (row, key, got, want)
            assert len(set(got)) == len(got)  # no duplicates
            assert head[row, key] == ref.inserted.get((row, key), 0) % g
            rows = zip(looked_tails[row].tolist(), looked_valid[row], strict=True)
            valid = [tuple(t) for t, v in rows if v]
            assert valid == ref.lookup(row, key, prev)  # the selection rule's order


# ------------------------------------------------------------------ the attention mask

layouts = st.tuples(st.integers(2, 6), st.integers(1, 6), st.integers(0, 5))


def branch(n: int, w: int, t: int):
    """Token t of a step, from the index arithmetic alone: ('in',), ('win', level, col)
    or ('cand', c, i)."""
    m = n - 1
    if t == 0:
        return ("in",)
    if t < 1 + m * w:
        return ("win", *divmod(t - 1, w))
    return ("cand", *divmod(t - 1 - m * w, m))


def position(b) -> int:
    """Offset from the input's position: a window token (l, j) is at 1 + l + j, a
    candidate token i at 1 + i."""
    if b[0] == "in":
        return 0
    if b[0] == "win":
        return 1 + b[1] + b[2]
    return 1 + b[2]


def may_see(q, k) -> bool:
    """The lookahead paper's rule: everything sees the input; window token (l, j) sees
    level 0 up to column j and its own column up to level l; candidate token (c, i)
    sees its own candidate's tokens 0..i. Nothing else."""
    if k[0] == "in":
        return True
    if q[0] == "win" and k[0] == "win":
        return (k[1] == 0 and k[2] <= q[2]) or (k[2] == q[2] and k[1] <= q[1])
    if q[0] == "cand" and k[0] == "cand":
        return k[1] == q[1] and k[2] <= q[2]
    return False


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _mask_offsets(n: int, w: int, g: int):
    """chains_layout's mask and offsets, one compiled program per layout (run op by op,
    each of the tree's operations compiled on its own: seconds per layout)."""
    m = n - 1
    lay = StepLayout(n, w, g * m)
    tokens = jnp.arange(g * m, dtype=jnp.int32).reshape(1, g, m)
    prop = draft_tree.chains(tokens, jnp.full((1, g), m), jnp.full((1, g, m), 0.5), source=0)
    tree = draft_tree.merge(prop, g * m, m) if g else draft_tree.empty(1)
    return lay.mask(tree.ancestors), lay.offsets(tree.depth)


@functools.cache
def chains_layout(n: int, w: int, g: int):
    """The layout and (static, one-row) mask/offsets of a step whose tree holds G
    distinct candidate chains of N-1 tokens (unique tokens: nothing merges, so chain c
    token i is tree node c*(N-1) + i)."""
    mask, offsets = _mask_offsets(n, w, g)
    return StepLayout(n, w, g * (n - 1)), np.asarray(mask)[0], np.asarray(offsets)[0]


@settings(deadline=None, max_examples=6, database=None)  # each layout compiles (~2-4 s)
@given(layouts)
def test_mask_rows_see_their_own_branch_one_token_per_earlier_position(nwg):
    n, w, g = nwg
    lay, mask, offsets = chains_layout(n, w, g)
    t_count = 1 + (n - 1) * (w + g)
    assert lay.num_tokens == t_count and mask.shape == (t_count, t_count)
    kinds = [branch(n, w, t) for t in range(t_count)]
    assert offsets.tolist() == [position(b) for b in kinds]
    for t in range(t_count):
        seen = np.flatnonzero(mask[t]).tolist()
        assert seen == [u for u in range(t_count) if may_see(kinds[t], kinds[u])], kinds[t]
        # never the future, and exactly one token at each position p .. p + offset
        assert all(position(kinds[u]) <= position(kinds[t]) for u in seen)
        assert sorted(position(kinds[u]) for u in seen) == list(range(position(kinds[t]) + 1))


TINY = tiny.llama_config()
TINY_PARAMS = init_params(TINY, jax.random.PRNGKey(0), scale=0.5)


@functools.cache
def _step_forward(n: int, w: int, g: int):
    _, mask, offsets = chains_layout(n, w, g)
    mask = jnp.asarray(mask)[None]
    positions = jnp.asarray(offsets)[None] + 7

    @jax.jit
    def run(tokens):
        logits, _, _ = forward(TINY_PARAMS, TINY, tokens[None], positions, mask)
        return logits[0]

    return run


@settings(deadline=None, max_examples=8, database=None)  # each layout compiles (~2-4 s)
@given(
    st.tuples(st.integers(2, 4), st.integers(1, 3), st.integers(0, 3)), st.integers(0, 2**31 - 1)
)
def test_model_rows_ignore_every_token_of_other_branches_and_the_future(nwg, seed):
    """Through the real forward pass with the layout's mask: for every row, changing all
    the tokens that the paper's rule (`may_see`, not the mask itself) hides from it leaves
    its logits as they were; changing the input token (always seen) does not."""
    n, w, g = nwg
    lay = chains_layout(n, w, g)[0]
    kinds = [branch(n, w, t) for t in range(lay.num_tokens)]
    run = _step_forward(n, w, g)
    rng = np.random.default_rng(seed)
    vocab = TINY.vocab_size
    tokens = rng.integers(0, vocab, lay.num_tokens)
    base = np.asarray(run(jnp.asarray(tokens, jnp.int32)))
    other_input = tokens.copy()
    other_input[0] = (tokens[0] + 1) % vocab
    with_other_input = np.asarray(run(jnp.asarray(other_input, jnp.int32)))
    for t in range(lay.num_tokens):
        hidden = np.asarray([not may_see(kinds[t], kinds[u]) for u in range(lay.num_tokens)])
        changed = tokens.copy()
        changed[hidden] = (tokens[hidden] + rng.integers(1, vocab, hidden.sum())) % vocab
        out = np.asarray(run(jnp.asarray(changed, jnp.int32)))
        np.testing.assert_allclose(out[t], base[t], rtol=0, atol=1e-5, err_msg=str(kinds[t]))
        assert np.abs(with_other_input[t] - base[t]).max() > 1e-4, kinds[t]


# ------------------------------------------------------------------ acceptance and emission


@st.composite
def verify_inputs(draw):
    """cands [B, G, M], valid [B, G], after_input [B] over a tiny vocabulary, and the
    model: a random function from a token prefix to the model's next token (equal
    prefixes, merged into one tree node, get equal predictions). Each candidate starts
    with a drawn number of right tokens. Fixed shapes (B = 2, M = 4; G = 3 or none), so
    that the examples share their few programs: fewer candidates and shorter right
    prefixes come from `valid` and the drawn counts, not from the shapes."""
    b, m = 2, 4
    g = draw(st.sampled_from([0, 3]))
    vocab = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)

    def model(row: int, prefix: tuple[int, ...]) -> int:
        return int(np.random.default_rng([seed, row, *prefix, 99]).integers(0, vocab))

    after_input = np.asarray([model(row, ()) for row in range(b)], np.int32)
    cands = rng.integers(0, vocab, (b, g, m)).astype(np.int32)
    valid = rng.random((b, g)) < 0.8
    for row in range(b):
        for c in range(g):
            k = draw(st.integers(0, m))  # make the first k tokens right
            for i in range(k):
                cands[row, c, i] = model(row, tuple(cands[row, c, :i].tolist()))
    return cands, valid, after_input, model


def reference_verify(cands, valid, model):
    """Per row: (accepted count, [accepted count of each candidate])."""
    out = []
    b, g, m = cands.shape
    for row in range(b):
        acc = []
        for c in range(g):
            k = 0
            while (
                valid[row, c]
                and k < m
                and cands[row, c, k] == model(row, tuple(cands[row, c, :k].tolist()))
            ):
                k += 1
            acc.append(k)
        out.append((max(acc, default=0), acc))
    return out


# jitted: one program per example's shapes, not one per operation (eager mode compiles
# each op it has not seen at those shapes: ~300 compiles over this test's examples)
_verify = jax.jit(draft_tree.verify, static_argnums=3)
_emit = jax.jit(decode_state.emit, static_argnums=1)


def verify_chains(cands, valid, after_input, model):
    """The candidates as a merged draft tree, verified with the model's tokens."""
    b, g, m = cands.shape
    if g == 0:
        tree = draft_tree.empty(b)
    else:
        prop = draft_tree.chains(
            jnp.asarray(cands), jnp.asarray(valid * m), jnp.full((b, g, m), 0.5), source=0
        )
        tree = jax.jit(draft_tree.merge, static_argnums=(1, 2))(prop, g * m, m)
    tokens, parent, ok = (np.asarray(x) for x in (tree.tokens, tree.parent, tree.valid))
    after_node = np.zeros(tokens.shape, np.int32)
    for row in range(b):
        for q in range(tokens.shape[1]):
            if ok[row, q]:
                path, node = [], q
                while node != draft_tree.ROOT:
                    path.append(int(tokens[row, node]))
                    node = int(parent[row, node])
                after_node[row, q] = model(row, tuple(reversed(path)))
    acc = _verify(tree, jnp.asarray(after_input), jnp.asarray(after_node), m)
    return np.asarray(acc.accepted), np.asarray(acc.emitted)


@FEW
@given(
    verify_inputs(),
    st.sampled_from([(), (0,), (3, 1)]),  # EOS sets: each is its own emit program
    st.integers(0, 2**31 - 1),
)
def test_verify_then_emit(inputs, eos_ids, seed):
    cands, valid, after_input, model = inputs
    b, g, m = cands.shape
    a, emitted = verify_chains(cands, valid, after_input, model)
    assert emitted.shape == (b, m + 1)
    for row, (want_a, acc) in enumerate(reference_verify(cands, valid, model)):
        assert 0 <= a[row] <= m and a[row] == want_a  # a step emits a + 1 in 1..N tokens
        if g == 0 or a[row] == 0:
            assert emitted[row, 0] == after_input[row]
            continue
        c = acc.index(a[row])  # a longest right candidate: its prefix, then the bonus
        np.testing.assert_array_equal(emitted[row, : a[row]], cands[row, c, : a[row]])
        assert emitted[row, a[row]] == model(row, tuple(cands[row, c, : a[row]].tolist()))

    # emit: append up to a + 1 of them, cut at EOS and by the remaining budget
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(1, 5, b).astype(np.int32)
    n_out = rng.integers(0, 4, b).astype(np.int32)
    max_new_tokens = (n_out + rng.integers(0, 4, b)).astype(np.int32)  # remaining 0..3
    done = (n_out >= max_new_tokens) | (rng.random(b) < 0.2)
    state = make_state(prompt_len, n_out, max_new_tokens, done, width=m + 1, rng=rng)
    spec = decode_state.DecodeSpec(lm=LlamaLM(TINY), eos_ids=tuple(eos_ids), lookahead=None)
    new = _emit(state, spec, jnp.asarray(emitted), jnp.asarray(a + 1))
    tokens_before = np.asarray(state.tokens)
    tokens_after, n_after, done_after = (np.asarray(x) for x in (new.tokens, new.n_out, new.done))
    for row in range(b):
        count = int(a[row]) + 1
        if done[row]:
            assert n_after[row] == n_out[row] and done_after[row]
            np.testing.assert_array_equal(tokens_after[row], tokens_before[row])
            continue
        step = emitted[row, :count].tolist()
        before_eos = next((i for i, t in enumerate(step) if t in eos_ids), count)
        budget = int(max_new_tokens[row] - n_out[row])
        k = min(count, before_eos, budget)
        assert n_after[row] - n_out[row] == k
        assert n_after[row] <= max_new_tokens[row]  # never past the budget
        start = int(prompt_len[row] + n_out[row])
        np.testing.assert_array_equal(tokens_after[row, :start], tokens_before[row, :start])
        assert tokens_after[row, start : start + k].tolist() == step[:k]
        assert bool(done_after[row]) == (before_eos < count or n_after[row] >= max_new_tokens[row])


def make_state(
    prompt_len, n_out, max_new_tokens, done, width: int, rng
) -> decode_state.DecodeState:
    b = len(prompt_len)
    slots = 4 + 6 + width + 2  # prompt_len <= 4, max_new_tokens <= 6: one shape a width
    cache = kv_cache.KVCache(
        k=(jnp.zeros((b, 1, slots, 2)),),
        v=(jnp.zeros((b, 1, slots, 2)),),
        lengths=jnp.asarray(prompt_len + n_out - 1),
    )
    return decode_state.DecodeState(
        cache=cache,
        tokens=jnp.asarray(rng.integers(10, 20, (b, slots)), jnp.int32),
        step_of_token=jnp.zeros((b, slots), jnp.int32),
        prompt_len=jnp.asarray(prompt_len),
        n_out=jnp.asarray(n_out),
        max_new_tokens=jnp.asarray(max_new_tokens),
        done=jnp.asarray(done),
        steps=jnp.ones((b,), jnp.int32),
        rng=jnp.zeros((b, 2), jnp.uint32),
        sampling=RowSampling.of([SamplingConfig()] * b),
        accept_hist=jnp.zeros((b, width), jnp.int32),
    )


# ------------------------------------------------------------------ the KV commit

KV_LAYERS, KV_POSITIONS, KV_TOKENS, KV_WIDTH = 2, 12, 5, 4
_commit = jax.jit(kv_cache.commit)


@SETTINGS
@given(st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_commit_writes_only_the_chosen_kv_at_each_rows_own_length(b, seed):
    rng = np.random.default_rng(seed)
    shape = (KV_LAYERS, b, 1, KV_POSITIONS, 2)  # per layer [B, K, S, Dh]
    old_k, old_v = rng.normal(size=shape), rng.normal(size=shape)
    lengths = rng.integers(0, KV_POSITIONS - KV_WIDTH + 1, b)  # the caller's guarantee
    new_k = rng.normal(size=(KV_LAYERS, b, 1, KV_TOKENS, 2))
    new_v = rng.normal(size=(KV_LAYERS, b, 1, KV_TOKENS, 2))
    src = rng.integers(0, KV_TOKENS, (b, KV_WIDTH))
    count = rng.integers(0, KV_WIDTH + 1, b)
    layers = lambda x: tuple(jnp.asarray(x, jnp.float32))  # noqa: E731
    cache = kv_cache.KVCache(
        k=layers(old_k), v=layers(old_v), lengths=jnp.asarray(lengths, jnp.int32)
    )
    out = _commit(
        cache, layers(new_k), layers(new_v), jnp.asarray(src, jnp.int32), jnp.asarray(count)
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths + count)
    for got, old, new in ((out.k, old_k, new_k), (out.v, old_v, new_v)):
        got = np.stack([np.asarray(x) for x in got])  # [L, B, K, S, Dh]
        old, new = old.astype(np.float32), new.astype(np.float32)
        assert np.isfinite(got).all()
        for row in range(b):
            n0, c = int(lengths[row]), int(count[row])
            # committed history below the row's length, and everything past the commit's
            # fixed width, is untouched (other rows are checked by their own iteration)
            np.testing.assert_array_equal(got[:, row, :, :n0], old[:, row, :, :n0])
            np.testing.assert_array_equal(
                got[:, row, :, n0 + KV_WIDTH :], old[:, row, :, n0 + KV_WIDTH :]
            )
            # the accepted ones, in order, at the row's own length
            for j in range(c):
                np.testing.assert_array_equal(got[:, row, :, n0 + j], new[:, row, :, src[row, j]])
