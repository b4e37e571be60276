"""QueueReader against a scripted connection: when it stops reading, when it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from sidecar.amqp import ChannelLostError, DeliveryConsumer
from sidecar.quarantine import reader as quarantine_reader
from sidecar.quarantine.reader import QueueReader
from sidecar.wire import Delivery


def delivery(tag: int) -> Delivery:
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="orders",
        redelivered=False,
        properties=MappingProxyType({"message_id": f"m-{tag}"}),
        headers=MappingProxyType({}),
        body=b"body",
        undecodable=None,
    )


@dataclass
class Counts:
    """What a passive declare answers."""

    messages: int
    consumers: int


@dataclass
class FakeChannel:
    """A channel that hands the queue's first ``at_once`` messages to its consumer."""

    broker: FakeBroker
    consumer: DeliveryConsumer | None = None
    is_open: bool = True
    held: list[int] = field(default_factory=list)

    async def consume(self, _queue: str, consumer: DeliveryConsumer, *, consumer_tag: str) -> None:
        """Start the consumer: the first ``at_once`` messages come at once."""
        assert consumer_tag
        self.consumer = consumer
        for tag in self.broker.take(self.broker.at_once):
            await self.deliver(tag)

    async def deliver(self, tag: int) -> None:
        """Hand one message to the consumer, held unacked."""
        assert self.consumer is not None
        self.held.append(tag)
        self.consumer.deliver(delivery(tag))
        await asyncio.sleep(0)

    async def cancel(self, _tag: str) -> bool:
        """Cancel the consumer (nothing more comes)."""
        return True

    async def ack(self, tag: int) -> bool:
        """Ack one held message: it leaves the queue."""
        self.held.remove(tag)
        return True

    async def close(self) -> None:
        """Close: what it held goes back, as RabbitMQ does it, after the close-ok."""
        self.is_open = False
        self.broker.returning.extend(self.held)  # back in the queue, but not counted yet
        self.held.clear()


@dataclass
class FakeBroker:
    """One queue: its messages, what a passive declare answers, what comes back late."""

    messages: list[int]
    answers: Iterator[tuple[int, int]]
    at_once: int
    late: Callable[[FakeBroker], Coroutine[Any, Any, None]] | None = None
    channels: list[FakeChannel] = field(default_factory=list)
    returning: list[int] = field(default_factory=list)
    declares: int = 0

    def take(self, count: int) -> list[int]:
        """Take the queue's next messages for a consumer."""
        taken, self.messages = self.messages[:count], self.messages[count:]
        return taken

    async def channel(self, *, prefetch: int) -> FakeChannel:
        """Open a channel."""
        assert prefetch > 0
        channel = FakeChannel(self)
        self.channels.append(channel)
        return channel

    async def declare_passive(self, _queue: str) -> Counts:
        """Answer the next scripted counts (after letting a late delivery come, once)."""
        self.declares += 1
        if self.late is not None:
            late, self.late = self.late, None
            await late(self)
        return Counts(*next(self.answers))


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quarantine_reader, "IDLE_S", 0.01)
    monkeypatch.setattr(quarantine_reader, "RETURN_POLL_S", 0.001)


async def read_all(reader: QueueReader) -> list[int]:
    return [held.delivery.delivery_tag async for held in reader.deliveries()]


async def test_a_declare_that_answers_0_and_0_is_no_answer_the_reading_goes_on() -> None:
    """0 messages, 0 consumers (a quorum leader's stat timed out) while it consumes: ask again."""

    async def third_comes(broker: FakeBroker) -> None:
        asyncio.get_running_loop().call_soon(
            asyncio.ensure_future, broker.channels[0].deliver(broker.take(1)[0])
        )

    broker = FakeBroker([1, 2, 3], iter([(0, 0)]), at_once=2, late=third_comes)
    reader = QueueReader(broker, "q", total=3, tag="t")  # type: ignore[arg-type]
    assert await read_all(reader) == [1, 2, 3]
    assert not reader.shrank


async def test_a_queue_with_nothing_ready_and_this_consumer_shrank() -> None:
    """0 ready, 1 consumer (this one) and nothing delivered: the queue shrank."""
    broker = FakeBroker([1, 2], iter([(0, 1)]), at_once=2)
    reader = QueueReader(broker, "q", total=3, tag="t")  # type: ignore[arg-type]
    assert await read_all(reader) == [1, 2]
    assert reader.shrank


async def test_a_broker_that_never_answers_ends_the_reading() -> None:
    broker = FakeBroker([1], iter([(0, 0)] * 10), at_once=1)
    reader = QueueReader(broker, "q", total=2, tag="t")  # type: ignore[arg-type]
    with pytest.raises(ChannelLostError, match="did not say what"):
        await read_all(reader)
    assert broker.declares == quarantine_reader.UNANSWERED_MAX


async def test_close_returns_once_the_queue_counts_what_it_held() -> None:
    """Closed with 2 held (1 acked): back once the ready count rose by 2, not at the close-ok."""
    broker = FakeBroker([1, 2, 3], iter([(5, 0), (5, 0), (5, 0), (7, 0)]), at_once=3)
    reader = QueueReader(broker, "q", total=3, tag="t")  # type: ignore[arg-type]
    async for held in reader.deliveries():
        if held.delivery.delivery_tag == 2:
            assert await reader.ack(held)
    await reader.close()
    assert broker.returning == [1, 3]
    assert broker.declares == 4  # before the close, then until 5 + 2 ready
    assert reader.not_back == 0


async def test_close_gives_up_after_its_bound_and_says_how_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(quarantine_reader, "RETURN_WAIT_S", 0.05)
    broker = FakeBroker([1, 2], iter([(0, 0)] + [(1, 0)] * 10_000), at_once=2)
    reader = QueueReader(broker, "q", total=2, tag="t")  # type: ignore[arg-type]
    assert await read_all(reader) == [1, 2]
    await reader.close()
    assert reader.not_back == 1
