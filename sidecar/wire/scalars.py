"""The encoders of single field values, and the wire tag of each class they accept.

This module owns how one scalar is written (its tag, then its bytes by ``struct``, which
checks the range), the float32 NaN payload on the way out, and the two dispatch tables
the encoder reads: ``SCALAR_ENCODERS`` by exact class and ``TAGS`` by class. It must not
handle tables or arrays (:mod:`sidecar.wire.encode` does, with the depth). Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from sidecar.wire.fields import F64, U64, FieldError
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

if TYPE_CHECKING:
    from collections.abc import Callable, Sized

__all__ = ["SCALAR_ENCODERS", "TAGS"]

_TAG_I32: Final = struct.Struct(">ci")
_TAG_U32: Final = struct.Struct(">cI")
_TAG_I64: Final = struct.Struct(">cq")
_TAG_U64: Final = struct.Struct(">cQ")
_TAG_F32: Final = struct.Struct(">cf")
_TAG_DECIMAL: Final = struct.Struct(">cBi")


# len called through a name: compiled, len of a bytes parameter reads the object's size
# field and would skip a subclass's own __len__.
_length: Callable[[Sized], int] = len


def _encode_str(value: str, out: list[bytes]) -> None:
    """Append ``value`` as a UTF-8 long string (``S``)."""
    raw = value.encode()
    out.append(_TAG_U32.pack(b"S", len(raw)))
    out.append(raw)


def _encode_bytes(value: bytes, out: list[bytes]) -> None:
    """Append ``value`` as a long string of raw bytes (``S``)."""
    out.append(_TAG_U32.pack(b"S", _length(value)))
    out.append(bytes(value))


def _encode_byte_array(value: bytes | bytearray, out: list[bytes]) -> None:
    """Append ``value`` as a byte array (``x``)."""
    out.append(_TAG_U32.pack(b"x", _length(value)))
    out.append(bytes(value))


def _encode_bool(value: bool, out: list[bytes]) -> None:  # noqa: FBT001 - an AMQP value
    """Append ``value`` as a boolean octet (``t``)."""
    out.append(b"t\x01" if value else b"t\x00")


def _encode_void(_value: None, out: list[bytes]) -> None:
    """Append a void (``V``)."""
    out.append(b"V")


def _encode_int(value: int, out: list[bytes]) -> None:
    """Append a plain ``int`` as ``I`` when it fits 32 bits, else ``l`` (struct checks 64)."""
    if -0x8000_0000 <= value <= 0x7FFF_FFFF:
        out.append(_TAG_I32.pack(b"I", value))
    else:
        out.append(_TAG_I64.pack(b"l", value))


def _encode_float32(value: float, out: list[bytes]) -> None:
    """Append ``value`` as a 32-bit float (``f``); a NaN keeps its payload's top bits."""
    if math.isnan(value):
        out.append(_TAG_U32.pack(b"f", _narrow_nan_to_float32(value)))
    else:
        out.append(_TAG_F32.pack(b"f", value))


def _narrow_nan_to_float32(value: float) -> int:
    """Return the float32 bits of the NaN ``value``, keeping the top of its payload."""
    double: int = U64.unpack(F64.pack(value))[0]
    mantissa = (double >> 29) & 0x007F_FFFF
    # A payload only in the low 29 bits would narrow to infinity: make it the quiet NaN.
    return ((double >> 32) & 0x8000_0000) | 0x7F80_0000 | (mantissa or 0x0040_0000)


def _encode_decimal(value: Decimal, out: list[bytes]) -> None:
    """Append ``value`` as scale octet and signed 32-bit unscaled value (``D``).

    Worked from ``as_tuple()``, never through arithmetic, so the ambient decimal context
    (precision, traps) cannot round or raise.
    """
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise FieldError(f"Decimal {value} has no AMQP encoding; only finite decimals do")
    if exponent >= 0:
        # AMQP has no negative scale: write the integer it denotes at scale 0.
        scale = 0
        if digits != (0,) and len(digits) + exponent > 10:
            raise _decimal_range(value)
        unscaled = int(value)
    else:
        scale = -exponent
        if scale > 255:
            raise FieldError(f"Decimal {value} has scale {scale}; AMQP allows 0..255")
        if len(digits) > 10:
            raise _decimal_range(value)
        unscaled = int(Decimal((sign, digits, 0)))
    try:
        out.append(_TAG_DECIMAL.pack(b"D", scale, unscaled))
    except struct.error:
        raise _decimal_range(value) from None


def _decimal_range(value: Decimal) -> FieldError:
    """Return the error for a decimal whose unscaled value needs more than 32 bits."""
    return FieldError(
        f"Decimal {value} needs an unscaled value outside signed 32-bit (-2147483648..2147483647)"
    )


_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_SECOND: Final = dt.timedelta(seconds=1)


def _encode_datetime(value: dt.datetime, out: list[bytes]) -> None:
    """Append ``value`` as whole seconds since the epoch (``T``); naive means UTC, as in pamqp."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=dt.UTC)
    out.append(_TAG_U64.pack(b"T", (value - _EPOCH) // _ONE_SECOND))


def _fixed_width(tag: bytes, code: str) -> Callable[[int | float, list[bytes]], None]:
    """Return an encoder writing ``tag`` then the value in struct format ``code``."""
    pack = struct.Struct(">c" + code).pack

    # int | float, not float: compiled, a float parameter would turn an int into a float.
    def encode(value: int | float, out: list[bytes]) -> None:  # noqa: PYI041
        out.append(pack(tag, value))

    encode.__doc__ = f"Append the value as {tag.decode()} ({code!r}); struct checks the range."
    return encode


# Dispatch on the exact class: bool is an int and ByteArray is bytes, so order-dependent
# isinstance chains would be both slower and easier to get wrong. Tables and arrays are not
# here because they need the depth; sidecar.wire.encode handles them.
SCALAR_ENCODERS: Final[dict[type, Callable[[Any, list[bytes]], None]]] = {
    str: _encode_str,
    Int32: _fixed_width(b"I", "i"),
    Int64: _fixed_width(b"l", "q"),
    bool: _encode_bool,
    Timestamp: _fixed_width(b"T", "Q"),
    type(None): _encode_void,
    int: _encode_int,
    bytes: _encode_bytes,
    ByteArray: _encode_byte_array,
    bytearray: _encode_byte_array,
    Int8: _fixed_width(b"b", "b"),
    UInt8: _fixed_width(b"B", "B"),
    Int16: _fixed_width(b"s", "h"),
    UInt16: _fixed_width(b"u", "H"),
    UInt32: _fixed_width(b"i", "I"),
    UInt64: _fixed_width(b"L", "Q"),
    Float32: _encode_float32,
    float: _fixed_width(b"d", "d"),
    Decimal: _encode_decimal,
    dt.datetime: _encode_datetime,
}

TAGS: Final[dict[type, str]] = {
    str: "S",
    bytes: "S",
    ByteArray: "x",
    bytearray: "x",
    bool: "t",
    Int8: "b",
    UInt8: "B",
    Int16: "s",
    UInt16: "u",
    Int32: "I",
    UInt32: "i",
    Int64: "l",
    UInt64: "L",
    Timestamp: "T",
    dt.datetime: "T",
    Float32: "f",
    float: "d",
    Decimal: "D",
    type(None): "V",
    dict: "F",
    list: "A",
    int: "I",  # or "l": tag_of decides by size
}
