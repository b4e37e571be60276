"""The fake broker's channel: it consumes with a per-consumer prefetch, publishes, acks.

It keeps what RabbitMQ keeps: a prefetch per consumer taken at ``basic.consume`` from the
channel's last ``basic.qos``, delivery tags per channel, a cancelled consumer's deliveries
unacked until acked (a close requeues them), and, as a quorum queue does, a delivery on its
way when its consumer was cancelled goes back to the queue (``returned``). As the client
does, it reads no delivery while those read and unsettled hold its byte budget. A publish
on a closed channel is lost; a ChannelClosedError answer closes it, as the broker does.
Acks and rejects count while it is open and return False after (those are kept in ``late``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sidecar.amqp import ChannelClosedError, ChannelLostError
from sidecar.wire import Delivery, Int32, Int64
from tests.fakes.publish import Answer, Publish, PublishRecorder

if TYPE_CHECKING:
    from tests.fakes.broker import FakeBroker

Callback = Callable[[Delivery], Coroutine[Any, Any, None]]
TASKS: set[asyncio.Task[None]] = set()
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
    callback: Callback
    on_body_size: Callable[[int], None] | None


@dataclass
class FakeChannel(PublishRecorder):
    """A confirm-mode channel of the fake broker."""

    broker: FakeBroker
    number: int
    next_prefetch: int = 0
    is_open: bool = True
    consumer_cancelled: bool = False
    consumers: dict[str, Subscription] = field(default_factory=dict)
    unacked: dict[int, tuple[str, int]] = field(default_factory=dict)  # tag -> (consumer, size)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = "channel closed"
    tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    calls: list[tuple[str, object]] = field(default_factory=list)
    transit: dict[str, int] = field(default_factory=dict)  # consumer -> sent, not arrived
    live_at_close: int | None = None
    budgets: list[int | None] = field(default_factory=list)  # each consume's byte budget
    consuming: bool = False
    # Sent by the broker, in order, not read by the client (its budget is full).
    unread: deque[tuple[int, int, Subscription]] = field(default_factory=deque)
    read_bytes: int = 0  # the bodies read and not yet settled
    sent: list[Publish] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    rejected: list[tuple[int, bool]] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # acks and rejects after it closed

    @property
    def exchanges(self) -> list[str]:
        """The exchange of each publish on this channel."""
        return [publish.exchange for publish in self.sent]

    def has_room(self) -> bool:
        """Whether the client reads the next delivery: what it read and holds is in budget."""
        budget = self.budgets[-1] if self.budgets else None
        return budget is None or self.read_bytes < budget

    def read(self) -> None:
        """The client reads what waits, in order, while it has room."""
        while self.unread and self.is_open and self.has_room():
            delivery_tag, size, consumer = self.unread.popleft()
            self.read_bytes += size
            self.broker.peak_read_bytes = max(self.broker.peak_read_bytes, self.read_bytes)
            if consumer.on_body_size is not None:
                consumer.on_body_size(size)
            message = next(self.broker.ids)
            task = asyncio.get_running_loop().create_task(
                consumer.callback(delivery(delivery_tag, message, size))
            )
            TASKS.add(task)
            task.add_done_callback(TASKS.discard)

    def record(self, op: str, arg: object) -> None:
        """Keep what the route asked of this channel, and of all the consumer channels."""
        self.calls.append((op, arg))
        self.broker.calls.append((op, arg))

    async def qos(self, prefetch_count: int) -> None:
        """Set the prefetch of later consumers."""
        self.record("qos", prefetch_count)
        await self.broker.gate("qos")
        self.next_prefetch = prefetch_count

    async def consume(
        self,
        queue: str,
        callback: Callback,
        *,
        consumer_tag: str,
        on_body_size: Callable[[int], None] | None = None,
        max_in_flight_bytes: int | None = None,
    ) -> None:
        """Start a consumer as the frame is sent; the test may hold back the consume-ok."""
        del queue
        self.budgets.append(max_in_flight_bytes)
        assert self.is_open
        assert consumer_tag not in self.consumers, f"tag {consumer_tag} reused on the channel"
        if not self.consuming:  # a consumer channel from now on: its open counts too
            self.consuming = True
            self.broker.consuming.append(self)
            self.broker.calls.append(self.calls[0])
        self.record("consume", consumer_tag)
        self.consumers[consumer_tag] = Subscription(self.next_prefetch, callback, on_body_size)
        asyncio.get_running_loop().call_soon(self.broker.dispatch)
        await self.broker.gate("consume")

    async def cancel(self, consumer_tag: str, *, on_sent: Callable[[], None] | None = None) -> bool:
        """Cancel as the frame is sent; the cancel-ok comes after what waits unread.

        The test may hold back the cancel-ok.
        """
        if self.consumer_cancelled:
            return True
        self.record("cancel", consumer_tag)
        if on_sent is not None:
            on_sent()
        if not self.broker.confirm_cancel:
            await asyncio.sleep(0)
            return False
        self.consumers.pop(consumer_tag, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0  # the client's CLOSE_TIMEOUT_S
        while self.unread:
            if loop.time() > deadline or not self.is_open:
                return False
            await asyncio.sleep(0.001)
        await self.broker.gate("cancel")
        return True

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

    async def answer(self, publish: Publish) -> Answer:
        """The broker's answer, after its confirm delay; a channel error closes the channel."""
        if not self.is_open:
            raise ChannelLostError("channel closed")
        self.sent.append(publish)
        answer = self.broker.answer(self.number, publish)
        await asyncio.sleep(self.broker.confirm_after_s)
        self.broker.first_publish.set()
        if isinstance(answer, ChannelClosedError):
            self.is_open = False
        return answer

    async def ack(self, delivery_tag: int) -> bool:
        """Ack a delivery of any consumer of the channel, cancelled or not."""
        if not self.is_open:
            self.late.append(delivery_tag)
            return False
        self.acked.append(delivery_tag)
        if (held := self.unacked.pop(delivery_tag, None)) is not None:
            self.read_bytes -= held[1]
            asyncio.get_running_loop().call_soon(self.read)
            self.broker.acked += 1
            if self.broker.acked == self.broker.total:
                self.broker.all_acked.set()
            asyncio.get_running_loop().call_soon(self.broker.dispatch)
        return True

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Record the reject while open; False once the channel is gone."""
        if not self.is_open:
            self.late.append(delivery_tag)
            return False
        self.rejected.append((delivery_tag, requeue))
        return True

    async def wait_closed(self) -> str:
        """Return once closed, or once the broker cancelled the consumer."""
        await self.ended.wait()
        return self.reason

    def cancelled_by_broker(self) -> None:
        """The queue was deleted: every consumer of the channel is gone, the channel stays."""
        self.consumer_cancelled = True
        self.consumers.clear()
        self.reason = "the broker cancelled the consumer"
        self.ended.set()

    def closed_by_broker(self, reason: str) -> None:
        """The broker closes the channel (its channel.close): unacked deliveries go back."""
        self.reason = reason
        self.close_now()

    async def close(self) -> None:
        """Close: what is unacked goes back to the queue."""
        self.close_now()

    def close_now(self) -> None:
        """Close at once: what is unacked goes back to the queue."""
        if not self.is_open:
            return
        self.is_open = False
        self.live_at_close = len(self.consumers)
        self.broker.requeued += len(self.unacked)
        self.broker.ready.extendleft(size for _, size in reversed(self.unacked.values()))
        self.unacked.clear()
        self.unread.clear()
        self.read_bytes = 0
        self.consumers.clear()
        self.ended.set()
        asyncio.get_running_loop().call_soon(self.broker.dispatch)
