"""The link: the socket as an asyncio protocol. Frames in, batched writes out, heartbeats.

It cuts the bytes off the wire into frames and hands each to whoever owns its channel
number: the hot methods, content headers and bodies to the channel as they are, any other
method frame whole; channel 0 to the connection's control. Writes made in one turn of the
event loop leave in one ``write`` call at its end. It knows no AMQP method but by its id,
and imports no codec: the channels and the control decode what is theirs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final, Protocol, cast

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

__all__ = ["CHANNEL_MAX", "FRAME_MAX", "WRITE_BATCH_BYTES", "ChannelEnd", "ControlEnd", "Link"]

log = logging.getLogger(__name__)

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_MAX: Final = 131_072  # what we ask for; the broker may lower it
CHANNEL_MAX: Final = 2047  # likewise: a route takes one channel, a topology check another
# Queued writes past this size leave before the end of the loop's turn (a paired benchmark:
# +5% throughput at 64 KiB over one write per turn, ten runs out of ten; 16 KiB +3%).
WRITE_BATCH_BYTES: Final = 65_536


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

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the protocol header: the broker answers with connection.start."""
        self._transport = cast("asyncio.Transport", transport)
        self._transport.write(PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        """End the link: every channel and waiter learns why."""
        self._end(exc or BrokerConnectionError("the broker closed the connection"))

    def data_received(self, data: bytes) -> None:
        """Handle the whole frames received so far; drop the link on one it cannot read."""
        self._last_read = self.loop.time()
        buffer = self._buffer
        buffer += data
        try:
            read = self._read_frames(buffer)
        except Exception as e:  # a frame we cannot read, or the codec's refusal of one
            log.exception("the broker sent a frame we cannot read; dropping the connection")
            self.abort(BrokerConnectionError(f"unreadable frame from the broker: {e}"))
            return
        del buffer[:read]

    def _read_frames(self, buffer: bytearray) -> int:  # noqa: C901 - the hot loop, a case per frame type
        """Handle every whole frame in ``buffer``; return how many bytes they took."""
        at, size = 0, len(buffer)
        if buffer.startswith(b"AMQP"):  # the server's own protocol header: not 0-9-1
            raise WireError(f"the server refused AMQP 0-9-1 and offers {bytes(buffer[:8])!r}")
        while size - at >= 8:
            kind, number, length = HEADER.unpack_from(buffer, at)
            if length > self.frame_max:
                raise WireError(
                    f"a frame of {length} bytes, over the frame size of {self.frame_max}:"
                    " is this an AMQP 0-9-1 broker?"
                )
            end = at + 7 + length
            if end >= size:
                break
            if buffer[end] != FRAME_END:
                raise WireError(f"frame on channel {number} lacks its frame-end octet")
            payload = bytes(buffer[at + 7 : end])
            if kind == FRAME_METHOD:
                self._on_method(number, payload, bytes(buffer[at : end + 1]))
            elif kind == FRAME_HEADER:
                if channel := self.channels.get(number):
                    channel.on_header(payload)
            elif kind == FRAME_BODY:
                if channel := self.channels.get(number):
                    channel.on_body(payload)
            elif kind != FRAME_HEARTBEAT:
                raise WireError(f"unknown frame type {kind} on channel {number}")
            at = end + 1
        return at

    def _on_method(self, number: int, payload: bytes, frame: bytes) -> None:
        if number == 0:
            if self.control is None:
                raise WireError("a connection method came before the handshake began")
            self.control.on_control(frame)
            return
        channel = self.channels.get(number)
        if channel is None:
            # A channel closed from both sides at once gets the broker's close-ok after
            # its close; whatever comes for a channel already closed is moot.
            return
        (method_id,) = METHOD.unpack_from(payload, 0)
        if not channel.on_method(method_id, payload):
            channel.on_control(frame)

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
