"""The typed AMQP field values: integers, floats and bytes that remember their wire tag.

:mod:`sidecar.wire` owns what they mean (its face maps each to its tag) and
re-exports them: import them from there. They live here, in a module that is never
compiled, because mypyc (the optional compiled build, scripts/compile) cannot compile
subclasses of ``int``, ``float`` and ``bytes``. Pure: classes only.
"""

from __future__ import annotations

__all__ = [
    "ByteArray",
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
]


class Int8(int):
    """Signed 8-bit integer (tag ``b``)."""

    __slots__ = ()


class UInt8(int):
    """Unsigned 8-bit integer (tag ``B``)."""

    __slots__ = ()


class Int16(int):
    """Signed 16-bit integer (tag ``s``)."""

    __slots__ = ()


class UInt16(int):
    """Unsigned 16-bit integer (tag ``u``)."""

    __slots__ = ()


class Int32(int):
    """Signed 32-bit integer (tag ``I``)."""

    __slots__ = ()


class UInt32(int):
    """Unsigned 32-bit integer (tag ``i``)."""

    __slots__ = ()


class Int64(int):
    """Signed 64-bit integer (tag ``l``)."""

    __slots__ = ()


class UInt64(int):
    """Unsigned 64-bit integer (tag ``L``, outside RabbitMQ's errata but seen in the wild)."""

    __slots__ = ()


class Timestamp(int):
    """AMQP timestamp: whole seconds since the epoch (tag ``T``)."""

    __slots__ = ()


class Float32(float):
    """32-bit IEEE float (tag ``f``); a plain ``float`` is a 64-bit double."""

    __slots__ = ()


class ByteArray(bytes):
    """Byte array (tag ``x``); plain ``bytes`` is a long string that is not UTF-8."""

    __slots__ = ()
