"""The engine's per-round rules, on the host: which row bucket a round runs at
(engine/row_buckets.py) and whether auto runs it with lookahead or plain steps
(engine/round_choice.py). Their device side is tests/test_engine.py's."""

from lookahead_jax.engine import row_buckets
from lookahead_jax.engine.round_choice import (
    FIRST_INTERVAL,
    MARGIN,
    WINDOW,
    RoundChoice,
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
    assert rule.rounds == {16: 7}
    # the other modes: always the batch, always the smallest
    assert RowBuckets(16, False).choose(1, compiled.__contains__, []) == 16
    assert RowBuckets(16, True).choose(3, compiled.__contains__, []) == 4
    assert RowBuckets(16, "auto").choose(3, lambda r: False, []) == 4  # nothing compiled


def measured(rule: RoundChoice, R: int, lookahead: float, plain: float) -> None:
    """The bucket's first rounds: two lookahead (the first is not measured: a program's
    first run), then two plain, at these rates (tokens/s per live row)."""
    for _ in range(2):
        assert rule.plain(R) is False
        rule.ran(R, False, 1.0, int(R * lookahead), R)
    for _ in range(2):
        assert rule.plain(R) is True
        rule.ran(R, True, 1.0, int(R * plain), R)


def test_round_choice_runs_the_faster_mode_and_re_measures_the_other():
    rule = RoundChoice()
    measured(rule, 16, lookahead=5, plain=8)
    runs = []
    for _ in range(60):  # plain wins: lookahead again after 4 rounds, then 8, 16, 32
        plain = rule.plain(16)
        runs.append(plain)
        rule.ran(16, plain, 1.0, 16 * (8 if plain else 5), 16)
    lookahead_rounds = [i for i, plain in enumerate(runs) if not plain]
    assert lookahead_rounds == [FIRST_INTERVAL, 13, 30]  # 4 rounds, 8 more, 16 more
    assert rule.rounds[(16, "plain")] == 2 + 57
    # another bucket is judged on its own: 2 rows where lookahead wins
    measured(rule, 2, lookahead=30, plain=20)
    for _ in range(FIRST_INTERVAL):  # lookahead wins there, plain re-measured after 4
        assert rule.plain(2) is False
        rule.ran(2, False, 1.0, 2 * 30, 2)
    assert rule.plain(2) is True
    described = rule.describe()
    assert described["2"]["lookahead"]["tokens_per_s_per_row"] == 30.0
    assert described["16"]["plain"]["rounds"] == 59


def test_round_choice_flips_when_the_rows_accept_less():
    """The rate is the last WINDOW rounds' tokens over their row-seconds: as the rows
    live accept less, lookahead's rate falls under plain's and plain runs."""
    rule = RoundChoice()
    measured(rule, 4, lookahead=10, plain=8)
    rates = []
    for _ in range(WINDOW):  # lookahead runs; the rows now accept little: 4 tokens/s
        assert rule.plain(4) is False
        rule.ran(4, False, 1.0, 4 * 4, 4)
        rates.append(rule.rate[(4, "lookahead")])
        if rates[-1] * MARGIN < 8:
            break
    assert rates == [7.0]  # (10 + 4) / 2: under plain's 8 at once
    runs = []
    for _ in range(4):
        runs.append(rule.plain(4))
        rule.ran(4, runs[-1], 1.0, 4 * 8, 4)
    assert runs == [True, True, True, False]  # lookahead re-measured 4 rounds after it last ran
