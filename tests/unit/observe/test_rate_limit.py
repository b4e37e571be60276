"""The rate limit of log lines: once per key per interval, and every held-back line counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.rate_limit import RateLimit


def test_a_key_goes_once_per_interval_and_says_how_often_it_was_held_back() -> None:
    limit = RateLimit[str](60.0)
    assert limit.admit("full", 0.0) == 0
    assert limit.admit("full", 59.9) is None
    assert limit.admit("full", 30.0) is None
    assert limit.admit("full", 60.0) == 2, "the interval since the last line: two held back"
    assert limit.admit("full", 119.0) is None, "the interval runs from the last line let through"


def test_each_key_has_its_own_interval_and_count() -> None:
    limit = RateLimit[tuple[str, str]](10.0)
    assert limit.admit(("coerced", "a"), 0.0) == 0
    assert limit.admit(("coerced", "b"), 1.0) == 0
    assert limit.admit(("coerced", "a"), 2.0) is None
    assert limit.admit(("coerced", "b"), 11.0) == 0
    assert limit.admit(("coerced", "a"), 12.0) == 1


def test_take_quiet_hands_over_the_held_back_counts_once() -> None:
    limit = RateLimit[str](10.0)
    limit.admit("a", 0.0)
    limit.admit("a", 1.0)
    limit.admit("a", 2.0)
    limit.admit("b", 0.0)
    assert limit.take_quiet() == {"a": 2}
    assert limit.take_quiet() == {}
    assert limit.admit("a", 20.0) == 0, "counted once: taken, not told again"


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.0, 5.0, allow_nan=False)), max_size=50)
)
def test_no_line_is_lost_and_none_comes_within_an_interval(
    calls: list[tuple[str, float]],
) -> None:
    """Lines let through + the counts they carry + what take_quiet hands over = every call."""
    limit = RateLimit[str](3.0)
    now, through, told = 0.0, 0, 0
    last: dict[str, float] = {}
    for key, step in calls:
        now += step
        held = limit.admit(key, now)
        if held is not None:
            assert key not in last or now - last[key] >= 3.0
            last[key] = now
            through += 1
            told += held
    told += sum(limit.take_quiet().values())
    assert through + told == len(calls)
