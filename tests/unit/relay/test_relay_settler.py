"""The relay's I/O loop for one delivery, driven by a scripted fake channel (no broker).

What the broker says to each publish is scripted; the tests check what the settler sends,
whether it acks, what it counts, and what the route's state says meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.contract import ERROR, Publishers
from sidecar.errors import WireError
from sidecar.relay import state
from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.relay.state import RouteState
from sidecar.routemap import Mode, RouteLimits
from sidecar.wire import Delivery, PublishOutcome
from tests.compiled import is_compiled
from tests.fakes import Answer, FakeBroker, FakeChannel
from tests.fakes.route import CANONICAL, QUARANTINE, orders_route, settle_one


@dataclass
class Rig:
    """A settler for one route with its state, metrics and stop event."""

    settler: Settler
    state: RouteState
    registry: CollectorRegistry
    stop: asyncio.Event

    async def settle(
        self, channel: FakeChannel, message: Delivery, *, connection_open: bool = True
    ) -> None:
        """Settle one delivery consumed and published on the fake channel."""
        connection = channel.broker.connection(one_channel=channel)
        connection.is_open = connection_open
        self.settler.attach(connection, PublishLane(connection, stop=self.stop))
        await settle_one(self.settler, self.state, channel, message)

    def count(self, outcome: str) -> float | None:
        """Return the route's messages_total for the outcome."""
        return self.registry.get_sample_value(
            "acemq_sidecar_messages_total", {"route": "orders", "outcome": outcome}
        )


def make_rig(
    *,
    publishers: Publishers = Publishers.ACEMQ,
    mode: Mode = Mode.ENFORCE,
    limits: RouteLimits | None = None,
    delivery_limit: int = 20,
) -> Rig:
    orders = orders_route(
        publishers=publishers, mode=mode, limits=limits, delivery_limit=delivery_limit
    )
    stop = asyncio.Event()
    settler = Settler(orders.context, state=orders.state, log=orders.log, stop=stop)
    return Rig(settler=settler, state=orders.state, registry=orders.registry, stop=stop)


def one_channel(answers: list[Answer]) -> FakeChannel:
    """A channel that consumes and publishes alike, answering from ``answers``."""
    return FakeChannel(FakeBroker(answers=answers), 1)


def delivery(headers: dict[str, Any] | None = None, *, redelivered: bool = False) -> Delivery:
    return Delivery(
        delivery_tag=7,
        exchange="",
        routing_key="order.placed",
        redelivered=redelivered,
        properties=MappingProxyType({"message_id": "m-1"}),
        headers=MappingProxyType(dict(CANONICAL) if headers is None else headers),
        body=b"body",
    )


async def test_a_confirmed_copy_is_acked_and_counted_relayed() -> None:
    rig = make_rig()
    channel = one_channel([PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery())
    assert channel.exchanges == ["orders"]
    assert channel.acked == [7]
    assert rig.count("relayed") == 1
    assert rig.state.in_flight == 0
    assert rig.state.pause_reason is None


async def test_a_returned_copy_sends_the_original_to_quarantine_then_acks() -> None:
    rig = make_rig(limits=RouteLimits(return_max_attempts=0))  # not published again
    channel = one_channel([PublishOutcome.RETURNED, PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery())
    assert channel.exchanges == ["orders", QUARANTINE]
    assert channel.sent[1].routing_key == "orders"
    assert channel.sent[1].headers[ERROR].startswith("unroutable:")
    assert channel.acked == [7]
    assert rig.count("quarantined") == 1


@pytest.mark.skipif(
    is_compiled(state),
    reason="replaces a method, which a compiled class does not let be replaced; plain runs it",
)
async def test_a_nacked_copy_is_held_then_retried_on_a_new_publish_channel() -> None:
    """Held, the route says why; the retry goes on a new channel, the nacking one is closed.

    RabbitMQ 3.10 can go on nacking every publish on a channel that published into a
    quorum queue's leader election, while a new channel is acked (docs/scaling.md).
    """
    rig = make_rig()
    broker = FakeBroker(answers=[PublishOutcome.NACKED, PublishOutcome.CONFIRMED])
    connection = broker.connection()
    consumer = broker.consumer()
    reasons: list[str | None] = []
    real_pause = rig.state.pause

    def pause(reason: str, **options: bool) -> None:
        real_pause(reason, **options)
        reasons.append(rig.state.pause_reason)

    rig.state.pause = pause  # type: ignore[method-assign]
    rig.settler.attach(connection, PublishLane(connection, stop=rig.stop))
    await settle_one(rig.settler, rig.state, consumer, delivery())
    assert [c.exchanges for c in connection.opened] == [
        ["orders"],
        ["orders"],
    ]
    assert [c.is_open for c in connection.opened] == [False, True]
    assert consumer.acked == [7]
    assert reasons
    assert "nacked" in str(reasons[0])
    assert rig.state.held == 0
    assert rig.state.pause_reason is None
    assert rig.count("relayed") == 1


async def test_a_held_delivery_is_let_go_unacked_on_stop() -> None:
    """A quarantine nobody takes holds the delivery; a stop leaves it to the broker."""
    rig = make_rig(publishers=Publishers.APPS)
    channel = one_channel([PublishOutcome.RETURNED] * 10)
    message = delivery({**CANONICAL, "x-acemq-tenant": "acme"})
    task = asyncio.create_task(rig.settle(channel, message))
    await asyncio.wait_for(channel.broker.first_publish.wait(), 5)
    await asyncio.sleep(0)  # let the settler read the answer
    assert rig.state.held == 1
    assert "quarantine exchange" in str(rig.state.pause_reason)
    rig.state.stopping = True
    rig.stop.set()
    await asyncio.wait_for(task, 5)
    assert channel.acked == []
    assert rig.state.held == 0
    assert rig.state.in_flight == 0


async def test_a_copy_that_cannot_be_encoded_goes_to_quarantine() -> None:
    rig = make_rig()
    channel = one_channel([WireError("too big"), PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery())
    reason = channel.sent[1].headers[ERROR]
    assert reason == "the normalised message cannot be encoded: too big"
    assert channel.acked == [7]


async def test_a_quarantine_copy_too_big_for_its_headers_goes_with_the_reason_only() -> None:
    rig = make_rig(publishers=Publishers.APPS)
    channel = one_channel([WireError("frame too large"), PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery({"x-acemq-tenant": "acme"}))
    second = channel.sent[1].headers
    assert set(second) == {ERROR, "acemq-quarantined-from"}
    assert "the original headers could not be written: frame too large" in second[ERROR]
    assert channel.acked == [7]


async def test_an_unexpected_error_while_publishing_quarantines_the_message() -> None:
    rig = make_rig()
    channel = one_channel([RuntimeError("boom"), PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery())
    assert channel.sent[1].headers[ERROR] == "internal error: RuntimeError('boom')"
    assert channel.acked == [7]


async def test_a_lost_channel_leaves_the_delivery_to_the_broker() -> None:
    rig = make_rig()
    channel = one_channel([ChannelLostError("connection reset")])
    await rig.settle(channel, delivery(), connection_open=False)
    assert channel.acked == []
    assert rig.state.pause_reason is None  # the worker, not the delivery, reports a lost channel
    assert rig.state.in_flight == 0


async def test_a_missing_exchange_pauses_the_route_without_an_ack() -> None:
    rig = make_rig()
    channel = one_channel([MissingEntityError(kind="exchange", name="orders")])
    await rig.settle(channel, delivery())
    assert channel.acked == []
    assert 'exchange "orders"' in str(rig.state.pause_reason)


async def test_a_failing_quarantine_closes_the_channel_for_a_redelivery() -> None:
    """A bug on the quarantine path must not spin: the channel closes, the broker redelivers."""
    rig = make_rig(publishers=Publishers.APPS)
    channel = one_channel([RuntimeError("boom")])
    await rig.settle(channel, delivery({"x-acemq-tenant": "acme"}))
    assert channel.acked == []
    assert channel.late == []
    assert not channel.is_open
    assert rig.state.pause_reason == "internal error; see the log"


@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.AUDIT])
async def test_violations_are_counted_once_per_message(mode: Mode) -> None:
    rig = make_rig(mode=mode)
    channel = one_channel([PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery({"x-acemq-id": "m-1"}))
    defaulted = rig.registry.get_sample_value(
        "acemq_sidecar_violations_total",
        {"route": "orders", "kind": "defaulted", "header": "x-acemq-type"},
    )
    assert defaulted == 1
    assert rig.count("audited" if mode is Mode.AUDIT else "relayed") == 1


async def test_a_delivery_that_arrives_while_its_channel_closes_publishes_nothing() -> None:
    """Its ack would be refused and the broker would redeliver it: a copy now is a duplicate."""
    rig = make_rig()
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED])
    closing = broker.consumer(is_open=False)  # the consumer channel: our close sent
    connection = broker.connection()
    rig.settler.attach(connection, PublishLane(connection, stop=rig.stop))
    await settle_one(rig.settler, rig.state, closing, delivery())
    assert broker.published == []
    assert closing.acked == []
    assert closing.late == []
    assert rig.state.in_flight == 0


@pytest.mark.parametrize(("limit", "quarantined"), [(5, True), (6, False), (0, False)])
async def test_the_routes_delivery_limit_decides_the_last_return(
    limit: int, *, quarantined: bool
) -> None:
    """4 returns spent: one from a limit of 5, quarantined; 6 or none (0): relayed."""
    rig = make_rig(delivery_limit=limit)
    channel = one_channel([PublishOutcome.CONFIRMED])
    await rig.settle(channel, delivery({**CANONICAL, "x-delivery-count": 4}, redelivered=True))
    assert channel.exchanges == [QUARANTINE if quarantined else "orders"]
    if quarantined:
        reason = channel.sent[0].headers[ERROR]
        assert reason.startswith("delivery limit: the broker has given this message back 4"), reason
    assert channel.acked == [7]
