"""The engine's per-round rules, on the host: which row bucket a round runs at
(engine/row_buckets.py) and whether auto runs it with lookahead or plain steps
(engine/round_choice.py). Their device side is tests/test_engine.py's."""

import collections
import itertools

import pytest

from lookahead_jax.engine import row_buckets
from lookahead_jax.engine.round_choice import (
    HOPELESS_AFTER,
    HOPELESS_INTERVAL,
    STAY,
    WINDOW,
    RoundChoice,
    RowAcceptance,
    RowRound,
)
from lookahead_jax.engine.row_buckets import RowBuckets


def test_buckets_are_powers_of_two_below_the_batch_then_the_batch():
    assert row_buckets.buckets(1) == [1]
    assert row_buckets.buckets(3) == [1, 2, 3]
    assert row_buckets.buckets(8) == [1, 2, 4, 8]
    assert row_buckets.buckets(12) == [1, 2, 4, 8, 12]
    assert [row_buckets.smallest(12, n) for n in (1, 3, 5, 9, 12)] == [1, 4, 8, 12, 12]


def test_row_buckets_worked_example():
    """The module docstring's example: B = 16, loops compile in 4 s, 16 is compiled; 3
    rows left, rounds of 0.8 s: the 7th round at 16 tips bucket 4 over its compile."""
    rule = RowBuckets(16, "auto")
    compiled = {16}
    choose = lambda n: rule.choose(n, compiled.__contains__, [4.0])  # noqa: E731
    for _ in range(6):
        assert choose(3) == 16
        rule.ran(3, 16, 0.8)  # 0.6 s of padding spent on bucket 4 a round
    assert choose(3) == 16  # 3.6 s spent: not yet
    rule.ran(3, 16, 0.8)
    assert choose(3) == 4  # 4.2 s > 4 s: compile 4 and run there
    compiled.add(4)
    assert choose(1) == 4  # the smallest compiled bucket that holds it
    # the other modes: always the batch, always the smallest
    assert RowBuckets(16, False).choose(1, compiled.__contains__, []) == 16
    assert RowBuckets(16, True).choose(3, compiled.__contains__, []) == 4
    assert RowBuckets(16, "auto").choose(3, lambda r: False, []) == 4  # nothing compiled


def run(
    rule: RoundChoice,
    R: int,
    step_ms: dict,
    rows: list[RowRound],
    accept: list[float],
    steps: int = 4,
) -> tuple[bool, bool]:
    """One round as the scheduler runs it: choose, then `ran` with each row emitting
    accept[i] tokens a lookahead step (one a plain step) at these step costs (ms)."""
    plain, probe = rule.choose(R, rows)
    n = 1 if probe else steps
    for r, a in zip(rows, accept, strict=True):
        r.tokens, r.steps = (n if plain else round(a * n)), n
    rule.ran(R, plain, n * step_ms["plain" if plain else "lookahead"] / 1e3, rows, probe)
    return plain, probe


def fresh(n: int, greedy: bool = True) -> list[RowRound]:
    return [RowRound(greedy, RowAcceptance()) for _ in range(n)]


def test_round_choice_probes_a_new_bucket_then_measures_plain():
    """A new R: three one-step lookahead probes (the first untimed; their acceptance not
    counted), then two plain rounds (the first untimed); then the rows' acceptance over the
    costs decides: here the prior's, no lookahead round having run."""
    rule = RoundChoice(prior=2.0)
    cost, rows = {"plain": 30.0, "lookahead": 36.0}, fresh(1)
    seen = [run(rule, 1, cost, rows, [2.0]) for _ in range(5)]
    assert seen == [(False, True)] * 3 + [(True, False)] * 2
    assert rule.step_s(1, "lookahead") == 0.036 and rule.step_s(1, "plain") == 0.030
    assert rows[0].acceptance.estimate is None and not rule._best  # probes: cost only
    assert run(rule, 1, cost, rows, [2.0]) == (False, False)  # 2 / 36 > 1.03 / 30
    assert rows[0].acceptance.estimate == 2.0


def test_round_choice_worked_example():
    """The module docstring's: at R = 16 lookahead is hopeless (11x a plain step, the best
    row accepted 2.25): plain, and a one-step probe every HOPELESS_INTERVAL rounds; at
    R = 1 a new greedy row counts as recent greedy rows (2.25 tokens a step), runs
    lookahead, then plain once its own rounds of 1 token a step have drawn its figure
    under the break-even by STAY (calibrated: R = 1's rounds emitted less than
    predicted), lookahead again after 4."""
    rule = RoundChoice(prior=2.0)
    small, big = {"plain": 30.0, "lookahead": 36.0}, {"plain": 70.0, "lookahead": 780.0}
    earlier = fresh(1)
    while rule.rounds.get((1, "lookahead"), 0) < 3 + WINDOW:  # a greedy row at R = 1
        run(rule, 1, small, earlier, [3.25 if rule.rounds.get((1, "lookahead"), 0) < 3 else 2.25])
    rows = fresh(16, greedy=False)
    runs = [run(rule, 16, big, rows, [1.3] * 16) for _ in range(7 + 2 * HOPELESS_INTERVAL)]
    assert runs[:5] == [(False, True)] * 3 + [(True, False)] * 2
    assert rule.hopeless(16)
    probes = [i for i, (plain, probe) in enumerate(runs) if not plain]
    assert probes[3:] == [5 + HOPELESS_INTERVAL, 6 + 2 * HOPELESS_INTERVAL]
    assert all(probe for plain, probe in runs if not plain)  # one step each
    assert rule.kind_acceptance(True) == pytest.approx(2.25, abs=0.01)  # (not the probes')
    row = fresh(1)  # a new greedy row at R = 1: lookahead on its kind's figure
    modes = [run(rule, 1, small, row, [1.0])[0]]
    assert modes[0] is False  # its figure falls from its kind's 2.25 ...
    calibrated = rule.calibration(1) * rule.row_acceptance(row[0])
    assert calibrated == pytest.approx(1.16, abs=0.01)  # ... under the break-even,
    assert 1.03 / STAY * 36 / 30 < calibrated < 1.03 * 36 / 30  # but within STAY of it:
    modes += [run(rule, 1, small, row, [1.0])[0]]  # lookahead again
    calibrated = rule.calibration(1) * rule.row_acceptance(row[0])
    assert calibrated == pytest.approx(1.075, abs=0.01) and calibrated < 1.03 / STAY * 36 / 30
    modes += [run(rule, 1, small, row, [1.0])[0] for _ in range(8)]
    # plain, lookahead re-measured after 4 rounds
    assert modes[:7] == [False, False] + [True] * 4 + [False], modes
    described = rule.describe()
    assert described["16"]["lookahead"]["hopeless"] is True
    assert described["16"]["plain"]["step_ms"] == 70.0
    assert described["1"]["lookahead"]["tokens_per_s_per_row"] > 0


def test_probes_that_accept_nothing_do_not_make_lookahead_hopeless():
    """A request's first steps accept little (its guess pools start empty): one-step
    probes that accept nothing leave the rows' figures, and lookahead runs on the prior
    and is judged by its real rounds (they made it hopeless at R = 1 before)."""
    rule = RoundChoice(prior=2.0)
    cost, rows = {"plain": 21.5, "lookahead": 35.9}, fresh(1)
    assert [run(rule, 1, cost, rows, [1.0]) for _ in range(5)] == (
        [(False, True)] * 3 + [(True, False)] * 2  # probes, then plain
    )
    assert not rule.hopeless(1)
    assert run(rule, 1, cost, rows, [2.0]) == (False, False)  # lookahead, a real round


def test_a_hopeless_spell_ends_when_rows_start_accepting():
    """Where a lookahead step costs PROBE_RATIO times a plain one or more (2.2x here),
    lookahead becomes hopeless after HOPELESS_AFTER measured rounds of rows that accept
    nothing (its re-measures: one-step probes), not before; its re-probes count what rows
    accept, so rows that accept well later end the spell (an opening probe measures cost
    only, a re-probe both)."""
    rule = RoundChoice(prior=2.0)
    cost, prose = {"plain": 30.0, "lookahead": 66.0}, fresh(1)
    measured = -3  # (the opening probes)
    while not rule.hopeless(1):
        plain, probe = run(rule, 1, cost, prose, [1.0])
        measured += not plain
    assert measured == HOPELESS_AFTER  # its own rounds, not the opening probes, decided it
    code = fresh(1)
    runs = [run(rule, 1, cost, code, [4.0]) for _ in range(HOPELESS_INTERVAL + 20)]
    assert not rule.hopeless(1)
    assert sum(not plain and not probe for plain, probe in runs) > 0  # real rounds again


def test_a_cheap_lookahead_step_is_never_hopeless():
    """Below PROBE_RATIO (a lookahead step 1.17x a plain one) rows that accept nothing in
    their lookahead rounds do not shut it out: at a server's start, a request's first
    rounds (its guess pools empty) made it hopeless at one row, and plain ran on."""
    rule = RoundChoice(prior=2.0)
    cost, rows = {"plain": 18.0, "lookahead": 21.0}, fresh(1)
    for _ in range(200):
        run(rule, 1, cost, rows, [1.0])
        assert not rule.hopeless(1)
        if len(rule._best) > HOPELESS_AFTER:
            break
    assert rule.cost_ratio(1) > max(rule._best)  # what made it hopeless before
    assert len(rule._best) > HOPELESS_AFTER


def test_once_lookahead_runs_plain_takes_over_only_by_stay_more():
    """The same rows and costs (a lookahead step 1.17x a plain one: break-even at 1.03 x
    1.17 = 1.2 tokens a step): rows expected at 1.15 run plain where they chose plain,
    and lookahead where they chose lookahead, also after a round that explored plain
    steps (lookahead's guess sources learn in its own steps only); at 1.05, under
    1.03 / STAY x 1.17 = 1.095, plain either way."""
    for prior, after_lookahead in ((1.15, True), (1.05, False)):
        rule = RoundChoice(prior=prior)
        cost, rows = {"plain": 18.0, "lookahead": 21.0}, fresh(1)
        assert [run(rule, 1, cost, rows, [prior])[0] for _ in range(5)] == [False] * 3 + [True] * 2
        assert rule.choose(1, rows) == (True, False)  # after plain rounds: plain
        # as after a round where the rows chose lookahead, and one where they did but it
        # explored plain steps (the rows' choice holds through it)
        for last in ((False, False), (False, True)):
            rule._last[1] = last
            assert rule.choose(1, rows)[0] is not after_lookahead, (prior, last)
    assert 1.03 / STAY * 21 / 18 < 1.15 < 1.03 * 21 / 18


def test_round_choice_sums_each_rows_own_acceptance():
    """Rows of different kinds share a round: a sampled row counts as sampled rows did,
    a greedy one that repeats its prompt as itself; lookahead runs when their sum pays."""
    rule = RoundChoice(prior=1.5)
    cost = {"plain": 40.0, "lookahead": 90.0}  # 2.25x
    greedy, sampled = fresh(1), fresh(1, greedy=False)
    rows = [greedy[0], sampled[0]]
    while rule.rounds.get((2, "lookahead"), 0) < 3 + WINDOW:  # (one-step probes first)
        run(rule, 2, cost, rows, [4.0, 1.25])
    assert rule.kind_acceptance(False) == pytest.approx(1.25, abs=0.01)
    assert run(rule, 2, cost, rows, [4.0, 1.25])[0] is False  # 5.25 / 90 > 2.06 / 40
    newcomer = fresh(1, greedy=False)  # the greedy row left, a sampled one came
    assert run(rule, 2, cost, [sampled[0], newcomer[0]], [1.25, 1.25])[0] is True  # 2.5 / 90


def test_a_kinds_figure_weighs_each_row_once():
    """A row that accepts well runs lookahead for many rounds, one that does not for few:
    a new row of their kind starts from the mean of the two rows' figures, not from their
    rounds' (which the first would fill)."""
    rule = RoundChoice(prior=2.0)
    good, poor = RowAcceptance(), RowAcceptance()
    for _ in range(2):
        rule.ran(1, False, 0.1, [RowRound(True, poor, tokens=4, steps=4)])
    for _ in range(20):
        rule.ran(1, False, 0.1, [RowRound(True, good, tokens=12, steps=4)])
    assert rule.kind_acceptance(True) == pytest.approx((1.0 + 3.0) / 2)
    assert rule.kind_acceptance(False) == 2.0  # no sampled row yet: the prior


def test_a_buckets_calibration_scales_what_its_rows_figures_predict():
    """The module docstring's calibrated example: at R = 16 (break-even 3.38 tokens a
    step) rows whose records say 3.5 run lookahead and emit 2.75 a step; their own
    figures barely move (3.46), but the bucket's calibration falls to 0.83, and plain
    runs. Another bucket keeps its own (1.0)."""
    rule = RoundChoice(prior=3.5)
    cost = {"plain": 70.0, "lookahead": 230.0}
    for key, step_s in (("lookahead", 0.23), ("plain", 0.07)):  # both measured already
        rule.rounds[(16, key)] = 3
        rule._timed[(16, key)] = collections.deque([(4 * step_s, 4, 0, 0)] * 2)
    rows = [RowRound(True, RowAcceptance()) for _ in range(16)]
    for r in rows:  # a long record of 3.5 a step (no decay left to speak of)
        r.acceptance.tokens, r.acceptance.steps = 350.0, 100.0
    assert rule.calibration(16) == 1.0
    assert run(rule, 16, cost, rows, [2.75] * 16) == (False, False)  # 16 * 3.5 / 230 ms wins
    assert rule.row_acceptance(rows[0]) == pytest.approx(3.46, abs=0.01)
    assert rule.calibration(16) == pytest.approx((176 + 64) / (224 + 64))  # 0.83
    assert run(rule, 16, cost, rows, [2.75] * 16)[0] is True  # 0.83 * 3.46 < 3.38: plain
    assert rule.calibration(1) == 1.0
    assert rule.describe()["16"]["lookahead"]["calibration"] == 0.833


def test_lookahead_is_re_measured_at_a_share_of_the_time_where_plain_is_chosen():
    """Where plain wins at a bucket whose lookahead step is dear (2.7x), lookahead is
    re-measured by a one-step probe no sooner than every (2.7 - 1) / EXPLORE_SHARE = 34
    rounds, not every 4-32 (one row that repeats its prompt, 12 tokens a step, keeps it
    from being hopeless; the other fifteen accept nothing. One accepting 4 would not:
    after one-step re-measures a row's figure leans on its kind's, 2.59 there, under
    the 2.7x step, and the bucket turns hopeless, re-probed every HOPELESS_INTERVAL)."""
    rule = RoundChoice(prior=1.0)
    cost, rows = {"plain": 60.0, "lookahead": 162.0}, fresh(16)
    runs = [run(rule, 16, cost, rows, [12.0] + [1.0] * 15) for _ in range(200)]
    assert not rule.hopeless(16)
    explored = [i for i, (plain, _) in enumerate(runs) if not plain][3:]  # (past the probes)
    gaps = [b - a for a, b in itertools.pairwise(explored)]
    assert len(gaps) >= 3 and all(34 <= g <= 36 for g in gaps), explored
    assert all(runs[i][1] for i in explored)  # one step each
