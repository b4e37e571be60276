"""AMQP 0-9-1 frames on the relay's hot path, in our own types: pure, no I/O.

The AMQP client (:mod:`sidecar.amqp`) reads and writes them; it lives outside the client's
package so that the pure core (settlement, delivery) can use its types without I/O.

The frames every message crosses (``basic.deliver`` with its content header and body,
``basic.publish`` with its, the broker's confirms and returns, our acks) are built and read
here with :mod:`struct` and :mod:`sidecar.wire`, once per message and without an
intermediate object per frame. Everything rarer (the handshake, channel and queue methods)
goes through pamqp in :mod:`sidecar.amqp.codec` and :mod:`sidecar.amqp.handshake`.

A frame is ``type:u8 channel:u16 size:u32 payload frame-end(0xCE)``; a method payload
starts with ``class:u16 method:u16``; a content header is ``class:u16 weight:u16
body-size:u64 flags:u16`` then the present properties in flag order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Final, NamedTuple

from sidecar.errors import WireError
from sidecar.wire.decode import decode_table
from sidecar.wire.encode import encode_table
from sidecar.wire.fields import read_u32

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.wire.delivery import Body
    from sidecar.wire.fields import FieldTable, FieldValue, PropertyValue

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "HEADER",
    "HEARTBEAT",
    "METHOD",
    "BasicDeliver",
    "BasicReturn",
    "ContentHeader",
    "UndecodableTable",
    "ack_frame",
    "body_frames",
    "content_header",
    "parse_confirm",
    "parse_content_header",
    "parse_deliver",
    "parse_return",
    "publish_frames",
    "publish_parts",
    "put_shortstr",
    "read_shortstr",
]

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE

# Method ids (class << 16 | method) the hot path reads or writes.
BASIC_CANCEL: Final = 60 << 16 | 30
BASIC_RETURN: Final = 60 << 16 | 50
BASIC_DELIVER: Final = 60 << 16 | 60
BASIC_ACK: Final = 60 << 16 | 80
BASIC_NACK: Final = 60 << 16 | 120

HEADER: Final = struct.Struct(">BHI")  # a frame's type, channel and payload size
METHOD: Final = struct.Struct(">I")  # a method payload's class and method, as one id
HEARTBEAT: Final = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

_CONTENT: Final = struct.Struct(">HHQH")  # class, weight, body size, property flags
_TAG: Final = struct.Struct(">QB")  # delivery tag and the bits after it
_ACK: Final = struct.Struct(">BHIIQBB")  # a whole basic.ack frame
_SHORTSTR_MAX: Final = 255

# The content properties of class basic, in wire order: (contract name, wire type). The
# first has flag bit 15, the last bit 2. ``headers`` is the field table.
_PROPERTIES: Final = (
    ("content_type", "s"),
    ("content_encoding", "s"),
    ("headers", "F"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "s"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "T"),
    ("type", "s"),
    ("user_id", "s"),
    ("app_id", "s"),
    ("cluster_id", "s"),
)
_FLAGGED: Final = tuple((1 << (15 - i), name, kind) for i, (name, kind) in enumerate(_PROPERTIES))


@dataclass(frozen=True, slots=True)
class UndecodableTable:
    """A header table our codec refused: kept as raw bytes so nothing is lost."""

    raw: bytes
    error: str


# A deliver's and a content header's values are made for every message: their
# ``__init__`` is written out, which the compiled build compiles
# (docs/decisions/0063-values-made-per-message.md).
@dataclass(frozen=True, slots=True, init=False)
class BasicDeliver:
    """The fields of a ``basic.deliver`` method."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str

    def __init__(
        self,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,  # noqa: FBT001 - a field
        exchange: str,
        routing_key: str,
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "consumer_tag", consumer_tag)
        object.__setattr__(self, "delivery_tag", delivery_tag)
        object.__setattr__(self, "redelivered", redelivered)
        object.__setattr__(self, "exchange", exchange)
        object.__setattr__(self, "routing_key", routing_key)


class BasicReturn(NamedTuple):
    """The fields of a ``basic.return`` method: a mandatory publish that did not route."""

    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True, init=False)
class ContentHeader:
    """A content header: the body's size, the properties, the header table, the bytes."""

    body_size: int
    properties: dict[str, PropertyValue]
    headers: FieldTable | UndecodableTable | None
    payload: bytes

    def __init__(
        self,
        body_size: int,
        properties: dict[str, PropertyValue],
        headers: FieldTable | UndecodableTable | None,
        payload: bytes,
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "body_size", body_size)
        object.__setattr__(self, "properties", properties)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "payload", payload)


# --- reading -------------------------------------------------------------------------------


def read_shortstr(buf: bytes, at: int) -> tuple[str, int]:
    """Read the short string at ``at``; return it and where it ends."""
    end = at + 1 + buf[at]
    if end > len(buf):
        raise WireError(f"short string at byte {at} runs past the end of its frame")
    # surrogateescape: a property that is not UTF-8 survives to the republish byte for byte.
    return buf[at + 1 : end].decode("utf-8", "surrogateescape"), end


def parse_deliver(payload: bytes) -> BasicDeliver:
    """Read a ``basic.deliver`` method payload (class and method ids included)."""
    try:
        consumer_tag, at = read_shortstr(payload, 4)
        delivery_tag: int
        bits: int
        delivery_tag, bits = _TAG.unpack_from(payload, at)
        exchange, at = read_shortstr(payload, at + 9)
        routing_key, _ = read_shortstr(payload, at)
    except (IndexError, struct.error) as e:
        raise WireError(f"basic.deliver is truncated: {e}") from None
    return BasicDeliver(consumer_tag, delivery_tag, bool(bits & 1), exchange, routing_key)


def parse_return(payload: bytes) -> BasicReturn:
    """Read a ``basic.return`` method payload (class and method ids included)."""
    try:
        (reply_code,) = struct.unpack_from(">H", payload, 4)
        reply_text, at = read_shortstr(payload, 6)
        exchange, at = read_shortstr(payload, at)
        routing_key, _ = read_shortstr(payload, at)
    except (IndexError, struct.error) as e:
        raise WireError(f"basic.return is truncated: {e}") from None
    return BasicReturn(reply_code, reply_text, exchange, routing_key)


def parse_confirm(payload: bytes) -> tuple[int, bool]:
    """Read a broker's ``basic.ack`` or ``basic.nack``: the delivery tag and ``multiple``."""
    try:
        delivery_tag, bits = _TAG.unpack_from(payload, 4)
    except struct.error as e:
        raise WireError(f"basic.ack/nack is truncated: {e}") from None
    return delivery_tag, bool(bits & 1)


def parse_content_header(payload: bytes) -> ContentHeader:
    """Read a content header; a header table our codec refuses is kept as raw bytes.

    Raises :class:`WireError` only when the frame itself is malformed (which the broker
    never sends); a bad table inside a good frame is an :class:`UndecodableTable`.
    """
    try:
        body_size: int
        flags: int
        _, _, body_size, flags = _CONTENT.unpack_from(payload, 0)
        at = _CONTENT.size
        properties: dict[str, PropertyValue] = {}
        headers: FieldTable | UndecodableTable | None = None
        for name, kind in _present(flags):
            if kind == "s":
                properties[name], at = read_shortstr(payload, at)
            elif kind == "F":
                headers, at = _read_table(payload, at)
            elif kind == "o":
                properties[name] = payload[at]
                at += 1
            else:  # "T"
                properties[name] = _read_u64(payload, at)
                at += 8
    except (IndexError, struct.error) as e:
        raise WireError(f"content header is truncated: {e}") from None
    return ContentHeader(body_size, properties, headers, payload)


@lru_cache(maxsize=256)
def _present(flags: int) -> tuple[tuple[str, str], ...]:
    """Return the properties a content header's flags say are present, in wire order."""
    return tuple((name, kind) for bit, name, kind in _FLAGGED if flags & bit)


def _read_u64(payload: bytes, at: int) -> int:
    """Return the timestamp at ``at``; IndexError when the frame ends before its 8 bytes."""
    if at + 8 > len(payload):
        raise IndexError("a timestamp runs past the end of the frame")
    return int.from_bytes(payload[at : at + 8], "big")


def _read_table(payload: bytes, at: int) -> tuple[FieldTable | UndecodableTable, int]:
    end = at + 4 + read_u32(payload, at)
    if end > len(payload):  # the frame is malformed, not the table
        raise IndexError("the header table runs past the end of the frame")
    try:
        table, _ = decode_table(payload, at)
    except WireError as e:
        # Refusing it would kill the connection and redeliver the message forever; keep
        # the bytes instead and let the relay quarantine the message with the reason.
        return UndecodableTable(payload[at:end], str(e)), end
    return table, end


# --- writing -------------------------------------------------------------------------------


def put_shortstr(value: str, out: list[bytes], what: str) -> None:
    """Append the wire bytes of a short string; ``what`` names it in the error."""
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > _SHORTSTR_MAX:
        raise WireError(f"{what} is {len(raw)} bytes, over the 255 a short string allows")
    out.append(bytes((len(raw),)))
    out.append(raw)


def _properties_payload(
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue] | UndecodableTable | None,
) -> tuple[int, list[bytes]]:
    flags = 0
    out: list[bytes] = []
    for bit, name, kind in _FLAGGED:
        if kind == "F":
            if not headers:
                continue
            flags |= bit
            out.append(
                headers.raw if isinstance(headers, UndecodableTable) else encode_table(headers)
            )
            continue
        value = properties.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "s":
            put_shortstr(str(value), out, f"property {name}")
        elif kind == "o":
            if not isinstance(value, int) or not 0 <= value <= 0xFF:
                raise WireError(f"property {name} is {value!r}, not an octet (0..255)")
            out.append(bytes((value,)))
        else:  # "T"
            if not isinstance(value, int) or not 0 <= value < 1 << 64:
                raise WireError(f"property {name} is {value!r}, not an unsigned 64-bit time")
            out.append(value.to_bytes(8, "big"))
    return flags, out


def content_header(
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue] | UndecodableTable | None,
    *,
    body_size: int,
    frame_max: int,
) -> bytes:
    """Return the payload of a content header frame for these properties and headers.

    Raises :class:`WireError` for a value the wire cannot carry (a short string over 255
    bytes, an out-of-range property, an unencodable header) or a header too big for one
    frame of ``frame_max`` bytes, which the broker would answer by closing the connection.
    """
    flags, props = _properties_payload(properties, headers)
    payload = _CONTENT.pack(60, 0, body_size, flags) + b"".join(props)
    if len(payload) > frame_max - 8:
        raise WireError(
            f"the message's properties take {len(payload)} bytes,"
            f" over the broker's frame size of {frame_max}"
        )
    return payload


def publish_frames(
    channel: int,
    *,
    exchange: str,
    routing_key: str,
    body: Body,
    content_header: bytes,
    frame_max: int,
    mandatory: bool = True,
) -> bytes:
    """Return the bytes of one ``basic.publish``: method, content header and body frames.

    ``content_header`` is the payload :func:`content_header` made for this body, or a
    received one for the same body: a message nothing changed in goes out as it came.
    Raises :class:`WireError` (and writes nothing) for a name over 255 bytes.
    """
    method_payload = _publish_method(exchange, routing_key, mandatory=mandatory)
    end = b"\xce"
    out: list[bytes | bytearray] = [
        HEADER.pack(FRAME_METHOD, channel, len(method_payload)),
        method_payload,
        end,
        HEADER.pack(FRAME_HEADER, channel, len(content_header)),
        content_header,
        end,
    ]
    step = frame_max - 8
    for start in range(0, len(body), step):
        chunk = body[start : start + step]
        out += (HEADER.pack(FRAME_BODY, channel, len(chunk)), chunk, end)
    return b"".join(out)


def publish_parts(
    channel: int,
    *,
    exchange: str,
    routing_key: str,
    body: Body,
    content_header: bytes,
    frame_max: int,
    mandatory: bool = True,
) -> list[bytes | memoryview]:
    """Return the bytes of :func:`publish_frames` in parts, the body's as views of ``body``.

    For a large body: written part by part as the socket takes them, it is never copied
    whole (``publish_frames`` joins a copy of it). Each body frame is two parts: its
    payload, then its frame-end octet with the next frame's head.
    """
    method_payload = _publish_method(exchange, routing_key, mandatory=mandatory)
    end = b"\xce"
    head = [
        HEADER.pack(FRAME_METHOD, channel, len(method_payload)),
        method_payload,
        end,
        HEADER.pack(FRAME_HEADER, channel, len(content_header)),
        content_header,
        end,
    ]
    parts: list[bytes | memoryview] = []
    view = memoryview(body)
    step = frame_max - 8
    for start in range(0, len(body), step):
        chunk = view[start : start + step]
        head.append(HEADER.pack(FRAME_BODY, channel, len(chunk)))
        parts += (b"".join(head), chunk)
        head = [end]
    parts.append(b"".join(head))
    return parts


def body_frames(channel: int, payload: bytes | memoryview, *, frame_max: int) -> bytes:
    """Return body frames carrying ``payload`` (a copy of it), each within ``frame_max``.

    For a body passed through as it arrives: a received frame's payload fits the frame
    size the consuming connection agreed, which may be larger than the publishing one's.
    """
    end = b"\xce"
    out: list[bytes | memoryview] = []
    step = frame_max - 8
    for start in range(0, len(payload), step):
        chunk = payload[start : start + step]
        out += (HEADER.pack(FRAME_BODY, channel, len(chunk)), chunk, end)
    return b"".join(out)


# A route publishes to one or two exchanges with one or a few routing keys: the method
# payload is made once for each (a refused name raises, and is not cached).
@lru_cache(maxsize=1024)
def _publish_method(exchange: str, routing_key: str, *, mandatory: bool) -> bytes:
    """Return the payload of a ``basic.publish`` method to this exchange and routing key."""
    method: list[bytes] = [b"\x00\x3c\x00\x28\x00\x00"]  # basic.publish, ticket 0
    put_shortstr(exchange, method, "exchange name")
    put_shortstr(routing_key, method, "routing key")
    method.append(b"\x01" if mandatory else b"\x00")
    return b"".join(method)


def ack_frame(channel: int, delivery_tag: int, *, multiple: bool = False) -> bytes:
    """Return the bytes of our ``basic.ack`` for a delivery (or all up to it: ``multiple``)."""
    return _ACK.pack(
        FRAME_METHOD, channel, 13, BASIC_ACK, delivery_tag, 1 if multiple else 0, FRAME_END
    )
