"""The guess sources against pure-Python references (hypothesis): the suffix matcher
(suffix_match.py) and token recycling's template, tables and expansion
(token_recycling.py); the acceptance record that weighs them per row
(acceptance_record.py)."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lookahead_jax as lj
from lookahead_jax.guesses import acceptance_record, draft_tree, suffix_match, token_recycling
from lookahead_jax.guesses.draft_tree import ROOT

SETTINGS = settings(deadline=None, max_examples=40, database=None)

# ------------------------------------------------------------------ suffix match


def brute_force_matches(text: list[int], key_max: int):
    """[(match length, position)] of every earlier position j < len-1 with a match,
    longest first, then most recent."""
    end = len(text)
    out = []
    for j in range(end - 1):
        length = 0
        while length < key_max and j - length >= 0 and text[j - length] == text[end - 1 - length]:
            length += 1
        if length:
            out.append((length, j))
    return sorted(out, key=lambda x: (-x[0], -x[1]))


_propose = jax.jit(suffix_match.propose, static_argnames=("key_max", "span", "count"))


@SETTINGS
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=3),
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(1, 4),
)
def test_suffix_match_proposes_the_longest_most_recent_continuations(texts, key_max, span, count):
    S = 24  # buffer slots; garbage past each row's end must never be read
    rng = np.random.default_rng(len(texts))
    buf = rng.integers(0, 4, (len(texts), S)).astype(np.int32)
    for row, t in enumerate(texts):
        buf[row, : len(t)] = t
    end = np.asarray([len(t) for t in texts], np.int32)
    cont, length, key = (
        np.asarray(x)
        for x in _propose(
            jnp.asarray(buf), jnp.asarray(end), key_max=key_max, span=span, count=count
        )
    )
    for row, text in enumerate(texts):
        want = brute_force_matches(text, key_max)[:count]
        for c in range(count):
            if c >= len(want):
                assert length[row, c] == 0
                continue
            k, j = want[c]
            assert key[row, c] == k
            expected = text[j + 1 : j + 1 + span]  # only known tokens
            assert length[row, c] == len(expected)
            assert cont[row, c, : len(expected)].tolist() == expected


# ------------------------------------------------------------------ token recycling


@SETTINGS
@given(
    st.integers(1, 40),
    st.lists(st.floats(0.01, 0.99), min_size=1, max_size=6),
    st.integers(1, 6),
)
def test_template_is_the_best_first_tree(nodes, rates, max_depth):
    rates = tuple(sorted(rates, reverse=True))
    t = token_recycling.template(nodes, rates, max_depth)
    depths = t.depths
    for i, (par, rank) in enumerate(zip(t.parents, t.ranks, strict=True)):
        assert par == ROOT or 0 <= par < i  # parents first
        parent_score = 1.0 if par == ROOT else t.scores[par]
        assert np.isclose(t.scores[i], parent_score * rates[rank])
        assert depths[i] <= max_depth
        if rank > 0:  # a rank-r child comes after its rank r-1 sibling
            siblings = [j for j in range(i) if t.parents[j] == par and t.ranks[j] == rank - 1]
            assert len(siblings) == 1
    # best-first: every node not taken scores no better than the worst node taken
    taken = set(zip(t.parents, t.ranks, strict=True))
    frontier = []
    for p in [ROOT, *range(t.size)]:
        base = 1.0 if p == ROOT else t.scores[p]
        depth = 0 if p == ROOT else depths[p]
        for r in range(len(rates)):
            if (p, r) not in taken and depth < max_depth:
                frontier.append(base * rates[r])
                break
    if t.size == nodes and frontier:
        assert max(frontier) <= min(t.scores) + 1e-12


VOCAB = 6


def test_tables_keep_the_highest_priority_writer_and_candidates_merge_both():
    table = token_recycling.init_table(1, VOCAB, 2)
    logits = np.full((1, 3, VOCAB), -5.0, np.float32)
    logits[0, 0, [1, 2]] = [3.0, 1.0]  # row 0 (token 4 after 0): 1 (p 0.88), then 2
    logits[0, 1, [3, 5]] = [3.5, 1.0]  # row 1 (token 4 after 1): 3 (p 0.92), then 5
    logits[0, 2, [0, 2]] = [2.0, 3.0]  # row 2 (token 5 after 4): 2, then 0
    prev = jnp.asarray([[0, 1, 4]], jnp.int32)
    toks = jnp.asarray([[4, 4, 5]], jnp.int32)
    prio = jnp.asarray([[1, 9, 5]], jnp.int32)  # row 1 outranks row 0 for token 4
    table = token_recycling.update(
        table, prev, toks, jnp.asarray(logits), prio, jnp.ones((1, 3), bool)
    )
    by_token = np.asarray(table.by_token)[0]
    assert by_token[4].tolist() == [3, 5] and by_token[5].tolist() == [2, 0]
    assert np.isclose(np.asarray(table.token_probs)[0, 5].sum(), 0.88 + 0.12, atol=0.01)
    assert (by_token[[0, 1, 2, 3]] == token_recycling.EMPTY).all()
    # context (0, 4) was written by row 0: its pair entry and the token entry's tokens
    # it does not hold, by recorded probability
    cands, probs = token_recycling.candidates(
        table, jnp.asarray([[0, 3, 1]]), jnp.asarray([[4, 4, 4]])
    )
    cands, probs = np.asarray(cands)[0], np.asarray(probs)[0]
    assert cands[0].tolist() == [3, 1, 2, 5]
    assert (np.diff(probs[0]) <= 0).all() and 0.9 < probs[0, 0] < 1
    assert cands[1].tolist() == [3, 5, -1, -1]  # (3, 4) never seen: token entry only
    assert cands[2].tolist() == [3, 5, -1, -1]  # (1, 4): the pair's tokens, deduplicated


def test_seed_takes_each_tokens_last_follower_and_expand_follows_the_template():
    table = token_recycling.init_table(1, VOCAB, 2)
    text = jnp.asarray([[1, 2, 1, 3, 2, 9, 9]], jnp.int32)  # 9 9: garbage past the end
    table = token_recycling.seed_from_text(table, text, jnp.asarray([5], jnp.int32))
    by_token = np.asarray(table.by_token)[0]
    assert by_token[1, 0] == 3 and by_token[2, 0] == 1 and by_token[3, 0] == 2
    assert by_token[0, 0] == token_recycling.EMPTY  # never seen; 2's last has no follower seen
    t = token_recycling.Template(
        parents=(ROOT, 0, ROOT, 1), ranks=(0, 0, 1, 0), scores=(0.5, 0.2, 0.1, 0.05)
    )
    prop = token_recycling.expand(table, jnp.asarray([0]), jnp.asarray([1]), t, source=2)
    # root 1 -> 3 -> 2 -> 1; root's rank 1: nothing recorded
    assert np.asarray(prop.tokens)[0, [0, 1, 3]].tolist() == [3, 2, 1]
    assert np.asarray(prop.valid)[0].tolist() == [True, True, False, True]
    assert np.asarray(prop.depth)[0].tolist() == [1, 2, 1, 3]


# ------------------------------------------------------------------ acceptance record


def test_record_counts_offered_scores_and_right_slots_by_source_and_depth():
    """The docstring's example, with a second source and a second row."""
    assert (acceptance_record.DECAY, acceptance_record.PRIOR_TOKENS) == (0.9, 0.5)
    # row 0: slots 0, 1 recycling (source 2) at depth 1, slot 2 suffix (1) at depth 2
    # under slot 0; row 1: the same slots, decoding finished (its record must not move)
    b = lambda x: jnp.asarray([x, x])  # noqa: E731
    tree = draft_tree.DraftTree(
        tokens=b([5, 6, 7, 0]),
        parent=b([ROOT, ROOT, 0, ROOT]),
        depth=b([1, 1, 2, 1]),
        valid=b([True, True, True, False]),
        source=b([2, 2, 1, -1]),
        score=b([0.45, 0.15, 0.3, 0.0]),
        ancestors=jnp.zeros((2, 4, 4), bool),  # not read
    )
    record = acceptance_record.init(2, 4, 3)
    assert np.allclose(acceptance_record.weights(record), 1.0)
    active = jnp.asarray([True, False])

    def step(record, right):
        acc = draft_tree.Acceptance(
            accepted=None, path=None, emitted=None, source=None, right=b(right)
        )
        return acceptance_record.update(record, tree, acc, active)

    # slot 0 then slot 2 right: recycling at depth 1, suffix at depth 2 (the padding slot's
    # `right` is ignored: it is not valid)
    record = step(record, [True, False, True, True])
    expected, accepted = np.asarray(record.expected), np.asarray(record.accepted)
    assert np.allclose(expected[0, 2], [0.6, 0, 0]) and np.allclose(expected[0, 1], [0, 0.3, 0])
    assert np.allclose(accepted[0, 2], [1, 0, 0]) and np.allclose(accepted[0, 1], [0, 1, 0])
    assert expected[0, [0, 3]].sum() == 0 and accepted[0, [0, 3]].sum() == 0
    assert np.asarray(record.expected)[1].sum() == 0  # an inactive row keeps its record
    assert np.isclose(acceptance_record.weights(record)[0, 2, 0], 1.5 / 1.1)
    record = step(record, [False, False, False, False])  # nothing right
    w = np.asarray(acceptance_record.weights(record))
    assert np.isclose(w[0, 2, 0], 1.4 / 1.64) and np.isclose(w[0, 1, 1], 1.4 / 1.07)
    assert np.allclose(w[0, [0, 3]], 1.0) and np.allclose(w[1], 1.0)


def test_under_sampling_expand_takes_the_noise_winner_scored_by_its_softmax_share():
    """A node's candidates ranked by log(p)/temperature + noise; its score is the winner's
    share of the softmax of those keys."""
    table = token_recycling.init_table(1, VOCAB, 2)
    logits = np.full((1, 1, VOCAB), -30.0, np.float32)
    logits[0, 0, [1, 2]] = [np.log(0.75), np.log(0.25)]  # after token 4: 1 (0.75), 2 (0.25)
    table = token_recycling.update(
        table,
        jnp.asarray([[0]]),
        jnp.asarray([[4]]),
        jnp.asarray(logits),
        jnp.asarray([[1]]),
        jnp.ones((1, 1), bool),
    )
    t = token_recycling.Template(parents=(ROOT, ROOT), ranks=(0, 1), scores=(0.5, 0.2))
    root, prev = jnp.asarray([4]), jnp.asarray([9 % VOCAB])
    greedy = token_recycling.expand(table, prev, root, t, source=2)
    assert np.asarray(greedy.tokens)[0].tolist() == [1, 2]
    assert np.allclose(np.asarray(greedy.score)[0], [0.75, 0.25], atol=1e-4)
    gumbel = np.zeros((1, 1, VOCAB), np.float32)
    gumbel[0, 0, 2] = 3.0  # token 2's noise: log(.25) + 3 beats log(.75) at temperature 1
    sampled = token_recycling.expand(
        table,
        prev,
        root,
        t,
        source=2,
        noise=(jnp.ones((1,)), jnp.asarray(gumbel), jnp.ones((1,), bool)),  # fmt: skip
    )
    assert np.asarray(sampled.tokens)[0].tolist() == [2, 1]
    keys = np.log([0.25, 0.75]) + [3.0, 0.0]
    share = np.exp(keys) / np.exp(keys).sum()
    assert np.allclose(np.asarray(sampled.score)[0], share, atol=1e-4)


def test_extra_sources_are_checked_when_the_config_is_made():
    from lookahead_jax.guesses.suffix_match import SuffixSource

    LA = lj.LookaheadConfig
    with pytest.raises(lj.UserInputError, match="not a guess source"):
        LA(2, 0, 0, extra_sources=("repeat",))
    with pytest.raises(lj.UserInputError, match="distinct names"):
        LA(2, 0, 0, suffix=1, extra_sources=(SuffixSource(1),))
    with pytest.raises(lj.UserInputError, match="must be a tuple"):
        LA(2, 0, 0, extra_sources=[SuffixSource(1, name="s2")])

    @dataclasses.dataclass  # not frozen: unhashable, so it cannot sit in a static jit argument
    class Mutable:
        name: str = "m"
        nodes: int = 1
        depth: int = 1
        init = propose = feed = SuffixSource.init

    with pytest.raises(lj.UserInputError, match="hashable"):
        LA(2, 0, 0, extra_sources=(Mutable(),))
    config = LA(2, 0, 0, recycle=4, extra_sources=(SuffixSource(2, 3, name="s2"),))
    assert config.source_names == ("recycle", "s2", "window")
    assert config.proposed_nodes == 4 + 2 * 3
    assert config.tree_depth == max(3, config.sources[0].depth)
    assert config.name == "n=2,w=0,g=0,recycle=4+s2"
    assert config.describe()["sources"]["s2"] == {"nodes": 6, "depth": 3}


def test_the_step_never_verifies_a_node_that_breaks_the_proposal_rules():
    """decoding.lookahead.well_formed: a parent after its child, a depth that is not the
    parent's + 1, or a node deeper than the source declares are marked invalid."""
    from lookahead_jax.decoding.lookahead import well_formed

    # nodes: 0 root child (ok), 1 child of 0 (ok), 2 parent 3 comes later (bad),
    # 3 depth 3 under node 0 (bad: 2 expected), 4 child of 1 at depth 3 (ok, but deeper
    # than max_depth 2), 5 root child marked invalid by the source itself
    p = draft_tree.Proposals(
        tokens=jnp.zeros((1, 6), jnp.int32),
        parent=jnp.asarray([[ROOT, 0, 3, 0, 1, ROOT]], jnp.int32),
        depth=jnp.asarray([[1, 2, 2, 3, 3, 1]], jnp.int32),
        score=jnp.ones((1, 6), jnp.float32),
        valid=jnp.asarray([[True] * 5 + [False]]),
        source=jnp.zeros((1, 6), jnp.int32),
    )
    assert well_formed(p, 2).tolist() == [[True, True, False, False, False, False]]
    assert well_formed(p, 3).tolist() == [[True, True, False, False, True, False]]


@dataclasses.dataclass(frozen=True)
class Witness:
    """A source that proposes nothing valid and keeps, per row, what `init` and `feed` were
    told: the row keys, steps whose first emitted token is `chosen` after the input, and
    steps by `accepted_source`."""

    sources: int  # J, with the witness itself
    name: str = "witness"
    nodes: int = 1
    depth: int = 1

    def init(self, prompt):
        B = prompt.tokens.shape[0]
        return prompt.keys, jnp.zeros((B,), jnp.int32), jnp.zeros((B, self.sources), jnp.int32)

    def propose(self, state, text):
        B = text.tokens.shape[0]
        one = jnp.zeros((B, 1, 1), jnp.int32)
        return lj.guesses.chains(one, jnp.zeros((B, 1), jnp.int32), jnp.ones((B, 1, 1)))

    def feed(self, state, step):
        keys, chosen_ok, by_source = state
        first = jnp.take_along_axis(step.tokens, step.start[:, None], axis=1)[:, 0]
        chosen_ok += step.active & (step.chosen[:, 0] == first)  # row 0: after the input
        counted = step.active & (step.accepted_source >= 0)
        hot = jax.nn.one_hot(step.accepted_source, self.sources, dtype=jnp.int32)
        return keys, chosen_ok, by_source + hot * counted[:, None]


def test_feed_gets_the_chosen_tokens_and_the_accepted_source_and_init_the_row_keys(tiny_ckpts):
    from lookahead_jax.decoding import DecodeSpec, RowSampling, row_keys
    from lookahead_jax.decoding.loop import start, step
    from lookahead_jax.decoding.sampling import SamplingConfig

    model = lj.load(tiny_ckpts["gqa"][1])
    base = lj.LookaheadConfig.for_tokens(16)
    la = dataclasses.replace(base, extra_sources=(Witness(len(base.source_names) + 1),))
    spec = DecodeSpec(lm=model.lm, eos_ids=(), lookahead=la)
    prompts = np.asarray([[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9, 8, 9, 8]], np.int32)
    B = len(prompts)
    state = jax.jit(functools.partial(start, spec=spec, new_positions=16))(
        model.params, prompts, np.full(B, 8, np.int32), np.full(B, 16, np.int32),
        row_keys(3, B), RowSampling.of([SamplingConfig()] * B),
    )  # fmt: skip
    step_fn = jax.jit(functools.partial(step, spec=spec))
    while not bool(state.done.all()):
        state = step_fn(model.params, state)
    keys, chosen_ok, by_source = state.draft.sources[-1]
    np.testing.assert_array_equal(keys, row_keys(3, B))
    np.testing.assert_array_equal(chosen_ok, state.steps)  # every step of every row
    np.testing.assert_array_equal(by_source, state.draft.paths_by_source)
    assert int(by_source.sum()) > 0  # some paths were accepted: the check is not vacuous
    witness = la.source_names.index("witness")
    assert int(by_source[:, witness].sum()) == 0  # and none from the witness's invalid node
    # proposed: the witness never (its node is invalid), the others at least their paths
    nodes = np.asarray(state.draft.nodes_by_source)
    assert int(nodes[:, witness].sum()) == 0
    assert (nodes.sum(0) >= np.asarray(by_source).sum(0)).all() and nodes.sum() > 0


def test_a_built_in_source_is_removed_with_its_file_and_its_registry_line(tmp_path):
    """guesses/built_in.py: deleting token_recycling.py and its line there leaves a package
    that imports, whose measured layouts keep their other sources, and that refuses the
    removed source's knobs as unknown."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    package = Path(lj.__file__).parent
    copy = tmp_path / "lookahead_jax"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (copy / "guesses" / "token_recycling.py").unlink()
    registry = copy / "guesses" / "built_in.py"
    kept = [line for line in registry.read_text().splitlines() if "RecyclingSettings" not in line]
    registry.write_text("\n".join(kept) + "\n")
    check = """
import lookahead_jax as lj
from lookahead_jax.guesses.lookahead_config import LAYOUTS
la = lj.LookaheadConfig.for_tokens(16)
assert la.source_names == ("pool", "suffix", "window"), la.source_names
assert all(c.tokens_per_step <= t and c.sources for t, c in LAYOUTS.items())
try:
    lj.LookaheadConfig.parse("n=2,w=0,g=0,recycle=4")
except lj.UserInputError as e:
    assert "unknown field 'recycle'" in str(e), e
else:
    raise AssertionError("recycle= accepted")
"""
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = [sys.executable, "-c", check]
    done = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
