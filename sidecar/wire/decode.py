"""The field-table decoder: AMQP 0-9-1 table bytes in, values that keep their wire tag out.

This module owns the reading of RabbitMQ's errata type tags into the classes of
:mod:`sidecar.wire.values` (the table in ``sidecar/wire/__init__.py``), so that the encoder
writes the same bytes again. It must never raise anything but :class:`WireError` for
malformed bytes, and never recurse deeper than ``MAX_DEPTH``. Pure: no I/O.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from sidecar.errors import WireError
from sidecar.wire.fields import (
    F64,
    MAX_DEPTH,
    U8,
    U32,
    U64,
    FieldError,
    read_i32,
    read_u32,
    too_deep,
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

if TYPE_CHECKING:
    from sidecar.wire.fields import FieldArray, FieldTable, FieldValue

__all__ = ["decode_table", "decode_table_for_pamqp"]

_I8: Final = struct.Struct(">b")
_I16: Final = struct.Struct(">h")
_U16: Final = struct.Struct(">H")
_F32: Final = struct.Struct(">f")
_DECIMAL: Final = struct.Struct(">Bi")  # scale octet, then the signed unscaled value

# What each tag is called in error messages.
_TAG_NAMES: Final = {
    ord("S"): "long string",
    ord("I"): "Int32",
    ord("l"): "Int64",
    ord("t"): "bool",
    ord("F"): "table",
    ord("A"): "array",
    ord("T"): "Timestamp",
    ord("V"): "void",
    ord("x"): "byte array",
    ord("b"): "Int8",
    ord("B"): "UInt8",
    ord("s"): "Int16",
    ord("u"): "UInt16",
    ord("i"): "UInt32",
    ord("L"): "UInt64",
    ord("f"): "Float32",
    ord("d"): "float",
    ord("D"): "Decimal",
    0: "void",
}


def decode_table(data: bytes | memoryview, offset: int = 0) -> tuple[FieldTable, int]:
    """Decode the field table whose 4-byte length is at ``offset``; return it and the end offset.

    Every value comes back as the class that names its wire tag (the table in
    :mod:`sidecar.wire`), so :func:`encode_table` writes the same bytes again. The zero-byte
    void tag that pamqp accepts decodes to ``None`` (and re-encodes as ``V``); a boolean octet
    other than 0 or 1 decodes to ``True`` (and re-encodes as 1). A table that names a field
    twice is an error rather than silently keeping one of the values.

    Raises :class:`WireError`, and nothing else, for any malformed bytes: truncation, a
    length past the end of its container, an unknown tag, nesting deeper than
    :data:`MAX_DEPTH`. The message names the field, e.g. ``x-death[0].count``.
    """
    if offset < 0:
        raise WireError(f"field table: offset {offset} is negative")
    buf = data if type(data) is bytes else _copy_through_table(data, offset)
    try:
        return _decode_table(buf, offset, len(buf), 0)
    except FieldError as e:
        raise e.to_wire_error() from None


def _copy_through_table(data: bytes | memoryview, offset: int) -> bytes:
    """Return ``data`` up to the end of the table at ``offset`` as ``bytes``.

    One copy per table: ``bytes.decode`` is twice as fast as decoding a memoryview slice, and
    the table (a frame's headers, never its body) is small. Offsets stay those of ``data``.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError as e:
        raise WireError(f"field table: cannot read the buffer as bytes: {e}") from None
    if offset + 4 > len(view):
        return view.tobytes()
    return view[: offset + 4 + U32.unpack_from(view, offset)[0]].tobytes()


def decode_table_for_pamqp(data: bytes) -> tuple[int, FieldTable]:
    """Decode the table at the start of ``data``; return (bytes consumed, table).

    The shape of ``pamqp.decode.METHODS["table"]``, which the adapter replaces with this.
    :class:`WireError` is a ``ValueError``, which is what pamqp's own decoders raise.
    """
    table, end = decode_table(data)
    return end, table


def _decode_table(  # noqa: C901, PLR0912 - the hot loop, one function: no call per field
    buf: bytes, o: int, limit: int, depth: int
) -> tuple[FieldTable, int]:
    """Decode the table whose length is at ``o``; it must end by ``limit``, its container's end."""
    if o + 4 > limit:
        raise FieldError(f"table length at offset {o} needs 4 bytes, {max(limit - o, 0)} left")
    length = read_u32(buf, o)
    end = o + 4 + length
    if end > limit:
        raise FieldError(
            f"table of {end - o - 4} bytes at offset {o} runs {end - limit} bytes past the end "
            + ("of the data" if depth == 0 else "of its container")
        )
    o += 4
    table: FieldTable = {}
    while o < end:
        size = buf[o]
        start = o + 1
        o = start + size
        if o >= end:
            raise _bad_name(buf, start, o, end)
        try:
            name = buf[start:o].decode()
        except UnicodeDecodeError:
            # Any bytes: surrogateescape maps them to lone surrogates and back again.
            name = buf[start:o].decode("utf-8", "surrogateescape")
        at = o
        try:
            if buf[at] == 0x53:  # S, most headers: decoded here to save a call per entry
                length = read_u32(buf, at + 1)
                o = at + 5 + length
                if o > end:
                    raise _overrun(buf, at, o - end)
                raw = buf[at + 5 : o]
                try:
                    value: FieldValue = raw.decode()
                except UnicodeDecodeError:
                    value = raw
            else:
                value, o = _decode_value(buf, at, end, depth)
        except FieldError as e:
            raise e.within(name) from None
        except (struct.error, IndexError):
            raise _truncated(buf, at).within(name) from None
        if o > end:
            raise _overrun(buf, at, o - end).within(name)
        if name in table:
            raise FieldError("the field name appears twice in its table").within(name)
        table[name] = value
    return table, end


def _decode_array(buf: bytes, o: int, limit: int, depth: int) -> tuple[FieldArray, int]:
    """Decode the array whose byte length is at ``o``; it must end by ``limit``."""
    length = read_u32(buf, o)
    end = o + 4 + length
    if end > limit:
        raise FieldError(
            f"array of {end - o - 4} bytes at offset {o} runs {end - limit} bytes past the end "
            "of its container"
        )
    o += 4
    items: FieldArray = []
    while o < end:
        at = o
        try:
            value, o = _decode_value(buf, o, end, depth)
        except FieldError as e:
            raise e.within(len(items)) from None
        except (struct.error, IndexError):
            raise _truncated(buf, at).within(len(items)) from None
        if o > end:
            raise _overrun(buf, at, o - end).within(len(items))
        items.append(value)
    return items, end


def _decode_value(  # noqa: C901, PLR0911, PLR0912 - one branch per wire tag, by frequency
    buf: bytes, at: int, limit: int, depth: int
) -> tuple[FieldValue, int]:
    """Decode the tagged value at ``at``; return it and the offset just past it.

    Fixed-width values are read without a bounds check: ``struct.error`` or ``IndexError``
    (past the buffer) and the caller's ``o > end`` check (past the container) cover them.
    The branches are ordered by how often the tags occur in real headers.
    """
    tag = buf[at]
    o = at + 1
    if tag == 0x53:  # S
        length = read_u32(buf, o)
        end = o + 4 + length
        if end > limit:
            raise _overrun(buf, at, end - limit)
        raw = buf[o + 4 : end]
        try:
            return raw.decode(), end
        except UnicodeDecodeError:
            return raw, end
    if tag == 0x49:  # I
        return Int32(read_i32(buf, o)), o + 4
    if tag == 0x6C:  # l: the signed high word, then the low one
        return Int64(read_i32(buf, o) << 32 | read_u32(buf, o + 4)), o + 8
    if tag == 0x74:  # t
        return U8.unpack_from(buf, o)[0] != 0, o + 1
    if tag == 0x46:  # F
        if depth == MAX_DEPTH:
            raise too_deep()
        return _decode_table(buf, o, limit, depth + 1)
    if tag == 0x41:  # A
        if depth == MAX_DEPTH:
            raise too_deep()
        return _decode_array(buf, o, limit, depth + 1)
    if tag == 0x54:  # T
        return Timestamp(U64.unpack_from(buf, o)[0]), o + 8
    if tag in (0x56, 0x00):  # V, and the zero byte pamqp also reads as void
        return None, o
    if tag == 0x78:  # x
        length = read_u32(buf, o)
        end = o + 4 + length
        if end > limit:
            raise _overrun(buf, at, end - limit)
        return ByteArray(buf[o + 4 : end]), end
    if tag == 0x62:  # b
        return Int8(_I8.unpack_from(buf, o)[0]), o + 1
    if tag == 0x42:  # B
        return UInt8(U8.unpack_from(buf, o)[0]), o + 1
    if tag == 0x73:  # s
        return Int16(_I16.unpack_from(buf, o)[0]), o + 2
    if tag == 0x75:  # u
        return UInt16(_U16.unpack_from(buf, o)[0]), o + 2
    if tag == 0x69:  # i
        return UInt32(read_u32(buf, o)), o + 4
    if tag == 0x4C:  # L
        return UInt64(U64.unpack_from(buf, o)[0]), o + 8
    if tag == 0x66:  # f
        single = _F32.unpack_from(buf, o)[0]
        if math.isnan(single):  # NaN: widen by hand so a signalling NaN keeps its bits
            single = _widen_float32_nan(U32.unpack_from(buf, o)[0])
        return Float32(single), o + 4
    if tag == 0x64:  # d
        return F64.unpack_from(buf, o)[0], o + 8
    if tag == 0x44:  # D
        scale, unscaled = _DECIMAL.unpack_from(buf, o)
        # Built from text, so the exponent is exactly -scale whatever the decimal context.
        return Decimal(f"{unscaled}E-{scale}"), o + 5
    raise FieldError(f"unknown type tag {bytes((tag,))!r} at offset {at}")


def _bad_name(buf: bytes, start: int, stop: int, end: int) -> FieldError:
    """Return the error for a field name that leaves no room for its value in the table."""
    if stop > end:
        return FieldError(
            f"field name of {stop - start} bytes at offset {start - 1} runs past the end of "
            "its table"
        )
    name = buf[start:stop].decode("utf-8", "surrogateescape")
    return FieldError(f"no type tag after the field name at offset {start - 1}").within(name)


def _truncated(buf: bytes, at: int) -> FieldError:
    """Return the error for the value tagged at ``at`` running past the end of the data."""
    kind = _TAG_NAMES.get(buf[at], "value")
    return FieldError(f"{kind} at offset {at} runs past the end of the data")


def _overrun(buf: bytes, at: int, excess: int) -> FieldError:
    """Return the error for the value tagged at ``at`` running past its container's end."""
    kind = _TAG_NAMES.get(buf[at], "value")
    return FieldError(f"{kind} at offset {at} runs {excess} bytes past the end of its container")


def _widen_float32_nan(bits: int) -> float:
    """Return the double NaN that narrows back to the float32 NaN ``bits``, payload and all.

    CPython's ``struct`` widens ``f`` through the C cast, which quiets a signalling NaN on
    x86 (``7f800001`` comes back as ``7fc00001``): the re-encoded table would differ.
    """
    double = ((bits & 0x8000_0000) << 32) | 0x7FF0_0000_0000_0000 | ((bits & 0x007F_FFFF) << 29)
    return float(F64.unpack(U64.pack(double))[0])
