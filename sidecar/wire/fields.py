"""What the table decoder and encoder share: the value types, bounds, depth and error.

This module owns the type aliases of a field value, the range of every integer class,
the nesting bound, the struct formats both directions use, the float32 NaN bits and the
error that collects a field's path on its way out. It must not decode or encode a table
itself, and holds no state.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping  # noqa: TC003 - INT_BOUNDS's annotation, read by mypyc
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

from sidecar.errors import WireError
from sidecar.wire.values import (
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
    from decimal import Decimal

__all__ = [
    "F64",
    "INT_BOUNDS",
    "MAX_DEPTH",
    "U8",
    "U32",
    "U64",
    "FieldArray",
    "FieldError",
    "FieldTable",
    "FieldValue",
    "PropertyValue",
    "read_i32",
    "read_u32",
    "too_deep",
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

PropertyValue: TypeAlias = str | int
"""The value of a message property, snake_case named, the timestamp in seconds."""

# Compiled once: decoding and encoding run for every relayed message.
U8: Final = struct.Struct(">B")
U32: Final = struct.Struct(">I")
U64: Final = struct.Struct(">Q")
F64: Final = struct.Struct(">d")


def read_u32(buf: bytes, at: int) -> int:
    """Return the big-endian unsigned 32-bit integer at ``at``; IndexError past the end.

    What ``U32.unpack_from(buf, at)[0]`` returns, read a byte at a time: compiled, the reads
    and shifts stay native, where ``struct`` builds a tuple and an int object per call.
    """
    return buf[at] << 24 | buf[at + 1] << 16 | buf[at + 2] << 8 | buf[at + 3]


def read_i32(buf: bytes, at: int) -> int:
    """Return the big-endian signed (two's complement) 32-bit integer at ``at``, as read_u32."""
    word = read_u32(buf, at)
    return word - ((word & 0x8000_0000) << 1)


class FieldError(Exception):
    """A problem found inside a table; each enclosing container adds its name on the way out.

    Private: the public functions turn it into :class:`WireError` with the whole path, so the
    happy path never builds a path string.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []  # innermost first: names of tables, indexes of arrays

    def within(self, part: str | int) -> FieldError:
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


def too_deep() -> FieldError:
    """Return the error for nesting past :data:`MAX_DEPTH`."""
    return FieldError(f"tables and arrays nest deeper than {MAX_DEPTH} levels")
