"""The consuming side of a fake channel: the broker's dispatch, transit and the client's read.

A consumer's prefetch is taken at ``basic.consume`` from the channel's last ``basic.qos``; a
delivery on its way when its consumer was cancelled goes back to the queue, as a quorum
queue returns it (``returned``); on a closed channel it is requeued. As the client does,
the channel reads no delivery while those read and unsettled hold its byte budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sidecar.wire import Delivery, Int32, Int64

if TYPE_CHECKING:
    import itertools

    from sidecar.amqp import DeliveryConsumer
    from tests.fakes.broker import FakeBroker

CANONICAL: dict[str, Any] = {
    "x-acemq-type": "order.placed",
    "x-acemq-version": Int32(1),
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
}


def delivery(tag: int, message: int, size: int) -> Delivery:
    """A canonical delivery of ``size`` bytes, as the staging queue holds them."""
    headers = {**CANONICAL, "x-acemq-id": f"m-{message}", "x-acemq-correlation": f"m-{message}"}
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": f"m-{message}"}),
        headers=MappingProxyType(headers),
        body=b"x" * size,
    )


@dataclass
class Subscription:
    """One ``basic.consume`` on a fake channel."""

    prefetch: int
    consumer: DeliveryConsumer


class Consuming:
    """The delivering half of :class:`~tests.fakes.channel.FakeChannel`."""

    broker: FakeBroker
    is_open: bool
    consumers: dict[str, Subscription]
    unacked: dict[int, tuple[str, int]]
    tags: itertools.count[int]
    transit: dict[str, int]
    budgets: list[int | None]
    unread: deque[tuple[int, int, Subscription]]
    read_bytes: int
    carried_bytes: int

    def has_room(self) -> bool:
        """Whether the client reads the next delivery: what it read and holds is in budget."""
        budget = self.budgets[-1] if self.budgets else None
        return budget is None or self.read_bytes + self.carried_bytes < budget

    def carry(self, delta: int) -> None:
        """Count bytes the consumer holds elsewhere against the budget; read on if freed."""
        self.carried_bytes += delta
        self.read()

    def read(self) -> None:
        """The client reads what waits, in order, while it has room."""
        while self.unread and self.is_open and self.has_room():
            delivery_tag, size, consumer = self.unread.popleft()
            self.read_bytes += size
            held = self.read_bytes + self.carried_bytes
            self.broker.peak_read_bytes = max(self.broker.peak_read_bytes, held)
            consumer.consumer.body_size(size)
            message = next(self.broker.ids)
            consumer.consumer.deliver(delivery(delivery_tag, message, size))

    def dispatch(self) -> None:
        """Send to each consumer while it has credit: its prefetch less what it holds."""
        loop = asyncio.get_running_loop()
        for tag, consumer in self.consumers.items():
            while self.broker.ready and self.holds(tag) < consumer.prefetch:
                self.transit[tag] = self.transit.get(tag, 0) + 1
                size = self.broker.ready.popleft()
                transit_s = self.broker.transit_s * (0.5 + self.broker.rng.random())
                loop.call_later(transit_s, self.arrive, tag, size)

    def holds(self, tag: str) -> int:
        """What a consumer uses of its credit: deliveries on their way, and unacked."""
        unacked = sum(1 for owner, _ in self.unacked.values() if owner == tag)
        return unacked + self.transit.get(tag, 0)

    def arrive(self, tag: str, size: int) -> None:
        """A delivery reaches the channel ``transit_s`` after the queue sent it.

        For a tag cancelled meanwhile it goes back to the queue, as a quorum queue's
        channel returns it (a delivery attempt spent); on a closed channel, requeued.
        """
        self.transit[tag] -= 1
        consumer = self.consumers.get(tag)
        if consumer is None or not self.is_open:
            self.broker.ready.appendleft(size)
            if self.is_open:
                self.broker.returned += 1
            else:
                self.broker.requeued += 1
            return
        delivery_tag = next(self.tags)
        self.unacked[delivery_tag] = (tag, size)
        self.broker.delivered += 1
        self.broker.note_peaks()
        self.unread.append((delivery_tag, size, consumer))
        self.read()
