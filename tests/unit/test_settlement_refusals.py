"""The relay's decisions on refusals and held deliveries, table by table: sidecar.settlement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.relay import InFlightWindow
from sidecar.settlement import (
    Alone,
    Copy,
    DeadLetter,
    Hold,
    Outcome,
    Quarantine,
    in_flight_window,
)
from sidecar.settlement_holds import HoldLimits, Wait, after_hold, after_refusal, blocked

COPY = Copy(properties={}, headers={}, routing_key="k.1", outcome=Outcome.RELAYED)
TO_QUARANTINE = Quarantine("unroutable: no binding")
LIMITS = HoldLimits(consumer_timeout_s=100.0, nack_max_attempts=3, nack_max_s=30.0)
NACKED = Hold("nacked", may_duplicate=True)
DENIED = "ACCESS_REFUSED - access to exchange 'orders' in vhost '/' refused for user 'u'"
TOO_BIG = "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
WORDS_403 = f'the broker refused a publish to exchange "orders": 403 {DENIED}'
WORDS_406 = f'the broker refused a publish to exchange "orders": 406 {TOO_BIG}'

REFUSALS = [
    # A refusal the broker repeats, on a channel shared with others: whose was it?
    (403, DENIED, COPY, False, Alone(WORDS_403)),
    (406, TOO_BIG, COPY, False, Alone(WORDS_406)),
    (406, TOO_BIG, TO_QUARANTINE, False, Alone(WORDS_406)),
    # Alone, it is the delivery's own: the broker's words go to quarantine.
    (403, DENIED, COPY, True, Quarantine(WORDS_403)),
    (406, TOO_BIG, COPY, True, Quarantine(WORDS_406)),
    # The quarantine copy refused so: nothing will take it.
    (
        406,
        TOO_BIG,
        TO_QUARANTINE,
        True,
        DeadLetter(f"unroutable: no binding; and the quarantine copy was refused: {WORDS_406}"),
    ),
    # Anything else may pass: retried on a new channel, shared or alone.
    (
        541,
        "INTERNAL_ERROR",
        COPY,
        False,
        Hold(
            'the broker refused a publish to exchange "orders": 541 INTERNAL_ERROR;'
            " retrying on a new channel",
            may_duplicate=True,
        ),
    ),
    (
        505,
        "UNEXPECTED_FRAME",
        TO_QUARANTINE,
        True,
        Hold(
            'the broker refused a publish to exchange "orders": 505 UNEXPECTED_FRAME;'
            " retrying on a new channel",
            may_duplicate=True,
        ),
    ),
]


@pytest.mark.parametrize(("code", "text", "plan", "alone", "expected"), REFUSALS)
def test_what_a_closed_publish_channel_means(
    code: int,
    text: str,
    plan: Copy | Quarantine,
    alone: bool,  # noqa: FBT001 - a parametrised case
    expected: object,
) -> None:
    """403 and 406 are the message's own once seen alone; other codes are retried."""
    assert after_refusal(code, text, plan, alone=alone, exchange="orders") == expected


def test_a_repeated_refusal_seen_alone_never_holds() -> None:
    """Holding a 403 or 406 would retry for ever what the broker refuses for ever."""
    for code in (403, 406):
        for plan in (COPY, TO_QUARANTINE):
            decided = after_refusal(code, "x", plan, alone=True, exchange="e")
            assert isinstance(decided, Quarantine | DeadLetter)


HOLDS = [
    # A nacked copy is retried, the wait no longer than the backoff...
    (COPY, 1, 1.0, 2.0, Wait(2.0)),
    # ...and cut to the deadline (nack_max_s 30 < half the consumer_timeout 50).
    (COPY, 2, 29.0, 8.0, Wait(1.0)),
    # Past nack_max_attempts, to quarantine at once.
    (
        COPY,
        3,
        5.0,
        1.0,
        Quarantine(
            "nacked (3 attempts over 5.0s; given up after 3 attempts or 30s, before the"
            " broker's consumer_timeout of 100s)"
        ),
    ),
    # Past nack_max_s.
    (
        COPY,
        2,
        30.0,
        1.0,
        Quarantine(
            "nacked (2 attempts over 30.0s; given up after 3 attempts or 30s, before the"
            " broker's consumer_timeout of 100s)"
        ),
    ),
    # A quarantine copy nobody takes waits till 3/4 of the consumer_timeout, whatever the count.
    (TO_QUARANTINE, 50, 70.0, 8.0, Wait(5.0)),
    (
        TO_QUARANTINE,
        1,
        75.0,
        1.0,
        DeadLetter(
            "unroutable: no binding; and for 75.0s: nacked (dead-lettered before the broker's"
            " consumer_timeout of 100s)"
        ),
    ),
]


@pytest.mark.parametrize(("plan", "attempts", "held_s", "delay_s", "expected"), HOLDS)
def test_how_long_a_held_delivery_may_wait(
    plan: Copy | Quarantine, attempts: int, held_s: float, delay_s: float, expected: object
) -> None:
    """Bounded by count and time, and always before the broker's consumer_timeout."""
    decided = after_hold(
        NACKED, plan, attempts=attempts, held_s=held_s, delay_s=delay_s, limits=LIMITS
    )
    assert decided == expected


def test_a_short_consumer_timeout_wins_over_nack_max_s() -> None:
    """A broker with consumer_timeout 5 s: the copy goes to quarantine at 2.5 s."""
    limits = HoldLimits(consumer_timeout_s=5.0, nack_max_attempts=100, nack_max_s=300.0)
    assert after_hold(NACKED, COPY, attempts=1, held_s=2.0, delay_s=4.0, limits=limits) == Wait(0.5)
    decided = after_hold(NACKED, COPY, attempts=2, held_s=2.5, delay_s=4.0, limits=limits)
    assert isinstance(decided, Quarantine)


@given(
    plan=st.sampled_from([COPY, TO_QUARANTINE]),
    attempts=st.integers(1, 10_000),
    held_s=st.floats(0, 10_000, allow_nan=False),
    delay_s=st.floats(0, 100, allow_nan=False),
    timeout_s=st.floats(1, 7 * 86400, allow_nan=False),
)
def test_a_wait_never_reaches_the_consumer_timeout(
    plan: Copy | Quarantine, attempts: int, held_s: float, delay_s: float, timeout_s: float
) -> None:
    """Whatever the numbers, a delivery never waits into the broker's own timeout."""
    limits = HoldLimits(consumer_timeout_s=timeout_s, nack_max_attempts=5, nack_max_s=300.0)
    decided = after_hold(
        NACKED, plan, attempts=attempts, held_s=held_s, delay_s=delay_s, limits=limits
    )
    if isinstance(decided, Wait):
        assert 0 <= decided.delay_s <= delay_s
        assert held_s + decided.delay_s <= 0.75 * timeout_s


def test_the_blocked_reason_quotes_the_broker() -> None:
    assert blocked("low on memory") == (
        'the broker blocked the connection ("low on memory"); nothing is published until it'
        " unblocks"
    )


WINDOWS = [
    # Before any delivery: the route's prefetch (a window applies from a channel's start).
    (512, 64 * 2**20, None, 512),
    # 1 KiB messages: the route's prefetch.
    (512, 64 * 2**20, 1024, 512),
    # 5 MiB messages under a 64 MiB budget: 12 in flight.
    (512, 64 * 2**20, 5 * 2**20, 12),
    # Larger than the whole budget: one at a time, never none.
    (512, 64 * 2**20, 100 * 2**20, 1),
    (512, 64 * 2**20, 0, 512),
]


@pytest.mark.parametrize(("prefetch", "budget", "largest", "expected"), WINDOWS)
def test_the_window_keeps_bodies_in_flight_within_the_budget(
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
def test_the_window_is_within_one_and_prefetch_and_the_budget(
    prefetch: int, budget: int, largest: int
) -> None:
    window = in_flight_window(prefetch=prefetch, budget_bytes=budget, largest_bytes=largest)
    assert 1 <= window <= prefetch
    assert window == 1 or window * largest <= budget


def test_a_routes_window_shrinks_as_larger_messages_arrive() -> None:
    """It changes only when a larger body comes, and starts a new channel where it left off."""
    window = InFlightWindow(prefetch=512, budget_bytes=64 * 2**20)
    assert window.start() == 512
    assert window.note(1024) is None  # the route's prefetch already
    assert window.note(512) is None  # smaller: no change, no basic.qos
    assert window.note(5 * 2**20) == 12
    assert window.note(5 * 2**20) is None
    assert window.start() == 12
