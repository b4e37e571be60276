"""The relay's decisions on refusals and held deliveries, table by table: settle.settlement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.settle.holds import (
    HoldLimits,
    Wait,
    after_hold,
    after_refusal,
    blocked,
    consumer_timeout_after,
    read_permission_named,
)
from sidecar.settle.settlement import (
    Alone,
    Copy,
    DeadLetter,
    Hold,
    Outcome,
    Quarantine,
)

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
    # A nacked copy is retried within the deadline (nack_max_s 30 < half the
    # consumer_timeout 50): the backoff's delay, drawn by the relay, is cut to it...
    (COPY, 1, 1.0, Wait(29.0)),
    (COPY, 2, 29.0, Wait(1.0)),
    # Past nack_max_attempts, to quarantine at once.
    (
        COPY,
        3,
        5.0,
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
        Quarantine(
            "nacked (2 attempts over 30.0s; given up after 3 attempts or 30s, before the"
            " broker's consumer_timeout of 100s)"
        ),
    ),
    # A quarantine copy nobody takes waits till 3/4 of the consumer_timeout, whatever the count.
    (TO_QUARANTINE, 50, 70.0, Wait(5.0)),
    (
        TO_QUARANTINE,
        1,
        75.0,
        DeadLetter(
            "unroutable: no binding; and for 75.0s: nacked (dead-lettered before the broker's"
            " consumer_timeout of 100s)"
        ),
    ),
]


@pytest.mark.parametrize(("plan", "attempts", "held_s", "expected"), HOLDS)
def test_how_long_a_held_delivery_may_wait(
    plan: Copy | Quarantine, attempts: int, held_s: float, expected: object
) -> None:
    """Bounded by count and time, and always before the broker's consumer_timeout."""
    decided = after_hold(NACKED, plan, attempts=attempts, held_s=held_s, limits=LIMITS)
    assert decided == expected


def test_a_short_consumer_timeout_wins_over_nack_max_s() -> None:
    """A broker with consumer_timeout 5 s: the copy goes to quarantine at 2.5 s."""
    limits = HoldLimits(consumer_timeout_s=5.0, nack_max_attempts=100, nack_max_s=300.0)
    assert after_hold(NACKED, COPY, attempts=1, held_s=2.0, limits=limits) == Wait(0.5)
    decided = after_hold(NACKED, COPY, attempts=2, held_s=2.5, limits=limits)
    assert isinstance(decided, Quarantine)


@given(
    plan=st.sampled_from([COPY, TO_QUARANTINE]),
    attempts=st.integers(1, 10_000),
    held_s=st.floats(0, 10_000, allow_nan=False),
    timeout_s=st.floats(1, 7 * 86400, allow_nan=False),
)
def test_a_wait_never_reaches_the_consumer_timeout(
    plan: Copy | Quarantine, attempts: int, held_s: float, timeout_s: float
) -> None:
    """Whatever the numbers, a delivery never waits into the broker's own timeout."""
    limits = HoldLimits(consumer_timeout_s=timeout_s, nack_max_attempts=5, nack_max_s=300.0)
    decided = after_hold(NACKED, plan, attempts=attempts, held_s=held_s, limits=limits)
    if isinstance(decided, Wait):
        assert decided.at_most_s >= 0
        assert held_s + decided.at_most_s <= 0.75 * timeout_s + 1e-6  # float rounding


def test_the_blocked_reason_quotes_the_broker() -> None:
    assert blocked("low on memory") == (
        'the broker blocked the connection ("low on memory"); nothing is published until it'
        " unblocks"
    )


# RabbitMQ 3.10's words (rabbit_channel:evaluate_consumer_timeout), as the client reports them.
TIMED_OUT = (
    "channel closed by the broker: 406 PRECONDITION_FAILED - delivery acknowledgement on"
    " channel 1 timed out. Timeout value used: 5000 ms. This timeout value can be"
    " configured, see consumers doc guide to learn more"
)
MAP_LIMITS = HoldLimits(consumer_timeout_s=1800.0, nack_max_attempts=10, nack_max_s=300.0)


@pytest.mark.parametrize(
    ("reason", "held_s", "expected"),
    [
        (TIMED_OUT, 6.2, 5.0),  # the broker's own value: it checks once per tick
        (TIMED_OUT, 4.9, 4.9),  # what the route had held it (its clock starts later)
        (TIMED_OUT.replace(" Timeout value used: 5000 ms.", ""), 6.2, 6.2),
        (TIMED_OUT, None, 5.0),
        (TIMED_OUT, 0.01, 1.0),  # never below the route map's least
        ("channel closed by the broker: 406 PRECONDITION_FAILED - fast reply", 6.2, None),
        ("channel closed by the broker: 404 NOT_FOUND - no queue", 6.2, None),
        ("connection lost", 6.2, None),
    ],
)
def test_the_brokers_timed_out_close_gives_the_timeout_to_hold_by(
    reason: str, held_s: float | None, expected: float | None
) -> None:
    """The broker does not tell its timeout; its 406 when it takes a delivery back does."""
    assert consumer_timeout_after(reason, held_s=held_s, limits=MAP_LIMITS) == expected


def test_a_timed_out_close_changes_nothing_when_the_map_says_less_already() -> None:
    """A route already told a shorter timeout keeps it."""
    limits = HoldLimits(consumer_timeout_s=3.0, nack_max_attempts=10, nack_max_s=300.0)
    assert consumer_timeout_after(TIMED_OUT, held_s=6.2, limits=limits) is None


OLD_WORDS = "403 ACCESS_REFUSED - access to queue 'st' in vhost '/' refused for user 'relay'"
NEW_WORDS = "403 ACCESS_REFUSED - read access to queue 'st' in vhost '/' refused for user 'relay'"


@pytest.mark.parametrize(
    ("reason", "named"),
    [
        # RabbitMQ 3.10.8's words name no permission: the sidecar adds it
        (OLD_WORDS, f"{OLD_WORDS}: the login needs read permission on queue 'st'"),
        (NEW_WORDS, NEW_WORDS),  # 4.0.5 and 4.3.6 name it already
        (
            "404 NOT_FOUND - no queue 'st' in vhost '/'",
            "404 NOT_FOUND - no queue 'st' in vhost '/'",
        ),
        (
            "403 ACCESS_REFUSED - write access to exchange 'x'",
            "403 ACCESS_REFUSED - write access to exchange 'x'",
        ),
    ],
)
def test_a_queues_403_at_start_names_the_read_permission(reason: str, named: str) -> None:
    assert read_permission_named(f"channel closed by the broker: {reason}") == (
        f"channel closed by the broker: {named}"
    )
