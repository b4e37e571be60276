"""A route's consumer on its channel, on its own: RouteConsumer against the fake broker.

What the channel hands it (each body size, then each delivery, from the frame handler),
what it hands the route's settler, what it acks and rejects through, and how long its
oldest delivery has waited. Its re-consume runs whole in test_relay_window.py, through
the worker.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from sidecar.amqp import AckChannel
from sidecar.relay.consumer import InFlightWindow, RouteConsumer
from sidecar.relay.state import RouteState
from tests.fakes import FakeBroker, FakeChannel
from tests.fakes.route import orders_route

if TYPE_CHECKING:
    from sidecar.wire import Delivery

BOUND_S = 10.0


class Settler:
    """The route's settler as the consumer sees it: it is handed each delivery."""

    def __init__(self) -> None:
        self.handed: list[tuple[AckChannel, Delivery]] = []
        self.arrived = asyncio.Event()

    def offer(self, consumer: AckChannel, delivery: Delivery) -> None:
        """Keep the delivery, and the channel to ack it on."""
        self.handed.append((consumer, delivery))
        self.arrived.set()


def consumer_on(
    channel: FakeChannel, settler: Settler, *, prefetch: int = 8, clock_s: list[float]
) -> tuple[RouteConsumer, InFlightWindow, RouteState]:
    orders = orders_route(monotonic=lambda: clock_s[0])
    window = InFlightWindow(prefetch=prefetch, budget_bytes=2**20)
    consumer = RouteConsumer(
        channel,
        route="orders",
        queue="staging.orders",
        window=window,
        state=orders.state,
        settle=settler.offer,
        clock=orders.context.clock,
    )
    return consumer, window, orders.state


async def handed(settler: Settler, n: int) -> None:
    """Wait until the settler was handed ``n`` deliveries."""
    async with asyncio.timeout(BOUND_S):
        while len(settler.handed) < n:
            settler.arrived.clear()
            await settler.arrived.wait()


async def opened(broker: FakeBroker, prefetch: int) -> FakeChannel:
    """A consuming channel of the fake broker, opened as the worker opens one."""
    return await broker.connection().channel(prefetch=prefetch)


async def test_each_delivery_goes_to_the_settler_with_the_consumer_to_ack_on() -> None:
    broker = FakeBroker(ready=deque([100, 200, 300]))
    channel = await opened(broker, 8)
    settler = Settler()
    consumer, _, _ = consumer_on(channel, settler, clock_s=[0.0])
    await consumer.start()
    await handed(settler, 3)
    assert [ack_on for ack_on, _ in settler.handed] == [consumer] * 3
    assert [len(delivery.body) for _, delivery in settler.handed] == [100, 200, 300]
    assert channel.budgets == [2**20]  # the window's byte budget went with the consume
    assert list(channel.consumers) == ["acemq-sidecar.orders"]


async def test_each_body_size_reaches_the_window_before_its_delivery() -> None:
    broker = FakeBroker(ready=deque([100, 5_000]))
    settler = Settler()
    window_start = InFlightWindow(prefetch=1000, budget_bytes=2**20).start()
    channel = await opened(broker, window_start)
    consumer, window, _ = consumer_on(channel, settler, prefetch=1000, clock_s=[0.0])
    window.start()
    await consumer.start()
    await handed(settler, 1)
    assert window.largest is not None
    assert window.largest >= len(settler.handed[0][1].body)
    assert window.wanted.is_set()  # slow start: a whole window seen, it may grow


async def test_the_oldest_unsettled_delivery_is_timed_until_it_is_acked() -> None:
    broker = FakeBroker(ready=deque([10, 10]))
    channel = await opened(broker, 8)
    settler = Settler()
    clock_s = [100.0]
    consumer, _, _ = consumer_on(channel, settler, clock_s=clock_s)
    assert consumer.oldest_unsettled_s() is None
    await consumer.start()
    await handed(settler, 2)
    clock_s[0] = 107.5
    assert consumer.oldest_unsettled_s() == 7.5
    first, second = (delivery.delivery_tag for _, delivery in settler.handed)
    assert await consumer.ack(first)
    assert consumer.try_ack(second) is True
    assert consumer.oldest_unsettled_s() is None
    assert channel.acked == [first, second]


async def test_acks_and_rejects_on_a_channel_gone_are_false_and_nothing_is_sent() -> None:
    broker = FakeBroker(ready=deque([10, 10]))
    channel = await opened(broker, 8)
    settler = Settler()
    consumer, _, _ = consumer_on(channel, settler, clock_s=[time.monotonic()])
    await consumer.start()
    await handed(settler, 2)
    await consumer.close()
    assert not consumer.is_open
    first, second = (delivery.delivery_tag for _, delivery in settler.handed)
    assert await consumer.ack(first) is False
    assert await consumer.reject(second, requeue=False) is False
    assert channel.acked == []
    assert channel.rejected == []
    assert channel.late == [first, second]


async def test_a_reject_reaches_the_channel_with_its_requeue() -> None:
    broker = FakeBroker(ready=deque([10]))
    channel = await opened(broker, 8)
    settler = Settler()
    consumer, _, _ = consumer_on(channel, settler, clock_s=[0.0])
    await consumer.start()
    await handed(settler, 1)
    tag = settler.handed[0][1].delivery_tag
    assert await consumer.reject(tag, requeue=True)
    assert channel.rejected == [(tag, True)]
    assert consumer.oldest_unsettled_s() is None


async def test_the_brokers_cancel_is_seen_and_the_channel_stays() -> None:
    broker = FakeBroker()
    channel = await opened(broker, 8)
    consumer, _, _ = consumer_on(channel, Settler(), clock_s=[0.0])
    await consumer.start()
    assert not consumer.cancelled_by_broker
    channel.cancelled_by_broker()
    assert await asyncio.wait_for(consumer.wait_closed(), BOUND_S) == (
        "the broker cancelled the consumer"
    )
    assert consumer.cancelled_by_broker
    assert consumer.is_open
