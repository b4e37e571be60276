"""Reading frames: the bytes off the socket cut into frames, each handed to its owner.

The hot methods (by their id), content headers and bodies go to their channel as they are,
any other method frame whole; channel 0's to the connection's control. A frame for a
channel nobody owns is dropped. It knows no AMQP method but by its id and imports no codec.

A content header over ``HEADER_FRAME_MAX`` is passed over, its bytes dropped as they
arrive, and its channel told its size (``on_unread_header``). A channel whose deliveries
hold their budget of bytes (``has_room`` false) holds the reader at its next content
header until the link feeds it again, so a route's bytes in flight stay within its budget
plus one message (docs/memory.md); so does a body frame its channel does not take now (a
body passing through, ``on_body`` false). Body frames are views of the bytes read, not
copies.

A frame it cannot read raises :class:`WireError` (a :class:`FrameError` with its reply
code); the link closes the connection for it. No I/O: the link feeds it.
"""

from __future__ import annotations

import struct
from typing import Final, Protocol

from sidecar.amqp.violations import FrameError
from sidecar.errors import ChannelLostError, WireError
from sidecar.wire import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEADER,
    METHOD,
    UnreadHeader,
    read_u32,
)

__all__ = [
    "HEADER_FRAME_MAX",
    "ChannelEnd",
    "ControlEnd",
    "FrameOwners",
    "FrameReader",
    "NotAmqpError",
]

# A content header over the agreed frame size is still read, up to this: a broker whose
# frame size went down since, or a URL's frame_max below the broker's, must not make one
# message drop the connection on every redelivery. The relay quarantines what it cannot
# republish. Any other frame over the agreed size is a frame error.
HEADER_FRAME_MAX: Final = 16 * 1024 * 1024
_FIXED: Final = struct.Struct(">HHQ")  # a content header's class, weight and body size


class NotAmqpError(WireError):
    """The server answered with its own protocol header: it does not speak 0-9-1."""


class ChannelEnd(Protocol):
    """What the link hands a channel's frames to."""

    def on_method(self, method_id: int, payload: bytes) -> bool:
        """Handle a hot-path method; False when it is not one."""

    def on_control(self, frame: bytes) -> None:
        """Handle any other method frame, given whole."""

    def on_header(self, payload: bytes) -> None:
        """Handle a content header frame."""

    def on_body(self, payload: memoryview) -> bool:
        """Handle a content body frame (a view valid during the call); False: not taken now.

        A frame not taken holds the reader at it until the link feeds it again.
        """

    def has_room(self) -> bool:
        """Whether the channel takes another message now (its bytes in flight are in budget)."""

    @property
    def consuming(self) -> bool:
        """Whether the channel consumes (its deliveries can make the link write more)."""

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> None:
        """Handle a content header too large to read: only its size and body size are known."""

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


class FrameOwners(Protocol):
    """Who the frames go to, and the frame size agreed so far: the link's."""

    frame_max: int
    channels: dict[int, ChannelEnd]
    control: ControlEnd | None


class FrameReader:
    """Cuts the bytes read into frames and hands each to its owner; see the module docstring."""

    def __init__(self, owners: FrameOwners, *, header_frame_max: int = HEADER_FRAME_MAX) -> None:
        self._owners = owners
        self._header_max = header_frame_max  # a content header over this is passed over
        self._buffer = bytearray()  # the start of a frame not yet whole
        # That frame's type and its size once whole (0 while its length is not in yet):
        # reads that cannot make it whole are only appended, so a large frame arriving in
        # many reads is copied once, not once per read.
        self._kept_kind, self._kept_whole = 0, 0
        self._skip: _Skip | None = None  # a content header being passed over
        # A channel had no room for the content header the kept bytes begin with: nothing
        # is read until the link feeds again (``feed(b"")`` after clearing it).
        self.held = False

    def feed(self, data: bytes) -> None:
        """Hand on every frame made whole by ``data``; keep the start of the next one.

        Raises :class:`WireError` for a frame it cannot read; nothing after it is read.
        While ``held``, ``data`` is only kept.
        """
        buffer = self._buffer
        if self.held:
            buffer += data
            return
        while True:
            if self._skip is not None:
                rest = self._pass_over(self._skip, data)
                if rest is None:
                    return  # all of it was the header's
                data = rest
            # Frames are cut from bytes: one copy per frame. A read that starts on a frame
            # boundary (the common case) is read as it came; a partial frame kept from the
            # last read is joined to it first.
            if buffer:
                if len(buffer) + len(data) < self._kept_whole and self._may_wait():
                    buffer += data
                    return
                buffer += data
                data = bytes(buffer)
                buffer.clear()
            read = self._read_frames(data)
            if self._skip is None:
                if read < len(data):
                    buffer[:] = data[read:]
                    self._keep_sizes(buffer)
                return
            data = data[read:]  # the rest is the header's, then what follows it

    def _keep_sizes(self, kept: bytearray) -> None:
        """Note the type and whole size of the frame begun in ``kept``, where its head is in."""
        if len(kept) < 7:
            self._kept_kind, self._kept_whole = 0, 0
            return
        kind, _, length = HEADER.unpack_from(kept)
        self._kept_kind, self._kept_whole = kind, 8 + length

    def _may_wait(self) -> bool:
        """Whether the kept frame is one to read whole (else it is read at once, to refuse it)."""
        length = self._kept_whole - 8
        return length <= self._owners.frame_max or (
            self._kept_kind == FRAME_HEADER and length <= self._header_max
        )

    def _pass_over(self, skip: _Skip, data: bytes) -> bytes | None:
        """Drop the header's bytes in ``data``; once it ends, tell its channel, return the rest.

        None: the header goes on past ``data``.
        """
        if len(data) < skip.left:
            skip.left -= len(data)
            return None
        if data[skip.left - 1] != FRAME_END:
            raise FrameError(f"frame on channel {skip.number} lacks its frame-end octet")
        self._skip = None
        if channel := self._owners.channels.get(skip.number):
            channel.on_unread_header(skip.unread, body_size=skip.body_size)
        return data[skip.left :]

    def _read_frames(self, buffer: bytes) -> int:  # noqa: C901 - the hot loop, a case per frame type
        """Handle every whole frame in ``buffer``; return how many bytes they took."""
        at, size = 0, len(buffer)
        if buffer.startswith(b"AMQP"):  # the server's own protocol header: not 0-9-1
            raise NotAmqpError(f"the server refused AMQP 0-9-1 and offers {bytes(buffer[:8])!r}")
        owners = self._owners
        view = memoryview(buffer)
        while size - at >= 8:  # the header's type, channel and size, read a byte at a time
            kind = buffer[at]
            number = buffer[at + 1] << 8 | buffer[at + 2]
            length = read_u32(buffer, at + 3)
            if length > owners.frame_max and not (
                kind == FRAME_HEADER and length <= self._header_max
            ):
                return self._oversized(buffer, at)
            end = at + 7 + length
            if end >= size:
                break
            if buffer[end] != FRAME_END:
                raise FrameError(f"frame on channel {number} lacks its frame-end octet")
            if kind == FRAME_BODY:
                if (channel := owners.channels.get(number)) and not channel.on_body(
                    view[at + 7 : end]
                ):
                    self.held = True
                    return at
            elif kind == FRAME_METHOD:
                self._on_method(number, buffer[at + 7 : end], buffer, at)
            elif kind == FRAME_HEADER:
                if channel := owners.channels.get(number):
                    if not channel.has_room():
                        self.held = True
                        return at
                    channel.on_header(buffer[at + 7 : end])
            elif kind != FRAME_HEARTBEAT:
                raise FrameError(f"unknown frame type {kind} on channel {number}")
            at = end + 1
        return at

    def _oversized(self, buffer: bytes, at: int) -> int:
        """Begin to pass over the content header at ``at``; return where its bytes begin.

        Only a content header is passed over, and only once its body size is in ``buffer``
        (``at`` again until then); any other frame over the frame size is a frame error.
        """
        kind, number, length = HEADER.unpack_from(buffer, at)
        if kind != FRAME_HEADER or length < _FIXED.size:
            raise FrameError(
                f"a frame of {length} bytes, over the frame size of {self._owners.frame_max}:"
                " is this an AMQP 0-9-1 broker?"
            )
        if len(buffer) - at < 7 + _FIXED.size:
            return at  # its body size comes next
        channel = self._owners.channels.get(number)
        if channel is not None and not channel.has_room():
            self.held = True
            return at
        _, _, body_size = _FIXED.unpack_from(buffer, at + 7)
        unread = UnreadHeader(size=length, limit=self._header_max)
        self._skip = _Skip(number, unread, body_size, left=length + 1 - _FIXED.size)
        return at + 7 + _FIXED.size

    def _on_method(self, number: int, payload: bytes, buffer: bytes, at: int) -> None:
        """Hand a method frame on; the whole frame (from ``at`` in ``buffer``) only if asked."""
        if len(payload) < METHOD.size:
            raise FrameError(
                f"a method frame of {len(payload)} bytes on channel {number}: too short for"
                " its class and method ids"
            )
        owners = self._owners
        if number == 0:
            if owners.control is None:
                raise FrameError("a connection method came before the handshake began")
            owners.control.on_control(buffer[at : at + len(payload) + 8])
            return
        channel = owners.channels.get(number)
        if channel is None:
            # A channel closed from both sides at once gets the broker's close-ok after
            # its close; whatever comes for a channel already closed is moot.
            return
        method_id: int
        (method_id,) = METHOD.unpack_from(payload, 0)
        if not channel.on_method(method_id, payload):
            channel.on_control(buffer[at : at + len(payload) + 8])


class _Skip:
    """A content header being passed over: whose it is, and how many of its bytes are left."""

    __slots__ = ("body_size", "left", "number", "unread")

    def __init__(self, number: int, unread: UnreadHeader, body_size: int, *, left: int) -> None:
        self.number = number
        self.unread = unread
        self.body_size = body_size
        self.left = left  # the rest of its payload and its frame-end octet
