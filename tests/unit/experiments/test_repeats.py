"""Repeats in alternating order, grouped into stints (`experiments.repeats`)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.errors import InputError
from kvlab.experiments.repeats import Sequential, Stint, one_side, order, stints


def test_two_sides_alternate_a_b_b_a() -> None:
    assert order(3) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]


def test_three_sides_run_forward_then_back() -> None:
    assert [side for side, _ in order(2, sides=3)] == [0, 1, 2, 2, 1, 0]


def test_consecutive_runs_of_a_side_share_one_session() -> None:
    assert stints(3) == [Stint(0, (0,), True), Stint(1, (0, 1), True),
                           Stint(0, (1, 2), False), Stint(1, (2,), False)]


def test_without_repeat_each_side_runs_once_unnumbered() -> None:
    assert stints(1) == [Stint(0, (None,), True), Stint(1, (None,), True)]
    assert one_side(1) == (None,) and one_side(3) == (0, 1, 2)


@pytest.mark.parametrize("count", [0, -2])
def test_no_repeats_is_refused(count: int) -> None:
    with pytest.raises(InputError, match="--repeat"):
        order(count)
    with pytest.raises(InputError, match="--repeat"):
        one_side(count)


@given(st.integers(1, 12), st.integers(1, 4))
def test_every_side_runs_every_repeat_once_and_drift_is_balanced(count: int,
                                                                 sides: int) -> None:
    runs = order(count, sides)
    assert sorted(runs) == sorted((s, r) for s in range(sides) for r in range(count))
    grouped = stints(count, sides)
    assert [(g.side, r) for g in grouped for r in g.repeats] == [
        (s, r if count > 1 else None) for s, r in runs]
    assert all(a.side != b.side for a, b in itertools.pairwise(grouped))
    assert [g.first for g in grouped] == [
        g.side not in {h.side for h in grouped[:i]} for i, g in enumerate(grouped)]
    if count % 2 == 0:  # over a whole number of A B B A cycles, no side sits earlier
        positions = [[i for i, (s, _) in enumerate(runs) if s == side] for side in range(sides)]
        assert len({sum(p) for p in positions}) == 1



def test_a_sequential_run_stops_when_its_interval_settles_or_at_its_cap() -> None:
    rule = Sequential(cap=5)
    assert rule.looks == 4 and rule.confidence == pytest.approx(0.9875)
    assert rule.verdict(1, 0.5, 0.6) is None  # one round: no between-repeat interval yet
    assert rule.verdict(2, 0.5, 0.6) == "the interval excluded 1 after 2 rounds"
    assert rule.verdict(3, 0.95, 1.1) == "the interval was narrower than 1.2x after 3 rounds"
    assert rule.verdict(4, 0.7, 1.4) is None  # spans 1, wide: another round
    assert rule.verdict(5, 0.7, 1.4) == "the cap of 5 rounds"
    assert rule.verdict(5, None, None) == "the cap of 5 rounds"  # no interval at all
    assert "98.75% interval (Bonferroni over 4 looks: at least 95% over all)" in rule.rule()
    with pytest.raises(InputError, match="at least 2"):
        Sequential(cap=1)


@given(st.integers(min_value=2, max_value=20))
def test_the_looks_together_miss_at_most_five_percent(cap: int) -> None:
    rule = Sequential(cap)
    assert rule.looks * (1 - rule.confidence) == pytest.approx(0.05)
