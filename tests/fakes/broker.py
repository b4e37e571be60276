"""An in-memory broker for the relay's unit tests: scripted answers, channels, a block.

Every publish, on whichever channel, takes the next scripted answer (or the answer for its
exchange); an exception answer is raised as the client raises it, and a ChannelClosedError
closes the channel, as the broker closes it. Acks and rejects count while their channel is
open and return False after, as the client does; the late ones are kept apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.amqp import ChannelClosedError, ChannelLostError
from tests.fakes.publish import Answer, Publish, PublishRecorder


@dataclass
class FakeBroker:
    """The script every channel answers from, and what the broker was sent."""

    answers: list[Answer] = field(default_factory=list)
    by_exchange: dict[str, Answer] | None = None  # instead of ``answers``: one per exchange
    published: list[tuple[int, str]] = field(default_factory=list)  # (channel, exchange)
    headers: list[dict[str, Any]] = field(default_factory=list)
    blocked_reason: str | None = None
    first_publish: asyncio.Event = field(default_factory=asyncio.Event)
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def exchanges(self) -> list[str]:
        """The exchange of each publish, in order."""
        return [exchange for _, exchange in self.published]

    def answer(self, channel: int, publish: Publish) -> Answer:
        """Record ``publish`` on ``channel`` and give its scripted answer."""
        self.published.append((channel, publish.exchange))
        self.headers.append(publish.headers)
        if self.by_exchange is not None:
            return self.by_exchange[publish.exchange]
        return self.answers.pop(0)

    def block(self, reason: str) -> None:
        """The broker blocks publishing (``connection.blocked``)."""
        self.blocked_reason = reason
        self.unblocked.clear()

    def unblock(self) -> None:
        """The alarm clears."""
        self.blocked_reason = None
        self.unblocked.set()

    def consumer(self, *, is_open: bool = True) -> FakeChannel:
        """The channel deliveries come on (number 0: apart from the publish channels)."""
        return FakeChannel(self, 0, is_open=is_open)

    def connection(self, *, one_channel: FakeChannel | None = None) -> FakeConnection:
        """A connection; every ``channel()`` of it is a new one, or ``one_channel``."""
        return FakeConnection(self, one_channel=one_channel)


@dataclass
class FakeChannel(PublishRecorder):
    """A channel that publishes on the broker's script, acks, rejects and closes."""

    broker: FakeBroker
    number: int
    is_open: bool = True
    consumer_cancelled: bool = False
    sent: list[Publish] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    rejected: list[tuple[int, bool]] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # acks and rejects after it closed
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def exchanges(self) -> list[str]:
        """The exchange of each publish on this channel."""
        return [publish.exchange for publish in self.sent]

    async def answer(self, publish: Publish) -> Answer:
        """The broker's answer; a closed channel is lost, a channel error closes it."""
        if not self.is_open:
            raise ChannelLostError("channel closed")
        self.sent.append(publish)
        answer = self.broker.answer(self.number, publish)
        await asyncio.sleep(0)
        self.broker.first_publish.set()
        if isinstance(answer, ChannelClosedError):
            self.is_open = False
        return answer

    async def consume(
        self,
        queue: str,
        callback: Any,
        *,
        consumer_tag: str,
        on_body_size: Callable[[int], None] | None = None,
        max_in_flight_bytes: int | None = None,
    ) -> None:
        """Not delivered by this broker: the tests hand the settler its deliveries."""
        raise NotImplementedError

    async def cancel(self, consumer_tag: str, *, on_sent: Callable[[], None] | None = None) -> bool:
        """Not delivered by this broker."""
        raise NotImplementedError

    def has_room(self) -> bool:
        """Always: no byte budget here."""
        return True

    async def qos(self, prefetch_count: int) -> None:
        """Not delivered by this broker."""
        raise NotImplementedError

    async def ack(self, delivery_tag: int) -> bool:
        """Record the ack while open; False once the channel is gone."""
        if not self.is_open:
            self.late.append(delivery_tag)
            return False
        self.acked.append(delivery_tag)
        return True

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Record the reject while open; False once the channel is gone."""
        if not self.is_open:
            self.late.append(delivery_tag)
            return False
        self.rejected.append((delivery_tag, requeue))
        return True

    async def wait_closed(self) -> str:
        """Return once the channel closes (the broker took it away)."""
        await self.ended.wait()
        return "delivery acknowledgement timed out"

    async def close(self) -> None:
        """Close the channel."""
        self.is_open = False
        self.ended.set()


@dataclass
class FakeConnection:
    """A connection to the fake broker: blocked while it is, channels on its script."""

    broker: FakeBroker
    is_open: bool = True
    one_channel: FakeChannel | None = None  # every channel() is this one when set
    opened: list[FakeChannel] = field(default_factory=list)

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason while it blocks publishing."""
        return self.broker.blocked_reason

    async def wait_unblocked(self) -> None:
        """Return once the broker unblocks (at once if it does not block)."""
        if self.broker.blocked_reason is not None:
            await self.broker.unblocked.wait()

    async def wait_closed(self) -> BaseException | None:
        """Not closed by this broker."""
        raise NotImplementedError

    async def check_queue(self, name: str) -> None:
        """Every queue exists."""

    async def check_exchange(self, name: str) -> None:
        """Every exchange exists."""

    async def channel(self, *, prefetch: int) -> FakeChannel:
        """A new channel on the broker (or the one channel), whatever the prefetch."""
        del prefetch
        channel = self.one_channel or FakeChannel(self.broker, len(self.opened) + 1)
        self.opened.append(channel)
        return channel
