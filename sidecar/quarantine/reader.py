"""Reading a quarantine queue without changing it, for ``acemq-sidecar quarantine``.

Every message is consumed with manual acks and held unacked on its channel, a window per
channel, in the queue's order; the caller acks the ones it is done with (a replayed one,
after the broker confirmed its original back in staging) and ``QueueReader.close`` gives
every other one back to the broker, in order, and returns once the queue counts them ready
again (the broker requeues them after the close-ok, not before). A kill at any moment loses
nothing: the broker requeues what the connection held. ``sidecar.quarantine.tool`` lists
and replays what this module reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from sidecar.amqp import Channel, Connection, Delivery

__all__ = [
    "CHANNELS_TARGET",
    "INTERRUPTIONS",
    "PREFETCH_MAX",
    "Held",
    "QuarantineInputError",
    "QueueReader",
    "queue_depth",
    "window_for",
]

PREFETCH_MAX: Final = 65_535  # basic.qos's prefetch-count is 16 bits; 0 would mean no limit
WINDOW_MIN: Final = 1_000  # deliveries one channel holds unacked (memory: a window of bodies)
CHANNELS_TARGET: Final = 1_000  # below RabbitMQ's default channel_max (2047)
IDLE_S: Final = 2.0  # no delivery this long: ask the broker whether any is left to come
UNANSWERED_MAX: Final = 5  # passive declares in a row that say nothing: the reading ends
# After the channels close: how long to wait for the queue to count what they held as ready
# again (milliseconds on a quiet broker, seconds under load), and how often to ask.
RETURN_WAIT_S: Final = 10.0
RETURN_POLL_S: Final = 0.02


class QuarantineInputError(SidecarError):
    """The command cannot act as asked: a queue that does not exist, a bad destination."""


async def queue_depth(connection: Connection, queue: str) -> tuple[int, int]:
    """Return (messages ready, consumers); raise QuarantineInputError if there is no queue."""
    try:
        counts = await connection.declare_passive(queue)
    except MissingEntityError as e:
        raise QuarantineInputError(
            f'queue "{queue}" does not exist (check the name: `rabbitmqctl list_queues name`)'
        ) from e
    return counts.messages, counts.consumers


# What can end a reading half-way; what was not acked is back in the queue.
INTERRUPTIONS: Final = (ChannelLostError, ConnectionError, QuarantineInputError)


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery held unacked on its channel: ack it (``QueueReader.ack``), or leave it."""

    channel: Channel
    delivery: Delivery
    window: int  # the position of its channel in the reader's


def window_for(total: int) -> int:
    """Return how many deliveries one channel holds: bounded memory, a bounded channel count.

    Every message read stays unacked, so each channel's prefetch fills once and the next
    channel takes the next window; ``basic.qos`` caps a window at 65,535.
    """
    return max(1, min(PREFETCH_MAX, total, max(WINDOW_MIN, -(-total // CHANNELS_TARGET))))


class QueueReader:
    """Deliver the first ``total`` messages of a queue in its order, holding every one.

    One consumer at a time: a channel consumes until it has taken its window, then its
    consumer is cancelled (its deliveries stay unacked on it) and the next channel takes
    the next window, so deliveries arrive in the queue's order. ``close`` closes the
    channels in the order they were opened, so the broker puts them back in that order.
    """

    def __init__(self, connection: Connection, queue: str, *, total: int, tag: str) -> None:
        self._connection = connection
        self._queue = queue
        self._total = total
        self._tag = tag
        self._channels: list[Channel] = []
        self._unacked: list[int] = []  # per channel: deliveries it holds
        self.read = 0
        self.shrank = False  # the queue held fewer messages than counted at the start
        self.not_back = 0  # held when the channels closed, not counted ready again in time

    async def deliveries(self) -> AsyncGenerator[Held, None]:
        """Yield held deliveries until ``total`` came, or the queue has none left to give."""
        window = window_for(self._total)
        while self.read < self._total:
            want = min(window, self._total - self.read)
            channel = await self._connection.channel(prefetch=want)
            self._channels.append(channel)
            self._unacked.append(0)
            window_index = len(self._channels) - 1
            inbox: asyncio.Queue[Delivery] = asyncio.Queue()
            tag = f"{self._tag}.{len(self._channels)}"
            await channel.consume(self._queue, _Inbox(inbox), consumer_tag=tag)
            taken = 0
            while taken < want:
                delivery = await self._next(inbox, channel)
                if delivery is None:
                    self.shrank = True
                    return
                taken += 1
                self.read += 1
                self._unacked[window_index] += 1
                yield Held(channel, delivery, window_index)
            await channel.cancel(tag)
            # What the broker sent before the cancel (acks freed room in the window) is the
            # queue's next messages: they come before the next channel's.
            while not inbox.empty() and self.read < self._total:
                self.read += 1
                self._unacked[window_index] += 1
                yield Held(channel, inbox.get_nowait(), window_index)

    async def _next(self, inbox: asyncio.Queue[Delivery], channel: Channel) -> Delivery | None:
        unanswered = 0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_S):
                    return await inbox.get()
            if not channel.is_open:
                raise ChannelLostError(f"the channel closed while reading {self._queue!r}")
            # Nothing for a while: if nothing is ready either, the queue shrank (another
            # consumer, an expiry) and no more will come.
            ready, consumers = await queue_depth(self._connection, self._queue)
            if consumers == 0:
                # Not the queue's answer: this reader consumes it. A quorum queue's leader
                # slower than RabbitMQ's 250 ms for a passive declare reads as 0 and 0.
                unanswered += 1
                if unanswered >= UNANSWERED_MAX:
                    raise ChannelLostError(
                        f"the broker did not say what {self._queue!r} holds"
                        f" ({unanswered} passive declares answered 0 messages, 0 consumers)"
                    )
                continue
            if ready == 0 and inbox.empty():
                return None

    async def ack(self, held: Held) -> bool:
        """Ack a delivery on its channel; False when the channel is gone (it went back)."""
        if not await held.channel.ack(held.delivery.delivery_tag):
            return False
        self._unacked[held.window] -= 1
        return True

    async def close(self) -> None:
        """Close every channel, oldest first, so that what was not acked goes back in order.

        Then wait (``RETURN_WAIT_S`` at most) until the queue counts it ready again: the
        broker answers the close first and requeues after, so a command started the moment
        this one ends would otherwise not see those messages. ``not_back`` says how many
        were still missing (another consumer may have taken them meanwhile).
        """
        returning = sum(n for c, n in zip(self._channels, self._unacked, strict=True) if c.is_open)
        ready_before = await self._ready() if returning else None
        for channel in self._channels:
            await channel.close()
        if ready_before is None:
            return
        expected = ready_before + returning
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETURN_WAIT_S
        while (ready := await self._ready()) is not None and ready < expected:
            if loop.time() >= deadline:
                self.not_back = expected - ready
                return
            await asyncio.sleep(RETURN_POLL_S)

    async def _ready(self) -> int | None:
        """Return the queue's ready count; None when it cannot be read (the connection is gone)."""
        try:
            ready, _ = await queue_depth(self._connection, self._queue)
        except INTERRUPTIONS:
            return None
        return ready


class _Inbox:
    """The reader's consumer: each delivery queued as its last frame is read.

    So that after ``basic.cancel`` returns, every delivery sent before it is in the inbox.
    """

    __slots__ = ("_inbox",)

    def __init__(self, inbox: asyncio.Queue[Delivery]) -> None:
        self._inbox = inbox

    def deliver(self, delivery: Delivery) -> None:
        """Queue the delivery."""
        self._inbox.put_nowait(delivery)

    def body_size(self, size: int) -> None:
        """Ignore it: the reader holds a window of whole messages, whatever their sizes."""
