"""The fake broker's channel: it consumes (see :mod:`tests.fakes.consuming`), publishes, acks.

Delivery tags are per channel; a cancelled consumer's deliveries stay unacked until acked,
and a close requeues them. A publish on a closed channel is lost; a ChannelClosedError
answer closes it, as the broker does. Acks and rejects count while it is open and return
False after (those are kept in ``late``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.amqp import ChannelClosedError, ChannelLostError
from tests.fakes.consuming import Consuming, Subscription
from tests.fakes.publish import Answer, Publish, PublishRecorder

if TYPE_CHECKING:
    from sidecar.amqp import DeliveryConsumer
    from tests.fakes.broker import FakeBroker


@dataclass
class FakeChannel(Consuming, PublishRecorder):
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
    carried_bytes: int = 0  # held for the consumer elsewhere (``carry``)
    sent: list[Publish] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    rejected: list[tuple[int, bool]] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # acks and rejects after it closed

    @property
    def exchanges(self) -> list[str]:
        """The exchange of each publish on this channel."""
        return [publish.exchange for publish in self.sent]

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
        consumer: DeliveryConsumer,
        *,
        consumer_tag: str,
        max_in_flight_bytes: int | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        """Start a consumer as the frame is sent; the test may hold back the consume-ok.

        Its bodies are held whatever their size: ``max_body_bytes`` is the client's, tested
        on the real broker.
        """
        del queue, max_body_bytes
        self.budgets.append(max_in_flight_bytes)
        assert self.is_open
        assert consumer_tag not in self.consumers, f"tag {consumer_tag} reused on the channel"
        if not self.consuming:  # a consumer channel from now on: its open counts too
            self.consuming = True
            self.broker.consuming.append(self)
            self.broker.calls.append(self.calls[0])
        self.record("consume", consumer_tag)
        self.consumers[consumer_tag] = Subscription(self.next_prefetch, consumer)
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

    def passing_body(self, delivery_tag: int) -> None:
        """No body passes through the fake: it holds them all."""
        del delivery_tag

    async def ack(self, delivery_tag: int) -> bool:
        """Ack a delivery of any consumer of the channel, cancelled or not."""
        return self.try_ack(delivery_tag)

    def try_ack(self, delivery_tag: int) -> bool:
        """Ack as ``ack`` does, without a coroutine."""
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

    async def wait_gone(self) -> None:
        """Return once closed; a broker's cancel alone leaves the channel open.

        The fake's ``is_open`` is set by tests as well as by its close: it is looked at
        again after each end, and every 10 ms once the broker cancelled.
        """
        while self.is_open:
            if self.ended.is_set():
                await asyncio.sleep(0.01)
            else:
                await self.ended.wait()

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
