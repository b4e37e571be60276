"""The field-table encoder: values in, AMQP 0-9-1 table bytes out, each with its own tag.

This module owns the writing of a table and its nesting: field names (at most 255 bytes,
never truncated), arrays, the dispatch on a value's class (:mod:`sidecar.wire.scalars`
writes each single value) and the message for a value that cannot be written. It must
raise nothing but :class:`WireError` for a value that has no encoding. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from sidecar.errors import WireError
from sidecar.wire.fields import INT_BOUNDS, MAX_DEPTH, U8, U32, FieldError, FieldValue, too_deep
from sidecar.wire.scalars import SCALAR_ENCODERS, TAGS

__all__ = ["encode_table", "encode_table_for_pamqp", "tag_of"]


def encode_table(table: Mapping[str, FieldValue]) -> bytes:
    """Return the wire bytes of ``table``, 4-byte length prefix included, in its key order.

    Each value is written with the tag its class names (:mod:`sidecar.wire`), so
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
    except FieldError as e:
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
    return TAGS[base]


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
        except FieldError as e:
            raise e.within(name) from None
        except UnicodeEncodeError as bad:  # not "e" again: compiled, one name has one type
            raise FieldError(f"string is not encodable as UTF-8: {bad.reason}").within(
                name
            ) from None
        except (struct.error, OverflowError):
            raise FieldError(_range_problem(value)).within(name) from None
    body = b"".join(out)
    return U32.pack(len(body)) + body


# The length-prefixed bytes of the field names met so far: a relay writes the same few
# dozen names in every message. Bounded, so a stream of made-up names cannot grow it.
_NAMES: Final[dict[str, bytes]] = {}
_NAMES_MAX: Final = 4096


def _encode_name(name: object) -> bytes:
    """Return the length-prefixed bytes of a field name, or raise why it cannot be one."""
    if not isinstance(name, str):
        raise FieldError(f"field name {name!r} is of type {type(name).__name__}, not str")
    try:
        raw_name = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise FieldError(f"field name is not encodable as UTF-8: {e.reason}").within(name) from None
    if len(raw_name) > 255:
        # pamqp truncates silently; a changed name is a lost header, so refuse instead.
        raise FieldError(f"field name is {len(raw_name)} bytes long; AMQP allows 255").within(name)
    return U8.pack(len(raw_name)) + raw_name


def _encode_array(items: Sequence[object], depth: int) -> bytes:
    """Return the length-prefixed bytes of the array ``items``, nested ``depth`` levels deep."""
    out: list[bytes] = []
    for index, value in enumerate(items):
        try:
            _encode_value(value, out, depth)
        except FieldError as e:
            raise e.within(index) from None
        except UnicodeEncodeError as bad:  # not "e" again: compiled, one name has one type
            raise FieldError(f"string is not encodable as UTF-8: {bad.reason}").within(
                index
            ) from None
        except (struct.error, OverflowError):
            raise FieldError(_range_problem(value)).within(index) from None
    body = b"".join(out)
    return U32.pack(len(body)) + body


def _encode_value(value: object, out: list[bytes], depth: int) -> None:
    """Append the tag and bytes of ``value``, which sits ``depth`` levels below the top table.

    Ranges are checked by ``struct`` itself (``struct.error``, ``OverflowError``); the
    caller turns those into a message, so the happy path does no comparisons of its own.
    """
    cls = type(value)
    encoder = SCALAR_ENCODERS.get(cls)
    if encoder is not None:
        encoder(value, out)
        return
    base = cls if cls is dict or cls is list else _encodable_base(value)
    if base is dict:
        if depth == MAX_DEPTH:
            raise too_deep()
        out.append(b"F")
        out.append(_encode_table(cast("Mapping[str, object]", value), depth + 1))
    elif base is list:
        if depth == MAX_DEPTH:
            raise too_deep()
        out.append(b"A")
        out.append(_encode_array(cast("Sequence[object]", value), depth + 1))
    elif base is None:
        raise FieldError(_unsupported(value))
    else:
        SCALAR_ENCODERS[base](value, out)


def _encodable_base(value: object) -> type | None:
    """Return the class in :data:`TAGS` that ``value`` is encoded as, or None if none is.

    The exact class first, then the nearest base (an ``IntEnum`` is a plain ``int``, a
    ``StrEnum`` a ``str``), then any ``Mapping`` as a table and ``Sequence`` as an array.
    """
    for base in type(value).__mro__:
        if base in TAGS:
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
