"""Typed AMQP field values and a header-table codec that keeps every value's wire type.

This module owns the mapping between the bytes of an AMQP 0-9-1 field table (RabbitMQ's
errata type tags) and Python values that remember their tag. It is pure: no I/O, no
client library. pamqp, which aiormq uses, forgets wire types (every float is written back
as 32-bit, integer widths are re-chosen, non-UTF-8 long strings cannot be re-encoded);
the adapter routes header tables through this codec instead.

Python value  <->  wire tag
- ``str``                       S  long string, valid UTF-8
- ``bytes`` (exactly)           S  long string that is not valid UTF-8
- ``ByteArray``                 x  byte array
- ``bool``                      t
- ``Int8`` ``UInt8``            b  B
- ``Int16`` ``UInt16``          s  u
- ``Int32`` ``UInt32``          I  i
- ``Int64`` ``UInt64``          l  L
- ``Float32``                   f
- ``float`` (exactly)           d  64-bit
- ``decimal.Decimal``           D  the exponent is the AMQP scale: ``Decimal("1.50")`` is scale 2
- ``Timestamp``                 T  seconds since the epoch
- ``None``                      V  void
- ``dict``                      F  nested table
- ``list``                      A  array

A plain ``int`` (not one of the width classes) is accepted by the encoder and written as
``I`` when it fits 32 bits, else ``l``; the decoder never produces one.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Callable, Mapping, Sequence, Sized
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final, TypeAlias, cast

from sidecar.errors import WireError

# The value classes are defined in a module of their own, never compiled: mypyc (the
# optional compiled build, scripts/compile) cannot compile subclasses of int, float and
# bytes, and this module's code must see them as the plain Python classes they are.
from sidecar.field_types import (
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
    "INT_BOUNDS",
    "MAX_DEPTH",
    "ByteArray",
    "FieldArray",
    "FieldTable",
    "FieldValue",
    "Float32",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Timestamp",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "decode_table",
    "decode_table_for_pamqp",
    "encode_table",
    "encode_table_for_pamqp",
    "tag_of",
]


# The range of every integer class: the one home of the AMQP integer bounds.
INT_BOUNDS: Final[Mapping[type[int], tuple[int, int]]] = MappingProxyType(
    {
        Int8: (-(2**7), 2**7 - 1),
        UInt8: (0, 2**8 - 1),
        Int16: (-(2**15), 2**15 - 1),
        UInt16: (0, 2**16 - 1),
        Int32: (-(2**31), 2**31 - 1),
        UInt32: (0, 2**32 - 1),
        Int64: (-(2**63), 2**63 - 1),
        UInt64: (0, 2**64 - 1),
        Timestamp: (0, 2**64 - 1),
    }
)


FieldTable: TypeAlias = "dict[str, FieldValue]"
FieldArray: TypeAlias = "list[FieldValue]"
FieldValue: TypeAlias = (
    "str | bytes | bool | int | float | Decimal | FieldTable | FieldArray | None"
)


MAX_DEPTH: Final = 64
"""How deep tables and arrays may nest below the outermost table, decoding or encoding.

It bounds recursion on hostile bytes, and turns a dict that contains itself into an error.
"""

# Compiled once: decoding and encoding run for every relayed message.
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_DECIMAL = struct.Struct(">Bi")  # scale octet, then the signed unscaled value
_TAG_I32 = struct.Struct(">ci")
_TAG_U32 = struct.Struct(">cI")
_TAG_I64 = struct.Struct(">cq")
_TAG_U64 = struct.Struct(">cQ")
_TAG_F32 = struct.Struct(">cf")
_TAG_DECIMAL = struct.Struct(">cBi")

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


class _FieldError(Exception):
    """A problem found inside a table; each enclosing container adds its name on the way out.

    Private: the public functions turn it into :class:`WireError` with the whole path, so the
    happy path never builds a path string.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []  # innermost first: names of tables, indexes of arrays

    def within(self, part: str | int) -> _FieldError:
        """Record that the problem lies inside field ``part``; return self for ``raise``."""
        self.path.append(part)
        return self

    def to_wire_error(self) -> WireError:
        """Return the public error, naming the field like ``x-death[0].count``."""
        where = ""
        for part in reversed(self.path):
            if isinstance(part, int):
                where += f"[{part}]"
            else:
                name = part if part.isprintable() and part else repr(part)
                if len(name) > 60:
                    name = name[:57] + "..."
                where += f".{name}" if where else name
        return WireError(f"{where or 'field table'}: {self.problem}")


# ----------------------------------------------------------------------------- decoding


def decode_table(data: bytes | memoryview, offset: int = 0) -> tuple[FieldTable, int]:
    """Decode the field table whose 4-byte length is at ``offset``; return it and the end offset.

    Every value comes back as the class that names its wire tag (see the module docstring),
    so :func:`encode_table` writes the same bytes again. The zero-byte void tag that pamqp
    accepts decodes to ``None`` (and re-encodes as ``V``); a boolean octet other than 0 or 1
    decodes to ``True`` (and re-encodes as 1). A table that names a field twice is an error
    rather than silently keeping one of the values.

    Raises :class:`WireError`, and nothing else, for any malformed bytes: truncation, a
    length past the end of its container, an unknown tag, nesting deeper than
    :data:`MAX_DEPTH`. The message names the field, e.g. ``x-death[0].count``.
    """
    if offset < 0:
        raise WireError(f"field table: offset {offset} is negative")
    buf = data if type(data) is bytes else _copy_through_table(data, offset)
    try:
        return _decode_table(buf, offset, len(buf), 0)
    except _FieldError as e:
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
    return view[: offset + 4 + _U32.unpack_from(view, offset)[0]].tobytes()


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
        raise _FieldError(f"table length at offset {o} needs 4 bytes, {max(limit - o, 0)} left")
    end = o + 4 + _U32.unpack_from(buf, o)[0]
    if end > limit:
        raise _FieldError(
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
                o = at + 5 + _U32.unpack_from(buf, at + 1)[0]
                if o > end:
                    raise _overrun(buf, at, o - end)
                raw = buf[at + 5 : o]
                try:
                    value: FieldValue = raw.decode()
                except UnicodeDecodeError:
                    value = raw
            else:
                value, o = _decode_value(buf, at, end, depth)
        except _FieldError as e:
            raise e.within(name) from None
        except struct.error:
            raise _truncated(buf, at).within(name) from None
        if o > end:
            raise _overrun(buf, at, o - end).within(name)
        if name in table:
            raise _FieldError("the field name appears twice in its table").within(name)
        table[name] = value
    return table, end


def _decode_array(buf: bytes, o: int, limit: int, depth: int) -> tuple[FieldArray, int]:
    """Decode the array whose byte length is at ``o``; it must end by ``limit``."""
    end = o + 4 + _U32.unpack_from(buf, o)[0]
    if end > limit:
        raise _FieldError(
            f"array of {end - o - 4} bytes at offset {o} runs {end - limit} bytes past the end "
            "of its container"
        )
    o += 4
    items: FieldArray = []
    while o < end:
        at = o
        try:
            value, o = _decode_value(buf, o, end, depth)
        except _FieldError as e:
            raise e.within(len(items)) from None
        except struct.error:
            raise _truncated(buf, at).within(len(items)) from None
        if o > end:
            raise _overrun(buf, at, o - end).within(len(items))
        items.append(value)
    return items, end


def _decode_value(  # noqa: C901, PLR0911, PLR0912 - one branch per wire tag, by frequency
    buf: bytes, at: int, limit: int, depth: int
) -> tuple[FieldValue, int]:
    """Decode the tagged value at ``at``; return it and the offset just past it.

    Fixed-width values are read without a bounds check: ``struct.error`` (past the buffer)
    and the caller's ``o > end`` check (past the container) cover them. The branches are
    ordered by how often the tags occur in real headers.
    """
    tag = buf[at]
    o = at + 1
    if tag == 0x53:  # S
        end = o + 4 + _U32.unpack_from(buf, o)[0]
        if end > limit:
            raise _overrun(buf, at, end - limit)
        raw = buf[o + 4 : end]
        try:
            return raw.decode(), end
        except UnicodeDecodeError:
            return raw, end
    if tag == 0x49:  # I
        return Int32(_I32.unpack_from(buf, o)[0]), o + 4
    if tag == 0x6C:  # l
        return Int64(_I64.unpack_from(buf, o)[0]), o + 8
    if tag == 0x74:  # t
        return _U8.unpack_from(buf, o)[0] != 0, o + 1
    if tag == 0x46:  # F
        if depth == MAX_DEPTH:
            raise _too_deep()
        return _decode_table(buf, o, limit, depth + 1)
    if tag == 0x41:  # A
        if depth == MAX_DEPTH:
            raise _too_deep()
        return _decode_array(buf, o, limit, depth + 1)
    if tag == 0x54:  # T
        return Timestamp(_U64.unpack_from(buf, o)[0]), o + 8
    if tag in (0x56, 0x00):  # V, and the zero byte pamqp also reads as void
        return None, o
    if tag == 0x78:  # x
        end = o + 4 + _U32.unpack_from(buf, o)[0]
        if end > limit:
            raise _overrun(buf, at, end - limit)
        return ByteArray(buf[o + 4 : end]), end
    if tag == 0x62:  # b
        return Int8(_I8.unpack_from(buf, o)[0]), o + 1
    if tag == 0x42:  # B
        return UInt8(_U8.unpack_from(buf, o)[0]), o + 1
    if tag == 0x73:  # s
        return Int16(_I16.unpack_from(buf, o)[0]), o + 2
    if tag == 0x75:  # u
        return UInt16(_U16.unpack_from(buf, o)[0]), o + 2
    if tag == 0x69:  # i
        return UInt32(_U32.unpack_from(buf, o)[0]), o + 4
    if tag == 0x4C:  # L
        return UInt64(_U64.unpack_from(buf, o)[0]), o + 8
    if tag == 0x66:  # f
        single = _F32.unpack_from(buf, o)[0]
        if math.isnan(single):  # NaN: widen by hand so a signalling NaN keeps its bits
            single = _widen_float32_nan(_U32.unpack_from(buf, o)[0])
        return Float32(single), o + 4
    if tag == 0x64:  # d
        return _F64.unpack_from(buf, o)[0], o + 8
    if tag == 0x44:  # D
        scale, unscaled = _DECIMAL.unpack_from(buf, o)
        # Built from text, so the exponent is exactly -scale whatever the decimal context.
        return Decimal(f"{unscaled}E-{scale}"), o + 5
    raise _FieldError(f"unknown type tag {bytes((tag,))!r} at offset {at}")


def _bad_name(buf: bytes, start: int, stop: int, end: int) -> _FieldError:
    """Return the error for a field name that leaves no room for its value in the table."""
    if stop > end:
        return _FieldError(
            f"field name of {stop - start} bytes at offset {start - 1} runs past the end of "
            "its table"
        )
    name = buf[start:stop].decode("utf-8", "surrogateescape")
    return _FieldError(f"no type tag after the field name at offset {start - 1}").within(name)


def _too_deep() -> _FieldError:
    """Return the error for nesting past :data:`MAX_DEPTH`."""
    return _FieldError(f"tables and arrays nest deeper than {MAX_DEPTH} levels")


def _truncated(buf: bytes, at: int) -> _FieldError:
    """Return the error for the value tagged at ``at`` running past the end of the data."""
    kind = _TAG_NAMES.get(buf[at], "value")
    return _FieldError(f"{kind} at offset {at} runs past the end of the data")


def _overrun(buf: bytes, at: int, excess: int) -> _FieldError:
    """Return the error for the value tagged at ``at`` running past its container's end."""
    kind = _TAG_NAMES.get(buf[at], "value")
    return _FieldError(f"{kind} at offset {at} runs {excess} bytes past the end of its container")


def _widen_float32_nan(bits: int) -> float:
    """Return the double NaN that narrows back to the float32 NaN ``bits``, payload and all.

    CPython's ``struct`` widens ``f`` through the C cast, which quiets a signalling NaN on
    x86 (``7f800001`` comes back as ``7fc00001``): the re-encoded table would differ.
    """
    double = ((bits & 0x8000_0000) << 32) | 0x7FF0_0000_0000_0000 | ((bits & 0x007F_FFFF) << 29)
    return float(_F64.unpack(_U64.pack(double))[0])


def _narrow_nan_to_float32(value: float) -> int:
    """Return the float32 bits of the NaN ``value``, keeping the top of its payload."""
    double: int = _U64.unpack(_F64.pack(value))[0]
    mantissa = (double >> 29) & 0x007F_FFFF
    # A payload only in the low 29 bits would narrow to infinity: make it the quiet NaN.
    return ((double >> 32) & 0x8000_0000) | 0x7F80_0000 | (mantissa or 0x0040_0000)


# ----------------------------------------------------------------------------- encoding


def encode_table(table: Mapping[str, FieldValue]) -> bytes:
    """Return the wire bytes of ``table``, 4-byte length prefix included, in its key order.

    Each value is written with the tag its class names (module docstring), so
    ``encode_table(decode_table(b)[0]) == b`` for every well-formed ``b``. Lossy only where
    the wire has no room: ``Decimal("-0.0")`` is written as 0, a ``Decimal`` with a positive
    exponent is written at scale 0 (``Decimal("1E+2")`` comes back as ``Decimal("100")``),
    a ``Float32`` is rounded to 32 bits, and plain ``bytes`` that happen to be valid UTF-8
    come back as ``str``.

    Also takes the plain values pamqp is handed (connection properties, queue arguments):
    ``int`` (``I`` if it fits 32 bits, else ``l``), ``bytearray`` (``x``),
    ``datetime.datetime`` (``T``, whole seconds, naive taken as UTC), any ``Mapping`` and any
    non-string ``Sequence``. Raises :class:`WireError` naming the field for a value out of
    its type's range, a field name over 255 bytes, a string over 4 GiB, a NaN or infinite
    ``Decimal``, nesting deeper than :data:`MAX_DEPTH`, or a type with no AMQP encoding.
    """
    try:
        return _encode_table(table, 0)
    except _FieldError as e:
        raise e.to_wire_error() from None
    except struct.error:
        raise WireError("field table: encodes to more than the 4 GiB a table allows") from None


def encode_table_for_pamqp(value: Mapping[str, object] | None) -> bytes:
    """Return the wire bytes of a table handed over by pamqp; ``None`` is the empty table.

    The shape of ``pamqp.encode.METHODS["table"]``, which the adapter replaces with this.
    pamqp passes ``None`` for absent queue arguments, and plain Python values everywhere.
    """
    if value is None:
        return b"\x00\x00\x00\x00"
    return encode_table(cast("Mapping[str, FieldValue]", value))


def tag_of(value: FieldValue) -> str:
    """Return the one-character wire tag :func:`encode_table` writes ``value`` with.

    Checks no range except a plain ``int``'s, whose tag depends on its size. Raises
    :class:`WireError` for a type with no AMQP encoding or a plain ``int`` beyond 64 bits.
    """
    base = _encodable_base(value)
    if base is int:
        number = cast("int", value)
        if -0x8000_0000 <= number <= 0x7FFF_FFFF:
            return "I"
        if -0x8000_0000_0000_0000 <= number <= 0x7FFF_FFFF_FFFF_FFFF:
            return "l"
        raise WireError(_range_problem(value))
    if base is None:
        raise WireError(_unsupported(value))
    return _TAGS[base]


def _encode_table(table: Mapping[Any, object], depth: int) -> bytes:
    """Return the length-prefixed bytes of ``table``, nested ``depth`` levels deep.

    Its names are Any, not str: they are checked here, and compiled code would take a
    ``str`` for granted.
    """
    out: list[bytes] = []
    names = _NAMES
    for name, value in table.items():
        raw_name = names.get(name) if type(name) is str else None
        if raw_name is None:
            raw_name = _encode_name(name)
            if type(name) is str and len(names) < _NAMES_MAX:
                names[name] = raw_name
        out.append(raw_name)
        try:
            _encode_value(value, out, depth)
        except _FieldError as e:
            raise e.within(name) from None
        except UnicodeEncodeError as bad:  # not "e" again: compiled, one name has one type
            raise _FieldError(f"string is not encodable as UTF-8: {bad.reason}").within(
                name
            ) from None
        except (struct.error, OverflowError):
            raise _FieldError(_range_problem(value)).within(name) from None
    body = b"".join(out)
    return _U32.pack(len(body)) + body


# The length-prefixed bytes of the field names met so far: a relay writes the same few
# dozen names in every message. Bounded, so a stream of made-up names cannot grow it.
_NAMES: Final[dict[str, bytes]] = {}
_NAMES_MAX: Final = 4096


def _encode_name(name: object) -> bytes:
    """Return the length-prefixed bytes of a field name, or raise why it cannot be one."""
    if not isinstance(name, str):
        raise _FieldError(f"field name {name!r} is of type {type(name).__name__}, not str")
    try:
        raw_name = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise _FieldError(f"field name is not encodable as UTF-8: {e.reason}").within(
            name
        ) from None
    if len(raw_name) > 255:
        # pamqp truncates silently; a changed name is a lost header, so refuse instead.
        raise _FieldError(f"field name is {len(raw_name)} bytes long; AMQP allows 255").within(name)
    return _U8.pack(len(raw_name)) + raw_name


def _encode_array(items: Sequence[object], depth: int) -> bytes:
    """Return the length-prefixed bytes of the array ``items``, nested ``depth`` levels deep."""
    out: list[bytes] = []
    for index, value in enumerate(items):
        try:
            _encode_value(value, out, depth)
        except _FieldError as e:
            raise e.within(index) from None
        except UnicodeEncodeError as bad:  # not "e" again: compiled, one name has one type
            raise _FieldError(f"string is not encodable as UTF-8: {bad.reason}").within(
                index
            ) from None
        except (struct.error, OverflowError):
            raise _FieldError(_range_problem(value)).within(index) from None
    body = b"".join(out)
    return _U32.pack(len(body)) + body


def _encode_value(value: object, out: list[bytes], depth: int) -> None:
    """Append the tag and bytes of ``value``, which sits ``depth`` levels below the top table.

    Ranges are checked by ``struct`` itself (``struct.error``, ``OverflowError``); the
    caller turns those into a message, so the happy path does no comparisons of its own.
    """
    cls = type(value)
    encoder = _SCALAR_ENCODERS.get(cls)
    if encoder is not None:
        encoder(value, out)
        return
    base = cls if cls is dict or cls is list else _encodable_base(value)
    if base is dict:
        if depth == MAX_DEPTH:
            raise _too_deep()
        out.append(b"F")
        out.append(_encode_table(cast("Mapping[str, object]", value), depth + 1))
    elif base is list:
        if depth == MAX_DEPTH:
            raise _too_deep()
        out.append(b"A")
        out.append(_encode_array(cast("Sequence[object]", value), depth + 1))
    elif base is None:
        raise _FieldError(_unsupported(value))
    else:
        _SCALAR_ENCODERS[base](value, out)


def _encodable_base(value: object) -> type | None:
    """Return the class in :data:`_TAGS` that ``value`` is encoded as, or None if none is.

    The exact class first, then the nearest base (an ``IntEnum`` is a plain ``int``, a
    ``StrEnum`` a ``str``), then any ``Mapping`` as a table and ``Sequence`` as an array.
    """
    for base in type(value).__mro__:
        if base in _TAGS:
            return base
    if isinstance(value, Mapping):
        return dict
    if isinstance(value, Sequence) and not isinstance(value, memoryview):
        return list
    return None


def _unsupported(value: object) -> str:
    """Return the message for a value of a type with no AMQP encoding."""
    return (
        f"{type(value).__name__} has no AMQP field type; use str, bytes, bool, int, float, "
        "Decimal, None, a dict, a list or one of the classes of sidecar.wire"
    )


def _range_problem(value: object) -> str:
    """Return what is wrong with ``value``, which ``struct`` refused to pack."""
    base = _encodable_base(value)  # before isinstance: compiled, a narrowed int loses its class
    if isinstance(value, int):
        bounds = INT_BOUNDS.get(base) if base is not None else None
        if bounds is not None and base is not None:
            low, high = bounds
            return f"{base.__name__} {int(value)} is outside {low}..{high}"
        return (
            f"integer {int(value)} is outside the signed 64-bit range; "
            "wrap it in UInt64 if it is unsigned"
        )
    if isinstance(value, float):
        return f"Float32 {float(value)!r} is outside the 32-bit float range; use a plain float"
    if isinstance(value, dt.datetime):
        return f"datetime {value.isoformat()} is before 1970 or too far ahead for a timestamp"
    if isinstance(value, (str, bytes, bytearray)):
        return "long string or byte array is longer than the 4 GiB (2**32 - 1 bytes) allowed"
    return f"{type(value).__name__} encodes to more than the 4 GiB (2**32 - 1 bytes) allowed"


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


def _encode_decimal(value: Decimal, out: list[bytes]) -> None:
    """Append ``value`` as scale octet and signed 32-bit unscaled value (``D``).

    Worked from ``as_tuple()``, never through arithmetic, so the ambient decimal context
    (precision, traps) cannot round or raise.
    """
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise _FieldError(f"Decimal {value} has no AMQP encoding; only finite decimals do")
    if exponent >= 0:
        # AMQP has no negative scale: write the integer it denotes at scale 0.
        scale = 0
        if digits != (0,) and len(digits) + exponent > 10:
            raise _decimal_range(value)
        unscaled = int(value)
    else:
        scale = -exponent
        if scale > 255:
            raise _FieldError(f"Decimal {value} has scale {scale}; AMQP allows 0..255")
        if len(digits) > 10:
            raise _decimal_range(value)
        unscaled = int(Decimal((sign, digits, 0)))
    try:
        out.append(_TAG_DECIMAL.pack(b"D", scale, unscaled))
    except struct.error:
        raise _decimal_range(value) from None


def _decimal_range(value: Decimal) -> _FieldError:
    """Return the error for a decimal whose unscaled value needs more than 32 bits."""
    return _FieldError(
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
# here because they need the depth; _encode_value handles them.
_SCALAR_ENCODERS: Final[dict[type, Callable[[Any, list[bytes]], None]]] = {
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

_TAGS: Final[dict[type, str]] = {
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
