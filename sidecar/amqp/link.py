"""The link: the socket as an asyncio protocol. Frames in, batched writes out, heartbeats.

It cuts the bytes off the wire into frames and hands each to whoever owns its channel
number: the hot methods, content headers and bodies to the channel as they are, any other
method frame whole; channel 0 to the connection's control. Writes made in one turn of the
event loop leave in one ``write`` call at its end. It knows no AMQP method but by its id,
and imports no codec: the channels and the control decode what is theirs.

A frame it cannot read ends the connection with ``connection.close`` and the reply code of
the violation (501, 505; 541 for a fault of ours) before the socket closes. While the
socket's write buffer is over ``WRITE_BUFFER_HIGH`` (a broker that does not read), it
stops reading, so that nothing it reads can make it write more.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final, Protocol, cast

from sidecar.amqp.violations import FRAME_ERROR, INTERNAL_ERROR, FrameError
from sidecar.errors import BrokerConnectionError, ChannelLostError, WireError
from sidecar.frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEADER,
    HEARTBEAT,
    METHOD,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CHANNEL_MAX",
    "FRAME_MAX",
    "FRAME_MAX_CEILING",
    "HEADER_FRAME_MAX",
    "WRITE_BATCH_BYTES",
    "WRITE_BUFFER_HIGH",
    "ChannelEnd",
    "ControlEnd",
    "Link",
]

log = logging.getLogger(__name__)

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_MAX: Final = 131_072  # the frame size until the broker's tune (RabbitMQ's default)
# What we take when the broker sets no frame size (0); any size it sets up to this we take:
# RabbitMQ does not split content headers, so a header table a publisher could send at the
# broker's frame size must be readable at ours.
FRAME_MAX_CEILING: Final = 16 * 1024 * 1024
# A content header over the agreed frame size is still read, up to this: a broker whose
# frame size went down since, or a URL's frame_max below the broker's, must not make one
# message drop the connection on every redelivery. The relay quarantines what it cannot
# republish. Any other frame over the agreed size is a frame error.
HEADER_FRAME_MAX: Final = 16 * 1024 * 1024
CHANNEL_MAX: Final = 2047  # a route takes one channel, a topology check another
# Queued writes past this size leave before the end of the loop's turn (a paired benchmark:
# +5% throughput at 64 KiB over one write per turn, ten runs out of ten; 16 KiB +3%).
WRITE_BATCH_BYTES: Final = 65_536
# Over this much written but not yet taken by the socket, reading stops until it drains to
# a quarter of it: a broker that reads nothing cannot make the sidecar buffer without bound.
WRITE_BUFFER_HIGH: Final = 1024 * 1024
CLOSE_AFTER_S: Final = 1.0  # our close after a frame error: the socket goes this much later


class _NotAmqpError(WireError):
    """The server answered with its own protocol header: it does not speak 0-9-1."""


class ChannelEnd(Protocol):
    """What the link hands a channel's frames to."""

    def on_method(self, method_id: int, payload: bytes) -> bool:
        """Handle a hot-path method; False when it is not one."""

    def on_control(self, frame: bytes) -> None:
        """Handle any other method frame, given whole."""

    def on_header(self, payload: bytes) -> None:
        """Handle a content header frame."""

    def on_body(self, payload: bytes) -> None:
        """Handle a content body frame."""

    def lose(self, error: ChannelLostError) -> None:
        """End the channel: the connection is gone."""


class ControlEnd(Protocol):
    """What the link hands channel 0's method frames to: the connection's control."""

    def on_control(self, frame: bytes) -> None:
        """Handle a connection method frame, given whole."""

    def lose(self, reason: BaseException) -> None:
        """End channel 0: the connection closed for this reason."""

    def close_frame(self, reply_code: int, reply_text: str) -> bytes:
        """Return our ``connection.close`` frame with this code and text."""


class Link(asyncio.Protocol):
    """The socket: frames in, batched writes out, heartbeats, and who is waiting on what."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.frame_max = FRAME_MAX
        self.channel_max = CHANNEL_MAX
        self.channels: dict[int, ChannelEnd] = {}
        self.control: ControlEnd | None = None
        self.closed = asyncio.Event()
        self.close_reason: BaseException | None = None
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_due = False
        self._last_read = loop.time()
        self._last_write = loop.time()
        self._heartbeat: asyncio.TimerHandle | None = None
        self.reading_paused = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the protocol header: the broker answers with connection.start."""
        self._transport = cast("asyncio.Transport", transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_HIGH // 4)
        self._transport.write(PROTOCOL_HEADER)

    def pause_writing(self) -> None:
        """Stop reading until the socket's write buffer, over the mark now, drains."""
        if self._transport is not None and not self.reading_paused:
            self.reading_paused = True
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        """Read again: the write buffer drained."""
        if self._transport is not None and self.reading_paused:
            self.reading_paused = False
            self._last_read = self.loop.time()  # the silence was ours, not the broker's
            if not self._transport.is_closing():
                self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        """End the link: every channel and waiter learns why."""
        self._end(exc or BrokerConnectionError("the broker closed the connection"))

    def data_received(self, data: bytes) -> None:
        """Handle the whole frames received so far; close the link on one it cannot read."""
        if self.closed.is_set():  # after our close for a bad frame: nothing more is read
            return
        self._last_read = self.loop.time()
        # Frames are cut from bytes: one copy per frame. A read that starts on a frame
        # boundary (the common case) is read as it came; a partial frame kept from the last
        # read is joined to it first.
        buffer = self._buffer
        if buffer:
            buffer += data
            data = bytes(buffer)
        try:
            read = self._read_frames(data)
        except _NotAmqpError as e:  # the server's own protocol header: nothing to close
            log.error("cannot talk to the server: %s", e)  # noqa: TRY400 - the reason is all
            self.abort(BrokerConnectionError(str(e)))
            return
        except WireError as e:  # a frame we cannot read (a truncated method), or out of order
            code = e.reply_code if isinstance(e, FrameError) else FRAME_ERROR
            log.error("the broker sent a frame we cannot read (%s); closing the connection", e)  # noqa: TRY400
            self.refuse(code, f"unreadable frame from the broker: {e}")
            return
        except Exception as e:  # a fault of ours while handling a frame
            log.exception("internal error while reading from the broker; closing the connection")
            self.refuse(INTERNAL_ERROR, f"internal error in the client: {e!r}")
            return
        if read < len(data):
            buffer[:] = data[read:]
        else:
            buffer.clear()

    def _read_frames(self, buffer: bytes) -> int:  # noqa: C901 - the hot loop, a case per frame type
        """Handle every whole frame in ``buffer``; return how many bytes they took."""
        at, size = 0, len(buffer)
        if buffer.startswith(b"AMQP"):  # the server's own protocol header: not 0-9-1
            raise _NotAmqpError(f"the server refused AMQP 0-9-1 and offers {bytes(buffer[:8])!r}")
        while size - at >= 8:
            kind, number, length = HEADER.unpack_from(buffer, at)
            if length > self.frame_max and not (
                kind == FRAME_HEADER and length <= HEADER_FRAME_MAX
            ):
                raise FrameError(
                    f"a frame of {length} bytes, over the frame size of {self.frame_max}:"
                    " is this an AMQP 0-9-1 broker?"
                )
            end = at + 7 + length
            if end >= size:
                break
            if buffer[end] != FRAME_END:
                raise FrameError(f"frame on channel {number} lacks its frame-end octet")
            payload = buffer[at + 7 : end]
            if kind == FRAME_METHOD:
                self._on_method(number, payload, buffer, at)
            elif kind == FRAME_HEADER:
                if channel := self.channels.get(number):
                    channel.on_header(payload)
            elif kind == FRAME_BODY:
                if channel := self.channels.get(number):
                    channel.on_body(payload)
            elif kind != FRAME_HEARTBEAT:
                raise FrameError(f"unknown frame type {kind} on channel {number}")
            at = end + 1
        return at

    def _on_method(self, number: int, payload: bytes, buffer: bytes, at: int) -> None:
        """Hand a method frame on; the whole frame (from ``at`` in ``buffer``) only if asked."""
        if number == 0:
            if self.control is None:
                raise FrameError("a connection method came before the handshake began")
            self.control.on_control(buffer[at : at + len(payload) + 8])
            return
        channel = self.channels.get(number)
        if channel is None:
            # A channel closed from both sides at once gets the broker's close-ok after
            # its close; whatever comes for a channel already closed is moot.
            return
        (method_id,) = METHOD.unpack_from(payload, 0)
        if not channel.on_method(method_id, payload):
            channel.on_control(buffer[at : at + len(payload) + 8])

    # --- writing ---

    def write(self, data: bytes) -> None:
        """Queue bytes; what one turn of the loop queues leaves at its end in one write.

        A turn that queues more (hundreds of publishes made from one read) sends every
        ``WRITE_BATCH_BYTES`` as it goes, so the broker routes the first publishes while
        the sidecar still makes the rest, instead of waiting for the whole batch.
        """
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._end_of_turn)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def _end_of_turn(self) -> None:
        self._flush_due = False
        self.flush()

    def flush(self) -> None:
        """Send what is queued now, without waiting for the end of the turn."""
        out, self._out = self._out, []
        self._out_bytes = 0
        transport = self._transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._last_write = self.loop.time()

    # --- life ---

    def start_heartbeat(self, interval_s: int) -> None:
        """Send a heartbeat when idle; drop the connection after two silent intervals."""
        if interval_s <= 0:
            return
        self._heartbeat = self.loop.call_later(interval_s / 2, self._beat(interval_s))

    def _beat(self, interval_s: int) -> Callable[[], None]:
        def beat() -> None:
            now = self.loop.time()
            if self.reading_paused:
                # We stopped reading (the broker takes nothing we write): what it sent
                # waits unread, so its silence tells nothing. TCP ends a dead socket.
                self._last_read = now
            if now - self._last_read > 2 * interval_s:
                self.abort(
                    BrokerConnectionError(f"no heartbeat from the broker in {2 * interval_s}s")
                )
                return
            if now - self._last_write >= interval_s / 2:
                self.write(HEARTBEAT)
            self._heartbeat = self.loop.call_later(interval_s / 2, beat)

        return beat

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
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        lost = ChannelLostError(f"the connection closed: {self.close_reason}")
        for channel in list(self.channels.values()):
            channel.lose(lost)
        self.channels.clear()
        if self.control is not None:
            self.control.lose(self.close_reason)
