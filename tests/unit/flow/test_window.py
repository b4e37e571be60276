"""A route's in-flight window, table by table: flow.window, and the relay's InFlightWindow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.flow.window import (
    START_WINDOW,
    grows_on,
    in_flight_window,
    next_window,
    refill,
    stops_growing,
)
from sidecar.relay.consumer import InFlightWindow

MIB = 2**20
BUDGET = 64 * MIB

ALLOWED = [
    # Before any delivery: the route's prefetch (slow start bounds the first window).
    (512, BUDGET, None, 512),
    # 1 KiB messages: the route's prefetch.
    (512, BUDGET, 1024, 512),
    # 5 MiB messages under a 64 MiB budget: 12 in flight.
    (512, BUDGET, 5 * MIB, 12),
    # Larger than the whole budget: one at a time, never none.
    (512, BUDGET, 100 * MIB, 1),
    (512, BUDGET, 0, 512),
]


@pytest.mark.parametrize(("prefetch", "budget", "largest", "expected"), ALLOWED)
def test_the_allowed_window_keeps_bodies_in_flight_within_the_budget(
    prefetch: int, budget: int, largest: int | None, expected: int
) -> None:
    """RabbitMQ ignores prefetch_size: the count must bound the bytes."""
    window = in_flight_window(prefetch=prefetch, budget_bytes=budget, largest_bytes=largest)
    assert window == expected


@given(
    prefetch=st.integers(1, 65535),
    budget=st.integers(65536, 2**40),
    largest=st.integers(1, 2**31),
)
def test_the_allowed_window_is_within_one_and_prefetch_and_the_budget(
    prefetch: int, budget: int, largest: int
) -> None:
    window = in_flight_window(prefetch=prefetch, budget_bytes=budget, largest_bytes=largest)
    assert 1 <= window <= prefetch
    assert window == 1 or window * largest <= budget


NEXT = [
    # (current, allowed, prefetch, seen, may_grow) -> next window
    # Slow start: times 64 once a whole window of sizes was seen.
    (1, 512, 512, 0, True, None),
    (1, 512, 512, 1, True, 64),
    (64, 512, 512, 63, True, None),
    (64, 512, 512, 64, True, 512),
    # The last step is the route's prefetch, though it is less than times 64.
    (1, 100, 100, 1, True, 64),
    (64, 100, 100, 64, True, 100),
    (8, 100, 100, 8, True, 100),
    (256, 512, 512, 256, True, 512),
    (512, 512, 512, 10_000, True, None),
    # Bounded by the budget: to what it allows, if that is at least twice the window.
    (1, 3, 512, 1, True, 3),
    (4, 12, 512, 4, True, 12),
    (8, 12, 512, 8, True, None),  # 12 < 2 x 8: not worth a re-consume
    (256, 504, 512, 256, True, None),
    (12, 12, 512, 50, True, None),
    # A larger body: shrink at once, whatever was seen, to a power of two within it.
    (512, 12, 512, 0, True, 8),
    (512, 504, 512, 0, False, 256),
    (12, 10, 512, 0, True, 8),
    (8, 7, 512, 3, True, 4),
    (3, 1, 512, 0, True, 1),
    (100, 99, 100, 0, True, 64),
    # No more growth on this channel.
    (4, 512, 512, 100, False, None),
    # A route of prefetch 1 never changes.
    (1, 1, 1, 100, True, None),
]


@pytest.mark.parametrize(("current", "allowed", "prefetch", "seen", "may_grow", "expected"), NEXT)
def test_the_window_grows_by_steps_and_shrinks_at_once(
    *, current: int, allowed: int, prefetch: int, seen: int, may_grow: bool, expected: int | None
) -> None:
    """Times 64 after a whole window of sizes, to a shrink at the first larger body."""
    got = next_window(
        current=current, allowed=allowed, prefetch=prefetch, seen=seen, may_grow=may_grow
    )
    assert got == expected


@given(
    current=st.integers(1, 65535),
    allowed=st.integers(1, 65535),
    extra=st.integers(0, 65535),
    seen=st.integers(0, 100_000),
    may_grow=st.booleans(),
)
def test_a_new_window_is_within_the_allowed_one_and_at_least_one(
    *, current: int, allowed: int, extra: int, seen: int, may_grow: bool
) -> None:
    """Never over the budget's count, never over prefetch, never zero; a change is a change."""
    prefetch = min(65535, max(current, allowed) + extra)
    got = next_window(
        current=current, allowed=allowed, prefetch=prefetch, seen=seen, may_grow=may_grow
    )
    if got is not None:
        assert 1 <= got <= allowed <= prefetch
        assert got != current


@given(
    prefetch=st.integers(1, 65535),
    budget=st.integers(65536, 2**34),
    sizes=st.lists(st.integers(0, 2**27), min_size=1, max_size=400),
)
def test_a_channel_changes_its_window_a_bounded_number_of_times(
    prefetch: int, budget: int, sizes: list[int]
) -> None:
    """Whatever the sizes: at most log8 + log2 of prefetch changes, each within the budget."""
    window = InFlightWindow(prefetch=prefetch, budget_bytes=budget)
    window.start()
    changes = 0
    for size in sizes:
        window.note(size)
        while (target := window.target()) is not None:
            window.applied(target, whole=True)
            changes += 1
            assert target == 1 or target * (window.largest or 0) <= budget
    assert changes <= prefetch.bit_length() // 2 + prefetch.bit_length() + 2
    assert 1 <= window.current <= prefetch


REFILL = [
    # (old, new, allowed, in_flight) -> what the new consumer may take now
    # Growth within the allowed window: at once, whatever the old one left.
    (4, 16, 512, 4, 16),
    (64, 256, 512, 64, 256),
    # The last growth step must wait until the old deliveries leave room.
    (256, 512, 512, 256, 256),
    (256, 512, 512, 0, 512),
    # A shrink holds no more than the old window did.
    (512, 8, 12, 512, 0),
    (512, 8, 12, 505, 7),
    (512, 8, 12, 100, 8),
    # A window of one whose delivery is still in flight: nothing until it settles.
    (1, 4, 512, 1, 4),
    (4, 2, 2, 4, 0),
]


@pytest.mark.parametrize(("old", "new", "allowed", "in_flight", "expected"), REFILL)
def test_a_new_consumer_starts_once_the_old_ones_deliveries_leave_room(
    old: int, new: int, allowed: int, in_flight: int, expected: int
) -> None:
    """A change never holds more than the larger of the old and the allowed window."""
    assert refill(old=old, new=new, allowed=allowed, in_flight=in_flight) == expected


@given(
    old=st.integers(1, 65535),
    new=st.integers(1, 65535),
    allowed=st.integers(1, 65535),
    in_flight=st.integers(0, 65535),
)
def test_refill_never_takes_more_than_fits(
    old: int, new: int, allowed: int, in_flight: int
) -> None:
    take = refill(old=old, new=new, allowed=allowed, in_flight=in_flight)
    assert 0 <= take <= new
    assert take == 0 or in_flight + take <= max(old, allowed)


def test_a_routes_window_starts_small_grows_and_shrinks_for_a_larger_body() -> None:
    """Slow start on every channel; the largest body is kept across them."""
    window = InFlightWindow(prefetch=512, budget_bytes=BUDGET)
    assert window.start() == START_WINDOW
    window.note(1024)
    assert window.wanted.is_set()
    assert window.target() == 64
    window.applied(64, whole=True)
    for _ in range(63):
        window.note(1024)
    assert window.target() is None  # 63 of 64 sizes seen
    window.note(512)
    assert window.target() == 512
    window.applied(512, whole=True)
    window.note(5 * MIB)  # at once: 12 of these fit 64 MiB
    assert window.target() == 8
    window.applied(8, whole=True)
    for _ in range(100):
        window.note(5 * MIB)
    assert window.target() is None  # 12 < 2 x 8: no growth back
    assert window.start() == START_WINDOW
    window.note(1024)
    assert window.target() == 12  # the largest body seen on the last channel still counts
    window.applied(12, whole=True)
    for _ in range(12):
        window.note(1024)
    assert window.target() is None


def test_a_window_that_had_to_start_smaller_stops_growing_on_its_channel() -> None:
    """Held deliveries kept it from its whole window: growing would wait for them again."""
    window = InFlightWindow(prefetch=512, budget_bytes=BUDGET)
    window.start()
    window.note(1024)
    window.applied(64, whole=True)
    for _ in range(64):
        window.note(1024)
    window.applied(400, whole=False)
    for _ in range(1000):
        window.note(1024)
    assert window.target() is None
    window.note(5 * MIB)
    assert window.target() == 8  # shrinking still applies
    window.start()
    window.note(1024)
    assert window.target() == 12  # a new channel grows again, to what the budget allows


def test_a_shrink_given_up_for_now_is_asked_for_again_at_the_next_body() -> None:
    """The window did not fill (no backlog): the next header, however small, asks again."""
    window = InFlightWindow(prefetch=64, budget_bytes=BUDGET)
    window.start()
    window.note(1024)
    window.applied(64, whole=True)
    for _ in range(64):
        window.note(1024)  # at the prefetch: no more growth
    window.note(5 * MIB)
    assert window.target() == 8
    window.wanted.clear()  # what the consumer does when its window would not fill
    window.note(1024)
    assert window.wanted.is_set()
    assert window.target() == 8


def test_a_window_stops_asking_to_grow_once_a_whole_window_brought_no_growth() -> None:
    assert not stops_growing(seen=7, current=8)
    assert stops_growing(seen=8, current=8)
    assert stops_growing(seen=9, current=8)


@pytest.mark.parametrize(
    ("may_grow", "whole", "grows"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_a_window_started_smaller_than_asked_keeps_it_on_its_channel(
    *, may_grow: bool, whole: bool, grows: bool
) -> None:
    assert grows_on(may_grow=may_grow, whole=whole) is grows
