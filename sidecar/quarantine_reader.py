"""Reading a quarantine queue without changing it, for ``acemq-sidecar quarantine``.

Every message is consumed with manual acks and held unacked on its channel, a window per
channel, in the queue's order; the caller acks the ones it is done with (a replayed one,
after the broker confirmed its original back in staging) and ``QueueReader.close`` gives
every other one back to the broker, in order. A kill at any moment loses nothing: the
broker requeues what the connection held. ``sidecar.quarantine_tool`` lists and replays
what this module reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Coroutine
    from typing import Any

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
    """A delivery held unacked on its channel: ack it there, or leave it to go back."""

    channel: Channel
    delivery: Delivery


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
        self.read = 0
        self.shrank = False  # the queue held fewer messages than counted at the start

    async def deliveries(self) -> AsyncGenerator[Held, None]:
        """Yield held deliveries until ``total`` came, or the queue has none left to give."""
        window = window_for(self._total)
        while self.read < self._total:
            want = min(window, self._total - self.read)
            channel = await self._connection.channel(prefetch=want)
            self._channels.append(channel)
            inbox: asyncio.Queue[Delivery] = asyncio.Queue()
            tag = f"{self._tag}.{len(self._channels)}"
            await channel.consume(self._queue, _into(inbox), consumer_tag=tag)
            taken = 0
            while taken < want:
                delivery = await self._next(inbox, channel)
                if delivery is None:
                    self.shrank = True
                    return
                taken += 1
                self.read += 1
                yield Held(channel, delivery)
            await channel.cancel(tag)
            # What the broker sent before the cancel (acks freed room in the window) is the
            # queue's next messages: they come before the next channel's.
            while not inbox.empty() and self.read < self._total:
                self.read += 1
                yield Held(channel, inbox.get_nowait())

    async def _next(self, inbox: asyncio.Queue[Delivery], channel: Channel) -> Delivery | None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_S):
                    return await inbox.get()
            if not channel.is_open:
                raise ChannelLostError(f"the channel closed while reading {self._queue!r}")
            # Nothing for a while: if nothing is ready either, the queue shrank (another
            # consumer, an expiry) and no more will come.
            ready, _ = await queue_depth(self._connection, self._queue)
            if ready == 0 and inbox.empty():
                return None

    async def close(self) -> None:
        """Close every channel, oldest first: all that was not acked goes back, in order."""
        for channel in self._channels:
            await channel.close()


def _into(inbox: asyncio.Queue[Delivery]) -> Callable[[Delivery], Coroutine[Any, Any, None]]:
    # Not an async def: the delivery is queued when its last frame is read, not when a task
    # runs, so that after basic.cancel returns every delivery sent before it is in the inbox.
    def on_delivery(delivery: Delivery) -> Coroutine[Any, Any, None]:
        inbox.put_nowait(delivery)
        return asyncio.sleep(0)

    return on_delivery
