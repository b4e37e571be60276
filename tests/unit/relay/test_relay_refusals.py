"""The settler against refusals, held deliveries and a blocked broker, with fakes (no broker).

The consumer channel (acks, rejects) is apart from the publish channels, as in the relay:
each ``channel()`` of the fake connection is a new publish channel answering from one
shared script. Waits run on a fake clock, so a five-minute hold takes no time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import (
    ChannelClosedError,
    Consumer,
    Publisher,
    RelayConnection,
)
from sidecar.contract import ERROR
from sidecar.relay import settling as settling_module
from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.relay.state import RouteState
from sidecar.routemap import Publishers, RouteLimits
from sidecar.wire import Delivery, PublishOutcome
from tests.fakes import Answer, FakeBroker, FakeChannel, FakeConnection
from tests.fakes.route import CANONICAL, QUARANTINE, orders_route, settle_one

DENIED = "ACCESS_REFUSED - access to exchange 'orders' in vhost '/' refused for user 'u'"


@dataclass
class Rig:
    """A settler on a fake connection with a fake clock."""

    settler: Settler
    state: RouteState
    registry: CollectorRegistry
    stop: asyncio.Event
    connection: FakeConnection
    now: list[float]
    broker: FakeBroker

    async def settle(self, consumer: FakeChannel, message: Delivery | None = None) -> None:
        """Settle one delivery consumed on ``consumer``."""
        await settle_one(self.settler, self.state, consumer, message or delivery())

    def sample(self, name: str, **labels: str) -> float | None:
        """A metric of route orders."""
        return self.registry.get_sample_value(name, {"route": "orders", **labels})


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A monotonic clock that the relay's backoff sleeps advance, without sleeping."""
    now = [0.0]

    async def sleep_unless(stop: asyncio.Event, delay_s: float) -> None:
        now[0] += delay_s
        await asyncio.sleep(0)
        del stop

    monkeypatch.setattr(settling_module, "sleep_unless", sleep_unless)
    return now


def make_rig(
    now: list[float],
    answers: list[Answer],
    *,
    limits: RouteLimits | None = None,
    blocked: str | None = None,
    publishers: Publishers = Publishers.ACEMQ,
) -> Rig:
    orders = orders_route(publishers=publishers, limits=limits, monotonic=lambda: now[0])
    state = orders.state
    stop = asyncio.Event()
    settler = Settler(orders.context, state=state, log=orders.log, stop=stop)
    broker = FakeBroker(answers=answers)
    connection = broker.connection()
    if blocked is not None:
        connection.block(blocked)
    settler.attach(connection, PublishLane(connection, stop=stop))
    return Rig(settler, state, orders.registry, stop, connection, now, broker)


def delivery(tag: int = 7, headers: dict[str, Any] | None = None) -> Delivery:
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": f"m-{tag}"}),
        headers=MappingProxyType(dict(CANONICAL) if headers is None else headers),
        body=b"body",
    )


def test_the_fakes_are_what_the_relay_types_against() -> None:
    """The fakes satisfy the client's Protocols, so the tests exercise the typed face."""
    broker = FakeBroker()
    assert isinstance(FakeChannel(broker, 1), Publisher)
    assert isinstance(broker.consumer(), Consumer)
    assert isinstance(broker.connection(), RelayConnection)


async def test_a_403_on_the_shared_channel_is_tried_alone_then_quarantined(
    fake_time: list[float],
) -> None:
    """The broker's words are the reason; the delivery is acked after the quarantine confirm."""
    refused = ChannelClosedError(403, DENIED)
    rig = make_rig(fake_time, [refused, ChannelClosedError(403, DENIED), PublishOutcome.CONFIRMED])
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    # shared channel 1, then alone on 2 (refused again), then the quarantine alone on 3
    assert rig.broker.published == [(1, "orders"), (2, "orders"), (3, QUARANTINE)]
    assert rig.broker.headers[2][ERROR] == (
        f'the broker refused a publish to exchange "orders": 403 {DENIED}'
    )
    assert consumer.acked == [7]
    assert consumer.is_open  # the consumed window was never requeued
    assert rig.sample("acemq_sidecar_messages_total", outcome="quarantined") == 1
    assert all(not channel.is_open for channel in rig.connection.opened[1:])  # one-offs closed


async def test_a_refusal_that_was_another_publishes_relays_the_copy_alone(
    fake_time: list[float],
) -> None:
    """Closed with a 406 while sharing the channel; alone, the broker takes it."""
    rig = make_rig(
        fake_time, [ChannelClosedError(406, "PRECONDITION_FAILED"), PublishOutcome.CONFIRMED]
    )
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    assert rig.broker.published == [(1, "orders"), (2, "orders")]
    assert consumer.acked == [7]
    assert rig.sample("acemq_sidecar_messages_total", outcome="relayed") == 1
    assert rig.sample("acemq_sidecar_retried_copies_total") == 1  # the first may have routed


async def test_a_quarantine_copy_the_broker_refuses_too_is_dead_lettered(
    fake_time: list[float],
) -> None:
    """max_message_size below the message: neither copy can be written; reject, not a loop."""
    too_big = ChannelClosedError(406, "PRECONDITION_FAILED - message size 2000 is larger")
    rig = make_rig(fake_time, [too_big, too_big, too_big])
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    assert [exchange for _, exchange in rig.broker.published] == [
        "orders",
        "orders",
        QUARANTINE,
    ]
    assert consumer.rejected == [(7, False)]
    assert consumer.acked == []
    assert rig.sample("acemq_sidecar_dead_lettered_total") == 1
    assert rig.state.held == 0
    assert rig.state.in_flight == 0


async def test_a_channel_error_that_may_pass_is_retried_on_a_new_channel(
    fake_time: list[float],
) -> None:
    rig = make_rig(fake_time, [ChannelClosedError(541, "INTERNAL_ERROR"), PublishOutcome.CONFIRMED])
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    assert rig.broker.published == [(1, "orders"), (2, "orders")]
    assert consumer.acked == [7]
    assert rig.state.pause_reason is None  # resumed: nothing held


async def test_one_refusal_does_not_touch_the_other_deliveries(fake_time: list[float]) -> None:
    """Two in flight on the shared channel: one refusal, and neither delivery is requeued.

    The refused one's close fails the other's publish, which is simply published again.
    """
    rig = make_rig(
        fake_time,
        [
            ChannelClosedError(403, DENIED),  # tag 1 on the shared channel: closes it
            PublishOutcome.CONFIRMED,  # tag 2 retried alone? no: on the reopened shared one
            ChannelClosedError(403, DENIED),  # tag 1 alone: its own refusal
            PublishOutcome.CONFIRMED,  # tag 1's quarantine
        ],
    )
    consumer = rig.broker.consumer()
    first = asyncio.create_task(rig.settle(consumer, delivery(1)))
    await asyncio.sleep(0)
    # Tag 2 meets the closed shared channel: it is published again on a new one.
    await rig.settle(consumer, delivery(2))
    await first
    assert sorted(consumer.acked) == [1, 2]
    assert consumer.is_open
    assert rig.sample("acemq_sidecar_messages_total", outcome="relayed") == 1
    assert rig.sample("acemq_sidecar_messages_total", outcome="quarantined") == 1


async def test_nacked_copies_are_retried_a_bounded_number_of_times_then_quarantined(
    fake_time: list[float],
) -> None:
    """max_attempts 3: three nacked copies, two of them retries (counted), then quarantine."""
    limits = RouteLimits(nack_max_attempts=3, nack_max_s=1000.0, consumer_timeout_s=3600.0)
    answers: list[Answer] = [*[PublishOutcome.NACKED] * 3, PublishOutcome.CONFIRMED]
    rig = make_rig(fake_time, answers, limits=limits)
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    exchanges = [exchange for _, exchange in rig.broker.published]
    assert exchanges == ["orders", "orders", "orders", QUARANTINE]
    reason = rig.broker.headers[3][ERROR]
    assert "nacked" in reason
    assert "3 attempts" in reason
    assert consumer.acked == [7]
    assert rig.sample("acemq_sidecar_retried_copies_total") == 2
    assert rig.sample("acemq_sidecar_messages_total", outcome="quarantined") == 1


async def test_a_held_copy_goes_to_quarantine_before_the_consumer_timeout(
    fake_time: list[float],
) -> None:
    """consumer_timeout 5 s: the target nacks for 2.5 s, then the original is quarantined."""
    limits = RouteLimits(nack_max_attempts=1000, nack_max_s=1000.0, consumer_timeout_s=5.0)
    rig = make_rig(fake_time, [], limits=limits)
    rig.broker.by_exchange = {
        "orders": PublishOutcome.NACKED,
        QUARANTINE: PublishOutcome.CONFIRMED,
    }
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    assert fake_time[0] == pytest.approx(2.5)
    assert rig.broker.published[-1][1] == QUARANTINE
    assert consumer.acked == [7]


async def test_a_quarantine_nobody_takes_is_dead_lettered_before_the_consumer_timeout(
    fake_time: list[float],
) -> None:
    """The quarantine exchange returns the copy: at 3/4 of the timeout, reject(requeue=false)."""
    limits = RouteLimits(consumer_timeout_s=20.0)
    rig = make_rig(
        fake_time,
        [PublishOutcome.RETURNED] * 100,
        limits=limits,
        publishers=Publishers.APPS,
    )
    consumer = rig.broker.consumer()
    await rig.settle(consumer, delivery(7, {"x-acemq-tenant": "acme"}))
    assert fake_time[0] == pytest.approx(15.0)
    assert consumer.rejected == [(7, False)]
    assert rig.sample("acemq_sidecar_dead_lettered_total") == 1
    assert rig.state.pause_reason is None  # nothing held any more: the route is up


async def test_a_reject_on_a_channel_already_gone_leaves_the_delivery_to_the_broker(
    fake_time: list[float],
) -> None:
    """The consumer channel closed meanwhile: nothing is rejected or counted; it redelivers."""
    limits = RouteLimits(consumer_timeout_s=20.0)
    rig = make_rig(
        fake_time, [PublishOutcome.RETURNED] * 100, limits=limits, publishers=Publishers.APPS
    )
    consumer = rig.broker.consumer()
    consumer.is_open = False
    await asyncio.wait_for(rig.settle(consumer, delivery(7, {"x-acemq-tenant": "acme"})), 5)
    assert consumer.rejected == []
    assert consumer.acked == []
    assert rig.state.in_flight == 0


async def test_nothing_is_published_while_the_broker_blocks_the_connection(
    fake_time: list[float],
) -> None:
    """Blocked: the route says the broker's reason; unblocked, the copy goes and is acked."""
    rig = make_rig(fake_time, [PublishOutcome.CONFIRMED], blocked="low on memory")
    consumer = rig.broker.consumer()
    task = asyncio.create_task(rig.settle(consumer))
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.broker.published == []
    assert "low on memory" in str(rig.state.pause_reason)
    rig.connection.unblock()
    await asyncio.wait_for(task, 5)
    assert consumer.acked == [7]
    assert rig.state.pause_reason is None


async def test_a_stop_while_blocked_lets_the_delivery_go_without_publishing(
    fake_time: list[float],
) -> None:
    """SIGTERM during an alarm: no copy is written that could arrive later as a duplicate."""
    rig = make_rig(fake_time, [PublishOutcome.CONFIRMED], blocked="low on memory")
    consumer = rig.broker.consumer()
    task = asyncio.create_task(rig.settle(consumer))
    for _ in range(20):
        await asyncio.sleep(0)
    rig.state.stopping = True
    rig.stop.set()
    await asyncio.wait_for(task, 5)
    assert rig.broker.published == []
    assert consumer.acked == []
    assert rig.state.in_flight == 0


async def test_a_stop_during_a_hold_lets_go_and_counts_no_retried_copy(
    fake_time: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nacked copy is not published again, so no retried copy is counted."""
    rig = make_rig(fake_time, [PublishOutcome.NACKED, PublishOutcome.CONFIRMED])

    async def stopped_meanwhile(stop: asyncio.Event, delay_s: float) -> None:
        del delay_s
        stop.set()

    monkeypatch.setattr(settling_module, "sleep_unless", stopped_meanwhile)
    consumer = rig.broker.consumer()
    await rig.settle(consumer)
    assert rig.broker.published == [(1, "orders")]
    assert consumer.acked == []
    assert rig.sample("acemq_sidecar_retried_copies_total") == 0
    assert rig.state.held == 0
    assert rig.state.in_flight == 0


async def test_a_copy_waiting_for_an_unblock_is_not_overtaken_by_a_later_delivery(
    fake_time: list[float],
) -> None:
    """A delivery that arrives between the unblock and the waiting copy's wake-up goes after it.

    m-1 is published; m-2 waits while the broker blocks; m-3 arrives in the turns of the loop
    between the unblock and m-2's wake-up. The copies leave in the order the deliveries came.
    """
    rig = make_rig(fake_time, [])
    consumer = rig.broker.consumer()
    await rig.settle(consumer, delivery(1, {**CANONICAL, "x-acemq-id": "m-1"}))
    assert await rig.settler.tasks.wait(5)
    rig.connection.block("low on memory")
    rig.settler.offer(consumer, delivery(2, {**CANONICAL, "x-acemq-id": "m-2"}))
    assert len(rig.settler.tasks) == 1  # blocked: it waits in a task
    for _ in range(20):
        await asyncio.sleep(0)
    rig.connection.unblock()
    rig.settler.offer(consumer, delivery(3, {**CANONICAL, "x-acemq-id": "m-3"}))
    assert await rig.settler.tasks.wait(5)
    await asyncio.wait_for(rig.state.idle.wait(), 5)
    assert [headers["x-acemq-id"] for headers in rig.broker.headers] == ["m-1", "m-2", "m-3"]
    assert sorted(consumer.acked) == [1, 2, 3]


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "held"])
async def test_a_delivery_waiting_lets_go_when_its_channel_closes(
    fake_time: list[float], monkeypatch: pytest.MonkeyPatch, *, blocked: bool
) -> None:
    """The broker took the delivery back (its consumer_timeout): its body is not kept waiting.

    A delivery waits for an unblock or a hold's delay; its consumer channel closes meanwhile.
    It is let go at once (the broker redelivers it), not when the wait ends.
    """
    rig = make_rig(fake_time, [PublishOutcome.NACKED], blocked="low on memory" if blocked else None)
    never = asyncio.Event()

    async def held_for_long(stop: asyncio.Event, delay_s: float) -> None:
        del stop, delay_s
        await never.wait()

    monkeypatch.setattr(settling_module, "sleep_unless", held_for_long)
    consumer = rig.broker.consumer()
    task = asyncio.create_task(rig.settle(consumer))
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.state.in_flight == 1
    await consumer.close()
    await asyncio.wait_for(task, 5)
    assert rig.state.in_flight == 0
    assert consumer.acked == []
    assert rig.broker.published == ([] if blocked else [(1, "orders")])


async def test_after_a_brokers_cancel_a_waiting_delivery_lets_go_once_the_channel_closes(
    fake_time: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel leaves the channel open (the wait goes on); its later close ends the wait."""
    rig = make_rig(fake_time, [], blocked="low on memory")
    consumer = rig.broker.consumer()
    task = asyncio.create_task(rig.settle(consumer))
    for _ in range(20):
        await asyncio.sleep(0)
    consumer.cancelled_by_broker()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting: what is in flight may yet be published and acked
    assert rig.state.in_flight == 1
    await consumer.close()
    await asyncio.wait_for(task, 5)
    assert rig.state.in_flight == 0
    assert consumer.acked == []
    assert rig.broker.published == []
