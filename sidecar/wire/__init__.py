"""The wire: typed AMQP field values, the header-table codec, the hot frames.

This package owns the bytes the relay reads and writes and the values that stand for them:
the field value classes (``values``, never compiled), the table codec (``decode``,
``encode``, ``scalars``, sharing ``fields``), the frames of the hot path (``frames``), and
the values the transport hands the relay (``delivery``). Where the broker is, and which
to try next, is ``sidecar.broker``'s. It is pure: no I/O, no client library, no clock.
Import from this face; the modules inside import each other directly.
"""

# Python value  <->  wire tag (pamqp forgets wire types; the adapter routes tables here)
# - ``str``                       S  long string, valid UTF-8
# - ``bytes`` (exactly)           S  long string that is not valid UTF-8
# - ``ByteArray``                 x  byte array
# - ``bool``                      t
# - ``Int8`` ``UInt8``            b  B
# - ``Int16`` ``UInt16``          s  u
# - ``Int32`` ``UInt32``          I  i
# - ``Int64`` ``UInt64``          l  L
# - ``Float32``                   f
# - ``float`` (exactly)           d  64-bit
# - ``decimal.Decimal``           D  the exponent is the AMQP scale: ``Decimal("1.50")`` is scale 2
# - ``Timestamp``                 T  seconds since the epoch
# - ``None``                      V  void
# - ``dict``                      F  nested table
# - ``list``                      A  array
# A plain ``int`` (not one of the width classes) is accepted by the encoder and written as
# ``I`` when it fits 32 bits, else ``l``; the decoder never produces one.

from __future__ import annotations

from sidecar.wire.decode import decode_table, decode_table_for_pamqp
from sidecar.wire.delivery import Body, Delivery, PublishOutcome, UnreadBody, UnreadHeader
from sidecar.wire.encode import encode_table, encode_table_for_pamqp, tag_of
from sidecar.wire.fields import (
    INT_BOUNDS,
    MAX_DEPTH,
    FieldArray,
    FieldTable,
    FieldValue,
    PropertyValue,
    read_u32,
)
from sidecar.wire.frames import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_RETURN,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEADER,
    HEARTBEAT,
    METHOD,
    BasicDeliver,
    BasicReturn,
    ContentHeader,
    UndecodableTable,
    ack_frame,
    body_frames,
    content_header,
    parse_confirm,
    parse_content_header,
    parse_deliver,
    parse_return,
    publish_frames,
    publish_parts,
    put_shortstr,
    read_shortstr,
)
from sidecar.wire.values import (
    ByteArray,
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
)

__all__ = [
    "BASIC_ACK",
    "BASIC_CANCEL",
    "BASIC_DELIVER",
    "BASIC_NACK",
    "BASIC_RETURN",
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "HEADER",
    "HEARTBEAT",
    "INT_BOUNDS",
    "MAX_DEPTH",
    "METHOD",
    "BasicDeliver",
    "BasicReturn",
    "Body",
    "ByteArray",
    "ContentHeader",
    "Delivery",
    "FieldArray",
    "FieldTable",
    "FieldValue",
    "Float32",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "PropertyValue",
    "PublishOutcome",
    "Timestamp",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "UndecodableTable",
    "UnreadBody",
    "UnreadHeader",
    "ack_frame",
    "body_frames",
    "content_header",
    "decode_table",
    "decode_table_for_pamqp",
    "encode_table",
    "encode_table_for_pamqp",
    "parse_confirm",
    "parse_content_header",
    "parse_deliver",
    "parse_return",
    "publish_frames",
    "publish_parts",
    "put_shortstr",
    "read_shortstr",
    "read_u32",
    "tag_of",
]
