"""Hypothesis strategies for AMQP field tables, typed as :mod:`sidecar.wire` reads them.

Import these for any property test that needs headers: every value generated here survives
``decode_table(encode_table(...))`` with its class and value intact, which
:func:`same_typed` checks. :func:`field_table_bytes` generates the wire side instead:
well-formed tables as raw bytes, including bit patterns no Python value would produce
(signalling NaNs, any field-name bytes).
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal

from hypothesis import strategies as st

from sidecar.wire import (
    ByteArray,
    FieldTable,
    FieldValue,
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
    "field_names",
    "field_table_bytes",
    "field_tables",
    "field_values",
    "same_typed",
    "scalar_values",
]

_INT_CLASSES: tuple[tuple[type[int], int, int], ...] = (
    (Int8, -(2**7), 2**7 - 1),
    (UInt8, 0, 2**8 - 1),
    (Int16, -(2**15), 2**15 - 1),
    (UInt16, 0, 2**16 - 1),
    (Int32, -(2**31), 2**31 - 1),
    (UInt32, 0, 2**32 - 1),
    (Int64, -(2**63), 2**63 - 1),
    (UInt64, 0, 2**64 - 1),
    (Timestamp, 0, 2**64 - 1),
)

# Each is invalid UTF-8 wherever it sits: a byte never used, an overlong form, an encoded
# surrogate, a lone continuation byte.
_NOT_UTF8 = (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x80", b"\xfe")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _decimal(unscaled: int, scale: int) -> Decimal:
    """Build the decimal ``unscaled * 10**-scale`` keeping the exponent, without a context."""
    digits = tuple(int(c) for c in str(abs(unscaled)))
    return Decimal((int(unscaled < 0), digits, -scale))


def field_names(*, max_bytes: int = 255) -> st.SearchStrategy[str]:
    """Generate field names of at most ``max_bytes`` bytes, some of them not UTF-8.

    Names that are not UTF-8 come as ``sidecar.wire`` decodes them: the invalid bytes as
    lone surrogates (``surrogateescape``), which encode back to the same bytes.
    """
    text = st.text(max_size=max_bytes // 4)
    raw = st.binary(max_size=max_bytes).map(lambda b: b.decode("utf-8", "surrogateescape"))
    return st.one_of(text, raw)


def scalar_values() -> st.SearchStrategy[FieldValue]:
    """Generate one value of each non-container wire type, at its extremes and between.

    ``bytes`` are never valid UTF-8 (valid UTF-8 decodes as ``str``); a ``Decimal`` always
    has a scale of 0..255 and an unscaled value that fits 32 bits; a ``Float32`` is always
    exactly representable in 32 bits. So each value decodes back to itself.
    """
    not_utf8 = st.builds(
        lambda head, bad, tail: head + bad + tail,
        st.binary(max_size=16),
        st.sampled_from(_NOT_UTF8),
        st.binary(max_size=16),
    ).filter(lambda raw: not _is_utf8(raw))
    ints = [st.integers(low, high).map(cls) for cls, low, high in _INT_CLASSES]
    return st.one_of(
        st.text(),
        not_utf8,
        st.binary(max_size=32).map(ByteArray),
        st.booleans(),
        *ints,
        st.floats(width=32).map(Float32),
        st.floats(),
        st.builds(_decimal, st.integers(-(2**31), 2**31 - 1), st.integers(0, 255)),
        st.none(),
    )


def field_values(*, max_depth: int = 3, max_size: int = 4) -> st.SearchStrategy[FieldValue]:
    """Generate field values of every wire type, nesting tables and arrays.

    ``max_depth`` is how many tables and arrays may nest (0 gives scalars only);
    ``max_size`` bounds the entries of each table and array.
    """
    if max_depth <= 0:
        return scalar_values()
    inner = field_values(max_depth=max_depth - 1, max_size=max_size)
    return st.one_of(
        scalar_values(),
        st.dictionaries(field_names(), inner, max_size=max_size),
        st.lists(inner, max_size=max_size),
    )


def field_tables(*, max_depth: int = 3, max_size: int = 6) -> st.SearchStrategy[FieldTable]:
    """Generate a field table (a message's headers) whose values nest up to ``max_depth``."""
    inner = field_values(max_depth=max_depth, max_size=max_size)
    return st.dictionaries(field_names(), inner, max_size=max_size)


def same_typed(a: object, b: object) -> bool:  # noqa: PLR0911 - a case per kind of value
    """Return whether ``a`` and ``b`` are equal with the same class at every level.

    Stricter than ``==`` where the wire is: ``Int8(1)`` is not ``Int32(1)``, ``True`` is not
    ``1``, ``Decimal("1.50")`` is not ``Decimal("1.5")``, ``0.0`` is not ``-0.0``, and table
    keys must come in the same order. A NaN equals a NaN of the same class.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_typed(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_typed, a, b))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a.as_tuple() == b.as_tuple()
    return a == b


# ------------------------------------------------------------------------ the wire side

_LONG = struct.Struct(">I")
_FIXED_WIDTHS = {
    b"b": 1,
    b"B": 1,
    b"s": 2,
    b"u": 2,
    b"I": 4,
    b"i": 4,
    b"f": 4,
    b"l": 8,
    b"L": 8,
    b"T": 8,
    b"d": 8,
    b"D": 5,
}


def _length_prefixed(body: bytes) -> bytes:
    return _LONG.pack(len(body)) + body


def _tagged(tag: bytes, width: int) -> st.SearchStrategy[bytes]:
    """Generate ``tag`` followed by ``width`` bytes of any bits."""
    return st.binary(min_size=width, max_size=width).map(lambda payload: tag + payload)


def _scalar_value_bytes() -> st.SearchStrategy[bytes]:
    """Generate one tagged scalar: any payload bits for the fixed widths, any string bytes."""
    fixed = [_tagged(tag, width) for tag, width in _FIXED_WIDTHS.items()]
    return st.one_of(
        st.binary(max_size=32).map(lambda raw: b"S" + _length_prefixed(raw)),
        st.text(max_size=16).map(lambda text: b"S" + _length_prefixed(text.encode())),
        st.binary(max_size=32).map(lambda raw: b"x" + _length_prefixed(raw)),
        st.sampled_from([b"t\x00", b"t\x01", b"V"]),
        *fixed,
    )


def _value_bytes(max_depth: int, max_size: int) -> st.SearchStrategy[bytes]:
    """Generate one tagged value, nesting tables and arrays up to ``max_depth``."""
    if max_depth <= 0:
        return _scalar_value_bytes()
    inner = _value_bytes(max_depth - 1, max_size)
    return st.one_of(
        _scalar_value_bytes(),
        _table_bytes(inner, max_size).map(lambda table: b"F" + table),
        st.lists(inner, max_size=max_size).map(
            lambda items: b"A" + _length_prefixed(b"".join(items))
        ),
    )


def _table_bytes(values: st.SearchStrategy[bytes], max_size: int) -> st.SearchStrategy[bytes]:
    """Generate a length-prefixed table with distinct names of any bytes."""
    names = st.lists(st.binary(max_size=255), unique=True, max_size=max_size)
    return names.flatmap(
        lambda keys: st.lists(values, min_size=len(keys), max_size=len(keys)).map(
            lambda encoded: _length_prefixed(
                b"".join(
                    bytes((len(key),)) + key + value
                    for key, value in zip(keys, encoded, strict=True)
                )
            )
        )
    )


def field_table_bytes(*, max_depth: int = 3, max_size: int = 4) -> st.SearchStrategy[bytes]:
    """Generate well-formed, canonical field tables as wire bytes.

    Canonical means what :func:`sidecar.wire.encode_table` writes: booleans are 0 or 1,
    void is ``V`` (never the zero byte), and names are distinct; within that, any bits,
    so every such table must re-encode to exactly the same bytes.
    """
    return _table_bytes(_value_bytes(max_depth, max_size), max_size)
