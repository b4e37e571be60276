"""Fakes for the client's unit tests: a link that records writes, a transport, frame helpers.

Also two consumers a channel hands its deliveries to (``DeliveryConsumer``): one that keeps
them, one that runs an async handler for each in a task of its own.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any

from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import Channel
from sidecar.contract import ID
from sidecar.wire import HEADER, parse_confirm

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from sidecar.wire import Delivery


class Collected:
    """A consumer that keeps what the channel hands it, in the order it came."""

    def __init__(self) -> None:
        self.got: list[Delivery] = []
        self.sizes: list[int] = []

    def deliver(self, delivery: Delivery) -> None:
        """Keep the delivery."""
        self.got.append(delivery)

    def body_size(self, size: int) -> None:
        """Keep the body size."""
        self.sizes.append(size)


class InTasks:
    """A consumer that runs ``handle`` for each delivery in a task it keeps till it ends.

    The client starts no task: a consumer with async work starts its own, as this one
    does. A test may swap ``handle`` for another. Body sizes are kept in ``sizes``.
    """

    def __init__(self, handle: Callable[[Delivery], Coroutine[Any, Any, None]]) -> None:
        self.handle = handle
        self.sizes: list[int] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def deliver(self, delivery: Delivery) -> None:
        """Start ``handle`` on the delivery, in a task of its own."""
        task = asyncio.get_running_loop().create_task(
            self.handle(delivery), name=f"delivery-{delivery.delivery_tag}"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def body_size(self, size: int) -> None:
        """Keep the body size."""
        self.sizes.append(size)


class FakeLink:
    """What a channel needs of its connection: a loop, a frame size and a write."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.frame_max = 131072
        self.blocked = False
        self.nack_is_free = True  # RabbitMQ 4.3's
        self.match_header: str | None = ID  # the relay's (ClientOptions.match_header)
        self.resumed = 0
        self.written: list[bytes] = []
        self.forgotten: list[int] = []
        self.full = False  # the socket takes no more writes for now
        self.drained: list[Callable[[], None]] = []
        self.aborted: list[BaseException] = []

    @property
    def takes_writes(self) -> bool:
        """Whether the socket takes more now."""
        return not self.full

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Keep ``callback`` for ``drain``, or call it now if the socket takes writes."""
        if self.full:
            self.drained.append(callback)
        else:
            callback()

    def drain(self) -> None:
        """The socket took what waited: call whoever waits for it."""
        self.full = False
        drained, self.drained = self.drained, []
        for callback in drained:
            callback()

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """Note that the channel dropped the connection."""
        del graceful
        self.aborted.append(reason)

    def write(self, data: bytes | list[bytes | memoryview]) -> None:
        """Keep what the channel sends (a large publish's parts joined)."""
        self.written.append(data if isinstance(data, bytes) else b"".join(data))

    def resume_reading(self) -> None:
        """Count the channel's calls: a settlement made room."""
        self.resumed += 1

    def forget(self, number: int) -> None:
        """A closed channel frees its number."""
        self.forgotten.append(number)

    def methods(self) -> list[Any]:
        """The method frames written so far, decoded by pamqp (hot ones included)."""
        out = []
        for data in self.written:
            at = 0
            while at < len(data):
                size, _, frame = pamqp_frame.unmarshal(data[at:])
                at += size
                if not isinstance(frame, pamqp_header.ContentHeader | pamqp_body.ContentBody):
                    out.append(frame)
        return out

    def acks(self) -> list[tuple[int, bool]]:
        """The basic.ack frames written so far: (delivery tag, multiple)."""
        out = []
        for data in self.written:
            kind, _, size = HEADER.unpack_from(data, 0)
            payload = data[7 : 7 + size]
            if kind == 1 and struct.unpack_from(">HH", payload) == (60, 80):
                out.append(parse_confirm(payload))
        return out


def payload_of(method: Any) -> bytes:
    data = pamqp_frame.marshal(method, 1)
    return data[7:-1]


def control(channel: Channel, method: Any) -> None:
    """Hand the channel a control method frame, encoded by pamqp, as the link would."""
    channel.on_control(pamqp_frame.marshal(method, channel.number))


async def opened(link: FakeLink, number: int = 1) -> Channel:
    """A channel the broker has opened."""
    channel = Channel(link, number)
    opening = asyncio.create_task(channel.open())
    await asyncio.sleep(0)
    control(channel, spec.Channel.OpenOk())
    await opening
    return channel


class FakeSocket:
    """A socket that keeps the options set on it."""

    def __init__(self) -> None:
        self.options: dict[tuple[int, int], int] = {}

    def setsockopt(self, level: int, option: int, value: int) -> None:
        """Keep the option's value."""
        self.options[level, option] = value


class FakeTransport:
    """Enough of an asyncio transport for the link: it records writes and aborts."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.chunks: list[bytes] = []  # one per write call
        self.aborted = False
        self.closed = False
        self.reading = True
        self.limits: tuple[int, int] | None = None
        self.socket = FakeSocket()

    def write(self, data: bytes) -> None:
        """Keep what the link sends."""
        self.written += data
        self.chunks.append(data)

    def is_closing(self) -> bool:
        """Closing once aborted or closed."""
        return self.aborted or self.closed

    def abort(self) -> None:
        """Drop the connection."""
        self.aborted = True

    def close(self) -> None:
        """Close once what was written has left."""
        self.closed = True

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        """Note the marks the link sets."""
        self.limits = (high, low)

    def get_extra_info(self, name: str, default: object = None) -> object:
        """The socket (one that records its options); nothing else."""
        return self.socket if name == "socket" else default

    def pause_reading(self) -> None:
        """Stop reading from the socket."""
        self.reading = False

    def resume_reading(self) -> None:
        """Read again."""
        self.reading = True
