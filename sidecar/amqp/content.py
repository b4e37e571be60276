"""How a message is put together from its method, content header and body frames.

The values it makes are :mod:`sidecar.wire.delivery`'s (pure, so the relay's decisions and
their tests need no client). A content header whose properties cannot be read still makes
a delivery: its property bytes travel as an :class:`UndecodableTable`, so the relay
quarantines the message instead of the connection dropping on every redelivery; so does
one too large to read (the frame reader passed over it): its delivery carries an
:class:`UnreadHeader` and the body, no properties and no headers. Frames out of order are
an :class:`UnexpectedFrameError` (505), body frames past the size the header announced a
:class:`FrameError`, and so is a header announcing a body to hold over ``BODY_SIZE_MAX``
(no RabbitMQ sends one). A body is held once: the body frames are appended, as they
arrive, to one buffer, which the delivery then carries; it takes memory as its bytes come,
not at its header. A body the channel
passes through (``passes``: over its consumer's ``max_body_bytes``, or a return of a body
it published that way) is not held at all: the message is whole at its header, with a
:class:`~sidecar.amqp.stream.BodyStream` that the body frames are fed to. No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from sidecar.amqp.stream import BodyStream
from sidecar.amqp.violations import FrameError, UnexpectedFrameError
from sidecar.errors import WireError
from sidecar.wire import (
    BasicDeliver,
    BasicReturn,
    Body,
    ContentHeader,
    Delivery,
    UndecodableTable,
    UnreadBody,
    UnreadHeader,
    parse_content_header,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BODY_SIZE_MAX", "Content", "ContentReader", "delivery_of"]

# RabbitMQ's largest max_message_size (512 MiB): a larger body announced to be held is no
# broker's, and a buffer is never grown past it.
BODY_SIZE_MAX: Final = 512 * 1024 * 1024


def delivery_of(
    method: BasicDeliver,
    header: ContentHeader,
    body: Body,
    unread: UnreadHeader | None = None,
    unread_body: UnreadBody | None = None,
) -> Delivery:
    """Return the delivery a ``basic.deliver`` and its content made."""
    raw = header.headers
    return Delivery(
        delivery_tag=method.delivery_tag,
        exchange=method.exchange,
        routing_key=method.routing_key,
        redelivered=method.redelivered,
        properties=MappingProxyType(header.properties),
        headers=MappingProxyType(raw if isinstance(raw, dict) else {}),
        body=body,
        undecodable=raw if isinstance(raw, UndecodableTable) else None,
        unread_header=unread,
        unread_body=unread_body,
        content_header=header.payload,
    )


@dataclass(frozen=True, slots=True, init=False)
class Content:
    """A whole message off the wire: the method it came with, its header and its body.

    One per message: ``__init__`` written out (docs/decisions/0063).
    """

    method: BasicDeliver | BasicReturn
    header: ContentHeader
    body: Body
    unread: UnreadHeader | None  # the header was too large to read: it is empty
    stream: BodyStream | None  # the body passes through: ``body`` is empty

    def __init__(
        self,
        method: BasicDeliver | BasicReturn,
        header: ContentHeader,
        body: Body,
        unread: UnreadHeader | None = None,
        stream: BodyStream | None = None,
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "header", header)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "unread", unread)
        object.__setattr__(self, "stream", stream)


class ContentReader:
    """Puts a delivery or a return together from its method, header and body frames."""

    def __init__(
        self,
        number: int,
        *,
        passes: Callable[[BasicDeliver | BasicReturn, int], bool],
        resume: Callable[[], None],
    ) -> None:
        self._number = number
        self._passes = passes  # whether a message of this body size passes through
        self._resume = resume  # the link reads on: a stream's frames are taken again
        self._method: BasicDeliver | BasicReturn | None = None
        self._header: ContentHeader | None = None
        self._unread: UnreadHeader | None = None
        self._body = bytearray()  # the body being received, as long as its bytes so far
        self._received = 0
        self.stream: BodyStream | None = None  # the body passing through now
        # The body size the last delivery's content header announced (None after a
        # return's): known before the body frames arrive.
        self.announced: int | None = None

    def begin(self, method: BasicDeliver | BasicReturn) -> None:
        """Start a message: its header and body frames come next."""
        if self._method is not None:
            raise UnexpectedFrameError(
                f"channel {self._number}: a delivery or return before the content of the last"
            )
        self._method, self._header = method, None
        self._received = 0

    def on_header(self, payload: bytes) -> Content | None:
        """Take the content header; return the message when it has no body."""
        self._expect_header()
        return self._take_header(_read_header(payload))

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> Content | None:
        """Take a content header too large to read; return the message when it has no body."""
        self._expect_header()
        self._unread = unread
        return self._take_header(ContentHeader(body_size, {}, None, b""))

    def _expect_header(self) -> None:
        if self._method is None or self._header is not None:
            raise UnexpectedFrameError(f"channel {self._number}: content header without a method")

    def _take_header(self, header: ContentHeader) -> Content | None:
        self._header = header
        self.announced = header.body_size if isinstance(self._method, BasicDeliver) else None
        if header.body_size == 0:
            return self._finish(b"")
        assert self._method is not None  # noqa: S101 - checked by _expect_header
        if self._passes(self._method, header.body_size):
            self.stream = BodyStream(header.body_size, resume=self._resume)
            return Content(self._method, header, b"", self._unread, self.stream)
        if header.body_size > BODY_SIZE_MAX:
            raise FrameError(
                f"channel {self._number}: a content header announcing a body of"
                f" {header.body_size} bytes, over the {BODY_SIZE_MAX} a message may have"
                " (RabbitMQ's largest max_message_size)"
            )
        self._body = bytearray()
        return None

    def pass_through(self, payload: memoryview) -> bool:
        """Feed a body frame to the stream; False when it is not taken now (it waits)."""
        stream = self.stream
        assert stream is not None  # noqa: S101 - the caller checks
        end = self._received + len(payload)
        if end > stream.size:
            raise FrameError(
                f"channel {self._number}: body frames of {end} bytes or more, over the"
                f" {stream.size} its content header announced"
            )
        if not stream.feed(payload):
            return False
        self._received = end
        if end == stream.size:
            self.stream = None
            self._finish(b"")
            stream.end(whole=True)
        return True

    def cut_off(self) -> None:
        """End the stream on its way, if any: the channel ended before its last byte.

        The rest of its frames, if they still come (a close the broker did not answer in
        time), are read and dropped, never held.
        """
        if (stream := self.stream) is not None:
            stream.cut()

    def on_body(self, payload: memoryview) -> Content | None:
        """Take a body frame; return the message once its body is whole."""
        header = self._header
        if self._method is None or header is None:
            raise UnexpectedFrameError(f"channel {self._number}: content body without a header")
        start = self._received
        end = self._received = start + len(payload)
        if end > header.body_size:
            raise FrameError(
                f"channel {self._number}: body frames of {end} bytes or more, over the"
                f" {header.body_size} its content header announced"
            )
        self._body += payload
        if end < header.body_size:
            return None
        return self._finish(self._body)

    def _finish(self, body: Body) -> Content:
        method, header, unread = self._method, self._header, self._unread
        self._method, self._header, self._unread, self._body = None, None, None, bytearray()
        assert method is not None  # noqa: S101 - checked by the callers
        assert header is not None  # noqa: S101
        return Content(method, header, body, unread)


_FIXED: Final = struct.Struct(">HHQ")  # class, weight, body size: what the broker routes by


def _read_header(payload: bytes) -> ContentHeader:
    """Read a content header; one whose properties do not parse keeps them as raw bytes."""
    try:
        return parse_content_header(payload)
    except WireError as e:
        if len(payload) < _FIXED.size + 2:
            raise FrameError(f"a content header of {len(payload)} bytes is truncated") from e
        _, _, body_size = _FIXED.unpack_from(payload, 0)
        raw = UndecodableTable(payload[_FIXED.size :], f"the content header cannot be read: {e}")
        return ContentHeader(body_size, {}, raw, payload)
