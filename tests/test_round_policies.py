"""The engine's per-round rules, on the host: which row bucket a round runs at
(engine/row_buckets.py) and whether auto runs it with lookahead or plain steps
(engine/round_choice.py). Their device side is tests/test_engine.py's."""

import pytest

from lookahead_jax.engine import row_buckets
from lookahead_jax.engine.round_choice import FIRST_INTERVAL, MAX_INTERVAL, RoundChoice
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
    assert rule.rounds == {16: 7}
    # the other modes: always the batch, always the smallest
    assert RowBuckets(16, False).choose(1, compiled.__contains__, []) == 16
    assert RowBuckets(16, True).choose(3, compiled.__contains__, []) == 4
    assert RowBuckets(16, "auto").choose(3, lambda r: False, []) == 4  # nothing compiled
    with pytest.raises(ValueError, match="row_buckets"):
        RowBuckets(16, "yes")


def test_round_choice_runs_the_faster_mode_and_re_measures_the_other():
    rule = RoundChoice()
    assert rule.plain(16) is False  # lookahead first, then plain: both measured
    rule.ran(16, False, 1.0, 16 * 5, 16)  # lookahead: 5 tokens/s a row
    assert rule.plain(16) is True
    rule.ran(16, True, 1.0, 16 * 8, 16)  # plain: 8 tokens/s a row
    runs = []
    for _ in range(40):  # plain wins: lookahead again after 4 rounds, then 8, then 16
        plain = rule.plain(16)
        runs.append(plain)
        rule.ran(16, plain, 1.0, 16 * (8 if plain else 5), 16)
    lookahead_rounds = [i for i, plain in enumerate(runs) if not plain]
    assert lookahead_rounds == [FIRST_INTERVAL, 13, 30]  # 4 rounds, 8 more, 16 more
    assert rule.rounds[(16, "plain")] == 1 + 37
    # another bucket is judged on its own: 2 rows where lookahead wins
    assert rule.plain(2) is False
    rule.ran(2, False, 1.0, 2 * 30, 2)
    assert rule.plain(2) is True
    rule.ran(2, True, 1.0, 2 * 20, 2)
    for _ in range(FIRST_INTERVAL):  # lookahead wins there, plain re-measured after 4
        assert rule.plain(2) is False
        rule.ran(2, False, 1.0, 2 * 30, 2)
    assert rule.plain(2) is True
    described = rule.describe()
    assert described["2"]["lookahead"]["tokens_per_s_per_row"] == 30.0
    assert described["16"]["plain"]["rounds"] == 38
    assert MAX_INTERVAL >= 16


def test_round_choice_flips_back_when_acceptance_changes():
    rule = RoundChoice()
    rule.plain(4)
    rule.ran(4, False, 1.0, 4 * 10, 4)  # lookahead 10
    rule.plain(4)
    rule.ran(4, True, 1.0, 4 * 8, 4)  # plain 8: lookahead wins
    assert rule.plain(4) is False
    rule.ran(4, False, 1.0, 4 * 4, 4)  # the rows now accept little: 4 tokens/s
    # lookahead's average (10 -> 8.2) has fallen under plain's with the margin (8.24):
    # plain runs from the next round on, lookahead re-measured 4 rounds after the last
    # time the mode not chosen ran
    assert rule.rate[(4, "lookahead")] == pytest.approx(8.2)
    runs = []
    for _ in range(4):
        runs.append(rule.plain(4))
        rule.ran(4, runs[-1], 1.0, 4 * 8, 4)
    assert runs == [True, True, True, False]
