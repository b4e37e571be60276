"""A body passed through and given back: its rounds span its redeliveries."""

from __future__ import annotations

from types import MappingProxyType

from sidecar.relay.passing_rounds import FIRST_ROUND, KEEP, PassingRounds
from sidecar.wire import Delivery, UnreadBody


def passing(message_id: str, *, tag: int = 1) -> Delivery:
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="order.placed",
        redelivered=tag > 1,
        properties=MappingProxyType({"message_id": message_id}),
        headers=MappingProxyType({"x-acemq-id": message_id}),
        body=b"",
        unread_body=UnreadBody(size=10_000_000, limit=1_000_000),
    )


def test_a_first_round_starts_at_its_delivery_and_the_first_step() -> None:
    rounds = PassingRounds()
    assert rounds.timing(passing("m-1"), started=100.0, now=102.5) == (2.5, FIRST_ROUND)


def test_a_redelivery_goes_on_from_the_first_rounds_start_one_step_further() -> None:
    rounds = PassingRounds()
    rounds.again(passing("m-1"), started=100.0)
    rounds.again(passing("m-1", tag=2), started=110.0)
    assert rounds.timing(passing("m-1", tag=3), started=130.0, now=131.0) == (
        31.0,
        FIRST_ROUND + 2,
    )
    assert rounds.timing(passing("m-2"), started=130.0, now=131.0) == (1.0, FIRST_ROUND)


def test_a_settled_message_is_forgotten() -> None:
    rounds = PassingRounds()
    rounds.again(passing("m-1"), started=100.0)
    rounds.forget(passing("m-1", tag=2))
    assert rounds.timing(passing("m-1", tag=3), started=200.0, now=200.0) == (0.0, FIRST_ROUND)


def test_the_table_keeps_the_most_recent_messages() -> None:
    rounds = PassingRounds()
    for index in range(KEEP + 1):
        rounds.again(passing(f"m-{index}"), started=float(index))
    assert rounds.timing(passing("m-0"), started=5000.0, now=5000.0) == (0.0, FIRST_ROUND)
    last = f"m-{KEEP}"
    assert rounds.timing(passing(last), started=5000.0, now=5000.0)[1] == FIRST_ROUND + 1
