"""A budget of so many a second (``flow.rate_budget``), on a clock the test moves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.flow import RateBudget


def takes(budget: RateBudget, now: float, times: int) -> int:
    return sum(budget.take(now) for _ in range(times))


def test_a_full_budget_gives_its_burst_then_nothing_at_the_same_moment() -> None:
    budget = RateBudget(10)
    assert takes(budget, 5.0, 15) == 10


def test_it_refills_at_its_rate_and_never_above_its_burst() -> None:
    budget = RateBudget(10)
    assert takes(budget, 0.0, 10) == 10
    assert takes(budget, 0.25, 10) == 2  # 2.5 tokens: two whole ones
    assert takes(budget, 0.35, 10) == 1  # the half left and one more
    assert takes(budget, 100.0, 50) == 10


def test_a_clock_going_back_adds_nothing() -> None:
    budget = RateBudget(4)
    assert takes(budget, 10.0, 4) == 4
    assert takes(budget, 9.0, 4) == 0


def test_a_budget_of_zero_says_no() -> None:
    assert takes(RateBudget(0), 0.0, 3) == 0


@given(
    per_s=st.integers(1, 50),
    steps=st.lists(st.floats(0, 2, allow_nan=False), min_size=1, max_size=40),
)
def test_over_any_span_it_gives_at_most_the_burst_and_the_rate(
    per_s: int, steps: list[float]
) -> None:
    budget = RateBudget(per_s)
    now, given_ = 0.0, 0
    for step in steps:
        now += step
        given_ += takes(budget, now, 3)
    assert given_ <= per_s + per_s * now + 1e-9
