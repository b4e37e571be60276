"""The link: the socket as an asyncio protocol. Frames in, batched writes out, heartbeats.

Its heartbeats and the kernel's bound on unacknowledged writes are ``heartbeat``'s. The
bytes it reads go to its ``FrameReader``, which cuts them into frames for the owner of
each channel number (``channels``; channel 0: ``control``). Writes made in one turn of the
event loop leave in one ``write`` call at its end.

A frame it cannot read ends the connection with ``connection.close`` and the reply code of
the violation (501, 505; 541 for a fault of ours) before the socket closes. While the
socket's write buffer is over ``WRITE_BUFFER_HIGH`` (a broker that does not read), a link
that consumes stops reading, so that no delivery it reads can make it write more; one that
only publishes reads on (what it has in flight bounds its confirms and returns), so that
it hears ``connection.blocked`` before the kernel's bound ends it. A large publish's parts
(``write_parts``) leave only as the buffer drains, and what is written after them waits
behind them; a body passed through waits for the drain too (``when_drained``). While a
channel's deliveries hold its budget of bytes, or a body passing through waits (the frame
reader ``held``), it stops reading too, until there is room (``resume_reading``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Final, cast

from sidecar.amqp.frame_reader import ChannelEnd, ControlEnd, FrameReader, NotAmqpError
from sidecar.amqp.heartbeat import Heartbeats
from sidecar.amqp.violations import FRAME_ERROR, INTERNAL_ERROR, FrameError
from sidecar.errors import BrokerConnectionError, ChannelLostError, WireError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CHANNEL_MAX",
    "FRAME_MAX",
    "FRAME_MAX_CEILING",
    "WRITE_BATCH_BYTES",
    "WRITE_BUFFER_HIGH",
    "Link",
]

log = logging.getLogger(__name__)

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_MAX: Final = 131_072  # the frame size until the broker's tune (RabbitMQ's default)
# What we take when the broker sets no frame size (0); any size it sets up to this we take:
# RabbitMQ does not split content headers, so a header table a publisher could send at the
# broker's frame size must be readable at ours.
FRAME_MAX_CEILING: Final = 16 * 1024 * 1024
CHANNEL_MAX: Final = 2047  # a route takes one channel, a topology check another
# Queued writes past this size leave before the end of the loop's turn (a paired benchmark:
# +5% throughput at 64 KiB over one write per turn, ten runs out of ten; 16 KiB +3%).
WRITE_BATCH_BYTES: Final = 65_536
# Over this much written but not yet taken by the socket, reading stops until it drains to
# a quarter of it: a broker that reads nothing cannot make the sidecar buffer without bound.
WRITE_BUFFER_HIGH: Final = 1024 * 1024
CLOSE_AFTER_S: Final = 1.0  # our close after a frame error: the socket goes this much later


class _Writes:
    """The link's writes: batched per turn of the loop; a large publish's parts as it drains."""

    loop: asyncio.AbstractEventLoop
    _transport: asyncio.Transport | None
    reading_paused: bool  # the write buffer is over its mark: pause_writing sets it

    def _writes_begin(self) -> None:
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_due = False
        self._last_write = self.loop.time()
        # Parts waiting for the socket's write buffer to drain (a large publish, and what
        # was written after it), in order.
        self._backlog: collections.deque[bytes | memoryview] = collections.deque()

    def write(self, data: bytes | list[bytes | memoryview]) -> None:
        """Queue bytes; what one turn of the loop queues leaves at its end in one write.

        A list is a large publish in parts (``write_parts``).

        A turn that queues more (hundreds of publishes made from one read) sends every
        ``WRITE_BATCH_BYTES`` as it goes, so the broker routes the first publishes while
        the sidecar still makes the rest, instead of waiting for the whole batch.
        """
        if isinstance(data, list):
            self.write_parts(data)
            return
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._end_of_turn)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def write_parts(self, parts: list[bytes | memoryview]) -> None:
        """Queue a large publish in parts; they leave as the socket's write buffer takes them.

        Never joined: a body's frames are views of it, so it is not copied whole on its
        way out. What was queued before goes first, what is written after waits behind.
        """
        self.flush()
        self._backlog.extend(parts)
        self._pump()

    def _end_of_turn(self) -> None:
        self._flush_due = False
        self.flush()

    def flush(self) -> None:
        """Send what is queued now, without waiting for the end of the turn."""
        out, self._out = self._out, []
        self._out_bytes = 0
        transport = self._transport
        if not out or transport is None or transport.is_closing():
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        if self._backlog:
            self._backlog.append(data)  # behind a large publish still leaving
            self._pump()
            return
        transport.write(data)
        self._last_write = self.loop.time()

    def _pump(self) -> None:
        """Write the parts waiting while the socket's write buffer is under its mark."""
        transport, backlog = self._transport, self._backlog
        if transport is None or transport.is_closing():
            backlog.clear()
            return
        while backlog and not self.reading_paused:  # pause_writing sets it, as it comes
            transport.write(backlog.popleft())
            self._last_write = self.loop.time()


class Link(_Writes, Heartbeats, asyncio.Protocol):
    """The socket: frames in, batched writes out, heartbeats, and who is waiting on what."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, match_header: str | None = None) -> None:
        self.loop = loop
        self.match_header = match_header  # what tells alike publishes apart (ClientOptions)
        self.frame_max = FRAME_MAX
        self.nack_is_free = False  # the handshake learns it from the broker's version
        self.channel_max = CHANNEL_MAX
        self.channels: dict[int, ChannelEnd] = {}
        self.control: ControlEnd | None = None
        self.closed = asyncio.Event()
        self.close_reason: BaseException | None = None
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(self)
        self._writes_begin()
        self._resume_due = False
        self._last_read = loop.time()
        self.reading_paused = False  # the write buffer is over its mark
        self.reading_off = False  # reading stopped for it (a link that consumes)
        self.reading_held = False  # a channel has no room for its next delivery
        self._drained: list[Callable[[], None]] = []  # called once the write buffer drains

    @property
    def takes_writes(self) -> bool:
        """Whether the socket takes more now (its write buffer under the mark), or is gone."""
        return not self.reading_paused or self.closed.is_set()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the write buffer drains under its mark (or the link ends)."""
        if self.takes_writes:
            callback()
        else:
            self._drained.append(callback)

    def _call_drained(self) -> None:
        drained, self._drained = self._drained, []
        for callback in drained:
            callback()

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the protocol header: the broker answers with connection.start."""
        self._transport = cast("asyncio.Transport", transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_HIGH // 4)
        self._transport.write(PROTOCOL_HEADER)

    def pause_writing(self) -> None:
        """Hold the parts waiting, and stop reading if it consumes, until the buffer drains."""
        if self._transport is not None and not self.reading_paused:
            self.reading_paused = True
            if any(channel.consuming for channel in self.channels.values()):
                self.reading_off = True
                self._transport.pause_reading()

    def resume_writing(self) -> None:
        """Read again (unless a channel holds the reading): the write buffer drained."""
        if self._transport is not None and self.reading_paused:
            self.reading_paused = False
            self.reading_off = False
            self._pump()
            if not self.reading_paused:
                self._call_drained()
            if not self.reading_paused and not self.reading_held:
                self._read_again()

    def _read_again(self) -> None:
        assert self._transport is not None  # noqa: S101 - callers check
        self._last_read = self.loop.time()  # the silence was ours, not the broker's
        if not self._transport.is_closing():
            self._transport.resume_reading()

    def resume_reading(self) -> None:
        """Read on soon if a channel's budget held the reading (a settlement made room).

        In a turn of its own: the frames kept are handed on from the loop, never from
        inside a channel's ack or close.
        """
        if self.reading_held and not self._resume_due:
            self._resume_due = True
            self.loop.call_soon(self._resume_held)

    def _resume_held(self) -> None:
        self._resume_due = False
        if self.closed.is_set() or not self.reading_held:
            return
        self._reader.held = False
        self._feed(b"")
        if self._reader.held or self.closed.is_set():
            return  # still no room
        self.reading_held = False
        if self._transport is not None and not self.reading_off:
            self._read_again()

    def connection_lost(self, exc: Exception | None) -> None:
        """End the link: every channel and waiter learns why."""
        self._end(exc or BrokerConnectionError("the broker closed the connection"))

    def data_received(self, data: bytes) -> None:
        """Handle the whole frames received so far; close the link on one it cannot read."""
        if self.closed.is_set():  # after our close for a bad frame: nothing more is read
            return
        self._last_read = self.loop.time()
        self._feed(data)
        if self._reader.held and not self.reading_held and self._transport is not None:
            self.reading_held = True
            self._transport.pause_reading()

    def _feed(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except NotAmqpError as e:  # the server's own protocol header: nothing to close
            log.error("cannot talk to the server: %s", e)  # noqa: TRY400 - the reason is all
            self.abort(BrokerConnectionError(str(e)))
        except WireError as e:  # a frame we cannot read (a truncated method), or out of order
            code = e.reply_code if isinstance(e, FrameError) else FRAME_ERROR
            log.error("the broker sent a frame we cannot read (%s); closing the connection", e)  # noqa: TRY400
            self.refuse(code, f"unreadable frame from the broker: {e}")
        except Exception as e:  # a fault of ours while handling a frame
            log.exception("internal error while reading from the broker; closing the connection")
            self.refuse(INTERNAL_ERROR, f"internal error in the client: {e!r}")

    # --- life ---

    def forget(self, number: int) -> None:
        """Free a channel number once the channel is closed on both sides."""
        self.channels.pop(number, None)

    def refuse(self, reply_code: int, reply_text: str) -> None:
        """Close the connection for a violation: ``connection.close`` first, then the socket.

        Nothing more is read: the frames after one we could not read would be misread.
        The socket closes once the close has left (at most ``CLOSE_AFTER_S`` later).
        """
        reason = BrokerConnectionError(reply_text)
        if self.closed.is_set():
            return
        transport = self._transport
        if transport is not None and self.control is not None:
            self.write(self.control.close_frame(reply_code, reply_text))
            self.flush()
            transport.pause_reading()
            self.loop.call_later(CLOSE_AFTER_S, transport.abort)
        self.abort(reason, graceful=True)

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """Drop the connection now, with the reason every waiter will see.

        ``graceful`` lets what is already written (a close-ok) leave first.
        """
        if self.close_reason is None:
            self.close_reason = reason
        if self._transport is not None:
            if graceful:
                self._transport.close()
            else:
                self._transport.abort()
        self._end(reason)

    def _end(self, reason: BaseException) -> None:
        if self.closed.is_set():
            return
        if self.close_reason is None:
            self.close_reason = reason
        self.closed.set()
        self._backlog.clear()
        self.stop_heartbeat()
        lost = ChannelLostError(f"the connection closed: {self.close_reason}")
        for channel in list(self.channels.values()):
            channel.lose(lost)
        self.channels.clear()
        self._call_drained()
        if self.control is not None:
            self.control.lose(self.close_reason)
