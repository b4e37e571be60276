"""The fake broker's queue, script and connection: what every fake channel shares.

The staging queue is a deque of body sizes the channels' consumers are sent from. Every
publish, on whichever channel, takes the answer for its exchange (``by_exchange``), else the
next scripted answer (``answers``), else it is confirmed; the confirm takes
``confirm_after_s``. Operations can be held half-way (``hold``), so a test can land a stop
at every point of a re-consume.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sidecar.wire import PublishOutcome
from tests.fakes.channel import FakeChannel
from tests.fakes.publish import Answer, Publish


@dataclass
class FakeBroker:
    """A staging queue of body sizes, the publish script, and every channel opened."""

    ready: deque[int] = field(default_factory=deque)
    answers: list[Answer] = field(default_factory=list)
    by_exchange: dict[str, Answer] | None = None  # before ``answers``: one per exchange
    published: list[tuple[int, str]] = field(default_factory=list)  # (channel, exchange)
    headers: list[dict[str, Any]] = field(default_factory=list)  # of each publish
    first_publish: asyncio.Event = field(default_factory=asyncio.Event)
    channels: list[FakeChannel] = field(default_factory=list)
    consuming: list[FakeChannel] = field(default_factory=list)  # those that consumed
    calls: list[tuple[str, object]] = field(default_factory=list)  # consumer channels only
    gates: dict[str, asyncio.Event] = field(default_factory=dict)  # op -> released
    reached: dict[str, asyncio.Event] = field(default_factory=dict)  # op -> it began
    seen: dict[str, int] = field(default_factory=dict)  # op -> times begun
    from_nth: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    requeued: int = 0
    returned: int = 0  # sent to a consumer cancelled before they arrived
    delivered: int = 0
    confirm_cancel: bool = True
    confirm_after_s: float = 0.0  # how long each publish waits for its confirm
    transit_s: float = 0.0005  # from the queue to the channel, give or take a half
    rng: random.Random = field(default_factory=lambda: random.Random(5))
    peak_in_flight: int = 0
    peak_bytes: int = 0
    peak_read_bytes: int = 0  # what the client held, read and unsettled
    peak_consumers: int = 0
    ids: itertools.count[int] = field(default_factory=itertools.count)
    all_acked: asyncio.Event = field(default_factory=asyncio.Event)
    total: int = 0

    def __post_init__(self) -> None:
        self.total = len(self.ready)

    @property
    def exchanges(self) -> list[str]:
        """The exchange of each publish, in order."""
        return [exchange for _, exchange in self.published]

    def answer(self, channel: int, publish: Publish) -> Answer:
        """Record ``publish`` on ``channel`` and give the broker's answer to it."""
        self.published.append((channel, publish.exchange))
        self.headers.append(publish.headers)
        if self.by_exchange is not None and publish.exchange in self.by_exchange:
            return self.by_exchange[publish.exchange]
        if self.answers:
            return self.answers.pop(0)
        return PublishOutcome.CONFIRMED

    def consumer(self, *, is_open: bool = True) -> FakeChannel:
        """A channel deliveries came on (number 0: apart from the publish channels)."""
        return FakeChannel(self, 0, is_open=is_open)

    def connection(self, *, one_channel: FakeChannel | None = None) -> FakeConnection:
        """A connection; every ``channel()`` of it is a new one, or ``one_channel``."""
        return FakeConnection(self, one_channel=one_channel)

    async def gate(self, op: str) -> None:
        """Say that ``op`` began; wait while the test holds it (from its nth time on)."""
        self.seen[op] = seen = self.seen.get(op, 0) + 1
        if seen >= self.from_nth.get(op, 1):
            self.reached.setdefault(op, asyncio.Event()).set()
            if (gate := self.gates.get(op)) is not None:
                await gate.wait()
        await asyncio.sleep(0)

    def hold(self, op: str, *, nth: int = 1) -> asyncio.Event:
        """Hold ``op`` half-way, from its ``nth`` time on, until the event returned is set."""
        self.gates[op] = gate = asyncio.Event()
        self.from_nth[op] = nth
        return gate

    def live_consumers(self) -> int:
        """Consumers on open channels, as ``rabbitmqctl list_consumers`` would count them."""
        return sum(len(c.consumers) for c in self.channels if c.is_open)

    def dispatch(self) -> None:
        """Deliver to every consumer with room, as the broker does, then note the peaks."""
        for channel in self.channels:
            if channel.is_open:
                channel.dispatch()
        self.note_peaks()

    def note_peaks(self) -> None:
        """Keep the most deliveries, bytes and consumers seen at once."""
        in_flight = [size for c in self.channels if c.is_open for _, size in c.unacked.values()]
        self.peak_in_flight = max(self.peak_in_flight, len(in_flight))
        self.peak_bytes = max(self.peak_bytes, sum(in_flight))
        self.peak_consumers = max(self.peak_consumers, self.live_consumers())


@dataclass
class FakeConnection:
    """A connection to the fake broker: blocked while it is, every channel() a new one."""

    broker: FakeBroker
    is_open: bool = True
    blocked_reason: str | None = None
    one_channel: FakeChannel | None = None  # every channel() is this one when set
    opened: list[FakeChannel] = field(default_factory=list)
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def block(self, reason: str) -> None:
        """The broker blocks publishing (``connection.blocked``)."""
        self.blocked_reason = reason
        self.unblocked.clear()

    def unblock(self) -> None:
        """The alarm clears (``connection.unblocked``)."""
        self.blocked_reason = None
        self.unblocked.set()

    async def wait_closed(self) -> BaseException | None:
        """Never, unless the test closes it."""
        await self.closed.wait()
        return None

    async def wait_unblocked(self) -> None:
        """Return once unblocked (at once if not blocked)."""
        if self.blocked_reason is not None:
            await self.unblocked.wait()

    async def check_queue(self, name: str) -> None:
        """Every queue exists."""

    async def check_exchange(self, name: str) -> None:
        """Every exchange exists."""

    async def channel(self, *, prefetch: int) -> FakeChannel:
        """A new channel with the prefetch its first consumer takes (or the one channel)."""
        if self.one_channel is not None:
            channel = self.one_channel
        else:
            channel = FakeChannel(self.broker, len(self.opened) + 1, next_prefetch=prefetch)
            self.broker.channels.append(channel)
            channel.calls.append(("open", prefetch))
        self.opened.append(channel)
        return channel
