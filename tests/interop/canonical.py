"""The line every interop client prints, and what each client is expected to print.

Every program in tests/interop/clients gets one message from each queue named on its
command line and prints one JSON line per queue (keys sorted, no spaces):

    {"queue": Q, "ok": true, "body": TEXT, "properties": {NAME: VALUE}, "headers": {NAME: PAIR}}
    {"queue": Q, "ok": false, "error": "what the client raised"}

A PAIR is ``[KIND, VALUE]``. KIND is the type the client handed over, in one vocabulary:
``int8 uint8 int16 int32 int64`` where the client keeps the width (Java, Go), ``int`` where
it does not (Ruby, Python); likewise ``float32 float64`` or ``float``; and ``decimal``
(VALUE a string Python's ``Decimal`` reads), ``string`` (a long string), ``bytes`` (a byte
array type), ``bool``, ``time`` (whole seconds since the epoch), ``table``, ``array``,
``void``. Bytes are a JSON string when they are valid UTF-8, else ``{"hex": "..."}``; a
NaN or infinite float is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``. A
property is printed when present and neither ``""`` nor 0 (amqp091-go cannot tell those
from absent); ``timestamp`` is whole seconds.

The rest of this module is the model of each client's decoder: given a value as the
project's codec decoded it (its class names its wire tag, sidecar.wire), the PAIR that
client prints, the tags it cannot decode at all, and the places where it decodes a value
differently from what was sent (``DEVIATIONS``). docs/interop.md shows the same tables.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sidecar.wire import FieldValue, Int32, Int64, encode_table, tag_of

CLIENTS: Final = ("java", "go", "ruby", "pamqp", "pika")

_COMMON_KINDS: Final = {
    "t": "bool",
    "D": "decimal",
    "S": "string",
    "x": "bytes",
    "T": "time",
    "V": "void",
    "F": "table",
    "A": "array",
}
_TYPED_KINDS: Final = {
    "b": "int8",
    "s": "int16",
    "I": "int32",
    "l": "int64",
    "f": "float32",
    "d": "float64",
}
_UNTYPED_KINDS: Final = dict.fromkeys("bBsuIilL", "int") | {"f": "float", "d": "float"}

KINDS: Final[Mapping[str, Mapping[str, str]]] = {
    "exact": _COMMON_KINDS | _TYPED_KINDS | {"B": "uint8", "u": "int", "i": "int", "L": "int"},
    "java": _COMMON_KINDS | _TYPED_KINDS,
    "go": _COMMON_KINDS | _TYPED_KINDS | {"B": "uint8"},
    "ruby": _COMMON_KINDS | _UNTYPED_KINDS,
    "pamqp": _COMMON_KINDS | _UNTYPED_KINDS,
    "pika": _COMMON_KINDS | _UNTYPED_KINDS,
}
"""Wire tag -> the KIND a client reports for it (before any deviation).

``exact`` is no client: it is the wire itself, what the sender wrote, for comparisons.
"""

UNDECODABLE: Final[Mapping[str, frozenset[str]]] = {
    "exact": frozenset(),
    "java": frozenset("Bui"),
    "go": frozenset("ui"),
    "ruby": frozenset("Bui"),
    "pamqp": frozenset(),
    "pika": frozenset(),
}
"""Unsigned tags a client has no decoder for: it fails on the whole message.

The tags here are the three section 7 of docs/contract.md widens; ``L`` is left out because no
AceMQ library writes it. ``KINDS`` has no entry for a tag listed here.
"""


@dataclass(frozen=True, slots=True)
class Deviation:
    """A place where a client decodes a value other than the one on the wire."""

    key: str
    client: str
    tag: str
    effect: str  # "value": another value; "lost": the value is gone; "type": same bytes, other type
    what: str
    evidence: str


DEVIATIONS: Final = (
    Deviation(
        "ruby-int8-unsigned",
        "ruby",
        "b",
        "value",
        "a signed 8-bit integer is read as unsigned: -5 arrives as 251",
        "amq-protocol table_value_decoder.rb decode_byte unpacks with 'C' (unsigned char)",
    ),
    Deviation(
        "ruby-int32-unsigned",
        "ruby",
        "I",
        "value",
        "a signed 32-bit integer is read as unsigned: -7 arrives as 4294967289",
        "decode_integer unpacks with 'N' (unsigned 32-bit, network order)",
    ),
    Deviation(
        "ruby-float32-byte-swapped",
        "ruby",
        "f",
        "value",
        "a 32-bit float is read in the machine's byte order: 1.5 arrives as 6.9e-41",
        "decode_32bit_float unpacks with 'f' (native order) instead of 'g' (big-endian)",
    ),
    Deviation(
        "ruby-decimal-unsigned",
        "ruby",
        "D",
        "value",
        "a negative decimal's unscaled value is read as unsigned: -3.14 arrives as 42949669.82",
        "decode_big_decimal unpacks the value with 'N' (unsigned 32-bit)",
    ),
    Deviation(
        "ruby-short-trailing-field-dropped",
        "ruby",
        "F/A",
        "lost",
        "the fields of a table or array that start in its last 3 bytes are dropped: "
        "[7, true] arrives as [7], [true] as [], a nested {'k': 1, 'z': void} as {'k': 1}",
        "Table.decode loops while offset <= length and decode_array while offset <= "
        "start + length, both counting from before the 4-byte length prefix",
    ),
    Deviation(
        "ruby-byte-array-as-string",
        "ruby",
        "x",
        "type",
        "a byte array arrives as a String, like a long string (Ruby has one String type)",
        "Table.decode handles TYPE_BYTE_ARRAY with decode_string",
    ),
    Deviation(
        "pika-float-truncated",
        "pika",
        "f/d",
        "value",
        "32- and 64-bit floats are truncated to integers: 1.5 arrives as 1, 0.1 as 0",
        "pika/data.py decode_value wraps struct.unpack_from('>f'/'>d') in long(), an int class",
    ),
    Deviation(
        "pika-invalid-utf8-string-as-bytes",
        "pika",
        "S",
        "type",
        "a long string that is not UTF-8 arrives as bytes, like a byte array",
        "decode_value returns the undecoded bytes when .decode('utf8') fails",
    ),
    Deviation(
        "pamqp-timestamp-after-2106-as-milliseconds",
        "pamqp",
        "T",
        "value",
        "a timestamp above 2^32 - 1 seconds is divided by 1000: 5000000000 (year 2128) "
        "arrives as 5000000 (1970-02-27)",
        "pamqp/decode.py timestamp: 'Anything above the year 2106 is likely milliseconds'",
    ),
    Deviation(
        "go-no-cluster-id",
        "go",
        "cluster_id",
        "lost",
        "the cluster_id property is not exposed: amqp091-go's Delivery has no field for it",
        "read.go reads it into Properties.reserved1, which newDelivery does not copy",
    ),
)
"""Every deviation the suite checks; each must show in the clients' real output."""

DEVIATION_KEYS: Final = frozenset(d.key for d in DEVIATIONS)


class UndecodableError(Exception):
    """The client has no decoder for a tag in the message: it fails on the whole message."""

    def __init__(self, tag: str) -> None:
        super().__init__(f"tag {tag!r}")
        self.tag = tag


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Model:
    """What one client prints for a decoded message, with some deviations switched off.

    ``without`` names deviations to leave out: a model without a real deviation must
    disagree with the client somewhere, which is how the suite shows the row is observed.
    """

    client: str
    without: frozenset[str] = frozenset()

    def on(self, key: str) -> bool:
        """Whether the deviation ``key`` applies (it is this client's and not switched off)."""
        assert key in DEVIATION_KEYS, key
        return key.startswith(f"{self.client}-") and key not in self.without

    def headers(self, table: Mapping[str, FieldValue]) -> dict[str, Any]:
        """The ``headers`` object of the line; raises UndecodableError."""
        return self._table(table)

    def properties(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The ``properties`` object of the line, from property name -> decoded value."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            if value is None or (name != "timestamp" and value in ("", 0)):
                continue
            if name == "cluster_id" and self.on("go-no-cluster-id"):
                continue
            out[name] = _seconds(value) if name == "timestamp" else _text_of(value)
        return out

    def value(self, value: FieldValue) -> list[Any]:
        """The PAIR for one decoded value."""
        tag = tag_of(value)
        if tag in UNDECODABLE[self.client]:
            raise UndecodableError(tag)
        kind = KINDS[self.client][tag]
        if tag == "x" and self.on("ruby-byte-array-as-string"):
            kind = "string"
        if tag == "S" and isinstance(value, bytes) and self.on("pika-invalid-utf8-string-as-bytes"):
            kind = "bytes"
        if tag in "fd" and self.on("pika-float-truncated"):
            kind = "int"
        return [kind, self._scalar(tag, value)]

    def _scalar(self, tag: str, value: FieldValue) -> Any:
        if isinstance(value, dict):
            return self._table(value)
        if isinstance(value, list):
            return [self.value(item) for item in self._kept(value, _array_sizes(value))]
        result: Any
        if tag in "bBsuIilL":
            result = self._integer(tag, int(value))  # type: ignore[arg-type]
        elif tag in "fd":
            result = self._float(tag, float(value))  # type: ignore[arg-type]
        elif tag == "D":
            result = self._decimal(value)  # type: ignore[arg-type]
        elif tag == "T":
            result = self._timestamp(int(value))  # type: ignore[arg-type]
        elif tag in "Sx":
            result = _text_of(value)
        else:  # t, V
            result = value
        return result

    def _integer(self, tag: str, number: int) -> int:
        if tag == "b" and self.on("ruby-int8-unsigned"):
            return number & 0xFF
        if tag == "I" and self.on("ruby-int32-unsigned"):
            return number & 0xFFFF_FFFF
        return number

    def _float(self, tag: str, number: float) -> Any:
        if tag == "f":  # the wire holds 32 bits, whatever the sender's float was
            number = _float32(number)
        if self.on("pika-float-truncated"):
            return int(number)
        if tag == "f" and self.on("ruby-float32-byte-swapped"):
            number = struct.unpack("<f", struct.pack(">f", number))[0]
        return _json_float(number)

    def _decimal(self, value: Decimal) -> str:
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if self.on("ruby-decimal-unsigned"):
            unscaled &= 0xFFFF_FFFF
        return f"{unscaled}E{exponent}"

    def _timestamp(self, seconds: int) -> int:
        if seconds > 0xFFFF_FFFF and self.on("pamqp-timestamp-after-2106-as-milliseconds"):
            return math.floor(seconds / 1000.0)
        return seconds

    def _table(self, table: Mapping[str, FieldValue]) -> dict[str, Any]:
        kept = self._kept(list(table), _table_sizes(table))
        return {name: self.value(table[name]) for name in kept}

    def _kept(self, items: list[Any], sizes: list[int]) -> list[Any]:
        """The items of a table or array the client keeps (all, but for Ruby's short tail)."""
        if not self.on("ruby-short-trailing-field-dropped"):
            return items
        kept, start, length = [], 0, sum(sizes)
        for item, size in zip(items, sizes, strict=True):
            if start > length - 4:
                break
            kept.append(item)
            start += size
        return kept


def _table_sizes(table: Mapping[str, FieldValue]) -> list[int]:
    """The encoded size of each field of a table: name length octet, name, tag, value."""
    return [len(encode_table({name: value})) - 4 for name, value in table.items()]


def _array_sizes(array: list[FieldValue]) -> list[int]:
    """The encoded size of each element of an array: tag and value."""
    return [len(encode_table({"": item})) - 4 - 1 for item in array]


def _text_of(value: object) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": value.hex()}
    return value


def _float32(number: float) -> float:
    return float(struct.unpack(">f", struct.pack(">f", number))[0])


def _json_float(number: float) -> float | str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def _seconds(value: object) -> int:
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return math.floor(moment.timestamp())
    assert isinstance(value, int), value
    return int(value)


# --- comparing ------------------------------------------------------------------------------


def strict(pair: list[Any]) -> Any:
    """A PAIR in a form ``==`` compares exactly: floats by bits, decimals by value."""
    kind, value = pair
    if kind == "table":
        return ("table", tuple(sorted((k, strict(v)) for k, v in value.items())))
    if kind == "array":
        return ("array", tuple(strict(item) for item in value))
    if kind.startswith("float") and isinstance(value, int | float):
        return (kind, float(value).hex())  # Go prints 1.0 as 1
    if kind == "decimal":
        return (kind, Decimal(value))
    if isinstance(value, dict):
        return (kind, tuple(sorted(value.items())))
    return (kind, value)


def meaning(pair: list[Any]) -> Any:  # noqa: PLR0911 - one case per kind of value
    """What a PAIR says, whatever type carried it: the value the sender meant, if all went well.

    Integers of every width are one kind, floats another, and a long string and a byte
    array are both their bytes.
    """
    kind, value = pair
    if kind == "table":
        return ("table", tuple(sorted((k, meaning(v)) for k, v in value.items())))
    if kind == "array":
        return ("array", tuple(meaning(item) for item in value))
    if kind in {"int8", "uint8", "int16", "int32", "int64", "int"}:
        return ("int", value)
    if kind in {"float32", "float64", "float"}:
        return ("float", float(value).hex() if isinstance(value, int | float) else value)
    if kind == "decimal":
        return ("decimal", Decimal(value))
    if kind in {"string", "bytes"}:
        raw = bytes.fromhex(value["hex"]) if isinstance(value, dict) else value.encode()
        return ("bytes", raw)
    return (kind, value)


def sent_meaning(value: FieldValue) -> Any:
    """The meaning (as :func:`meaning` gives it) of a value as the sender wrote it."""
    return meaning(Model("exact").value(value))


def walk(table: Mapping[str, FieldValue]) -> Iterator[str]:
    """Every wire tag in a table, at any depth."""
    for value in table.values():
        yield from _walk_value(value)


def _walk_value(value: FieldValue) -> Iterator[str]:
    yield tag_of(value)
    if isinstance(value, dict):
        yield from walk(value)
    elif isinstance(value, list):
        for item in value:
            yield from _walk_value(item)


def typed(value: FieldValue) -> Any:
    """A value with its wire tag at every level, for comparing typed tables exactly."""
    tag = tag_of(value)
    if isinstance(value, dict):
        return (tag, tuple((k, typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return (tag, tuple(typed(item) for item in value))
    if isinstance(value, float):
        return (tag, (_float32(value) if tag == "f" else value).hex())
    if isinstance(value, Decimal):
        return (tag, str(value))  # the scale is on the wire: 1.50 is not 1.5
    if isinstance(value, int):
        return (tag, int(value))
    return (tag, value)


WIDENED: Final = {"B": Int32, "u": Int32, "i": Int64}
"""docs/contract.md section 7: the signed type each unsigned tag is widened to."""


def widen(value: FieldValue) -> FieldValue:
    """A value with section 7 applied: every B, u, i at any depth made signed, same value."""
    if isinstance(value, dict):
        return {k: widen(v) for k, v in value.items()}
    if isinstance(value, list):
        return [widen(item) for item in value]
    wider = WIDENED.get(tag_of(value))
    return value if wider is None else wider(int(value))  # type: ignore[arg-type]
