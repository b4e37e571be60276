"""The field-table codec: errata byte vectors, typed round trips, and hostile input."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import enum
import math
import struct
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING

import pamqp.commands
import pamqp.decode
import pamqp.encode
import pamqp.frame
import pamqp.header
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.errors import WireError
from sidecar.wire import (
    MAX_DEPTH,
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
    decode_table,
    decode_table_for_pamqp,
    encode_table,
    encode_table_for_pamqp,
    tag_of,
)
from tests.unit.strategies import field_table_bytes, field_tables, field_values, same_typed

if TYPE_CHECKING:
    from sidecar.wire import FieldTable, FieldValue


def _long(n: int) -> bytes:
    return struct.pack(">I", n)


def _table(*entries: tuple[bytes, bytes]) -> bytes:
    """Return the wire bytes of a table from (raw name, tagged value bytes) pairs."""
    body = b"".join(bytes((len(name),)) + name + value for name, value in entries)
    return _long(len(body)) + body


def _decode_one(value_bytes: bytes) -> object:
    """Decode a one-field table holding ``value_bytes`` and return the field's value."""
    return decode_table(_table((b"k", value_bytes)))[0]["k"]


# Every tag of RabbitMQ's errata, written out by hand: (value, tagged wire bytes).
VECTORS: list[tuple[FieldValue, bytes]] = [
    ("hello", b"S" + _long(5) + b"hello"),
    ("", b"S" + _long(0)),
    ("żółw", b"S" + _long(7) + "żółw".encode()),
    (b"\xff\xfe", b"S" + _long(2) + b"\xff\xfe"),
    (ByteArray(b"\x00\x01"), b"x" + _long(2) + b"\x00\x01"),
    (ByteArray(b"text"), b"x" + _long(4) + b"text"),
    (True, b"t\x01"),
    (False, b"t\x00"),
    (Int8(-128), b"b\x80"),
    (Int8(127), b"b\x7f"),
    (UInt8(0), b"B\x00"),
    (UInt8(255), b"B\xff"),
    (Int16(-32768), b"s\x80\x00"),
    (Int16(32767), b"s\x7f\xff"),
    (UInt16(65535), b"u\xff\xff"),
    (Int32(-(2**31)), b"I\x80\x00\x00\x00"),
    (Int32(2**31 - 1), b"I\x7f\xff\xff\xff"),
    (UInt32(2**32 - 1), b"i\xff\xff\xff\xff"),
    (Int64(-(2**63)), b"l\x80" + b"\x00" * 7),
    (Int64(2**63 - 1), b"l\x7f" + b"\xff" * 7),
    (UInt64(2**64 - 1), b"L" + b"\xff" * 8),
    (Timestamp(0), b"T" + b"\x00" * 8),
    (Timestamp(1_700_000_000), b"T" + struct.pack(">Q", 1_700_000_000)),
    (Timestamp(2**64 - 1), b"T" + b"\xff" * 8),
    (Float32(0.5), b"f" + struct.pack(">f", 0.5)),
    (Float32(-math.inf), b"f\xff\x80\x00\x00"),
    (0.1, b"d" + struct.pack(">d", 0.1)),
    (-0.0, b"d\x80" + b"\x00" * 7),
    (math.inf, b"d" + struct.pack(">d", math.inf)),
    (Decimal("1.50"), b"D\x02" + struct.pack(">i", 150)),
    (Decimal("1.5"), b"D\x01" + struct.pack(">i", 15)),
    (Decimal("-2147483.648"), b"D\x03\x80\x00\x00\x00"),
    (Decimal("0E-255"), b"D\xff\x00\x00\x00\x00"),
    (Decimal(7), b"D\x00\x00\x00\x00\x07"),
    (None, b"V"),
    ({}, b"F" + _long(0)),
    ({"a": Int32(1)}, b"F" + _table((b"a", b"I\x00\x00\x00\x01"))),
    ([], b"A" + _long(0)),
    ([Int8(1), "x", None], b"A" + _long(9) + b"b\x01" + b"S" + _long(1) + b"xV"),
]


@pytest.mark.parametrize(("value", "wire"), VECTORS)
def test_encodes_each_type_to_its_errata_bytes(value: FieldValue, wire: bytes) -> None:
    """Each class is written with its own tag and width, never re-chosen from the value."""
    assert encode_table({"k": value}) == _table((b"k", wire))


@pytest.mark.parametrize(("value", "wire"), VECTORS)
def test_decodes_each_tag_to_its_class(value: FieldValue, wire: bytes) -> None:
    """Each tag comes back as the class that names it, so a relay writes it back unchanged."""
    assert same_typed(_decode_one(wire), value)


@pytest.mark.parametrize(("value", "wire"), VECTORS)
def test_tag_of_names_the_tag_the_encoder_writes(value: FieldValue, wire: bytes) -> None:
    """tag_of agrees with the first byte the encoder writes."""
    assert tag_of(value) == chr(wire[0])


def test_plain_float_round_trips_as_a_double() -> None:
    """0.1 comes back as exactly 0.1; pamqp wrote every float as 32-bit (0.10000000149011612)."""
    wire = encode_table({"ratio": 0.1})
    assert wire == _table((b"ratio", b"d" + struct.pack(">d", 0.1)))
    ratio = decode_table(wire)[0]["ratio"]
    assert type(ratio) is float
    assert ratio == 0.1


def test_float32_is_rounded_to_32_bits_and_stays_float32() -> None:
    """A Float32 is written as 4 bytes and comes back as the nearest 32-bit value, still Float32."""
    wire = encode_table({"f": Float32(0.1)})
    assert wire == _table((b"f", b"f" + struct.pack(">f", 0.1)))
    value = decode_table(wire)[0]["f"]
    assert type(value) is Float32
    assert value == struct.unpack(">f", struct.pack(">f", 0.1))[0]


@pytest.mark.parametrize("bits", ["7f800001", "ff800123", "7fc00000", "7fbfffff", "ffffffff"])
def test_float32_nan_payloads_survive(bits: str) -> None:
    """A 32-bit NaN, signalling or not, re-encodes to its own bits (struct alone quiets it)."""
    wire = _table((b"n", b"f" + bytes.fromhex(bits)))
    table = decode_table(wire)[0]
    assert type(table["n"]) is Float32
    assert math.isnan(table["n"])
    assert encode_table(table) == wire


@pytest.mark.parametrize(
    ("number", "wire"),
    [
        (0, b"I\x00\x00\x00\x00"),
        (-(2**31), b"I\x80\x00\x00\x00"),
        (2**31 - 1, b"I\x7f\xff\xff\xff"),
        (2**31, b"l" + struct.pack(">q", 2**31)),
        (-(2**31) - 1, b"l" + struct.pack(">q", -(2**31) - 1)),
        (2**63 - 1, b"l" + struct.pack(">q", 2**63 - 1)),
        (-(2**63), b"l" + struct.pack(">q", -(2**63))),
    ],
)
def test_plain_int_is_int32_when_it_fits_else_int64(number: int, wire: bytes) -> None:
    """A plain int (queue arguments, client properties) takes I, or l when 32 bits are too few."""
    assert encode_table({"n": number}) == _table((b"n", wire))
    assert tag_of(number) == chr(wire[0])
    assert type(_decode_one(wire)) is (Int32 if wire[:1] == b"I" else Int64)


def test_non_utf8_long_string_stays_bytes() -> None:
    """A long string that is not UTF-8 decodes to its raw bytes and re-encodes identically."""
    wire = _table((b"k", b"S" + _long(3) + b"a\xffb"))
    table = decode_table(wire)[0]
    assert table == {"k": b"a\xffb"}
    assert type(table["k"]) is bytes
    assert encode_table(table) == wire


def test_utf8_bytes_come_back_as_str() -> None:
    """Plain bytes are a long string on the wire, so valid UTF-8 reads back as str (documented)."""
    assert decode_table(encode_table({"k": b"abc"}))[0] == {"k": "abc"}


def test_byte_array_stays_byte_array_even_when_utf8() -> None:
    """Tag x is not S: a byte array holding text keeps its class and its tag."""
    value = decode_table(encode_table({"k": ByteArray(b"abc")}))[0]["k"]
    assert type(value) is ByteArray
    assert value == b"abc"


def test_decimal_keeps_its_scale() -> None:
    """Decimal("1.50") and Decimal("1.5") are equal numbers but differ on the wire and back."""
    wide = encode_table({"d": Decimal("1.50")})
    narrow = encode_table({"d": Decimal("1.5")})
    assert wide != narrow
    assert str(decode_table(wide)[0]["d"]) == "1.50"
    assert str(decode_table(narrow)[0]["d"]) == "1.5"


def test_decimal_ignores_the_ambient_context() -> None:
    """A caller's low decimal precision or traps neither round nor break the codec."""
    wire = _table((b"d", b"D\x02" + struct.pack(">i", 2_000_000_001)))
    with decimal.localcontext() as context:
        context.prec = 2
        context.traps[decimal.Inexact] = True
        context.traps[decimal.Rounded] = True
        value = decode_table(wire)[0]["d"]
        assert encode_table({"d": value}) == wire
    assert isinstance(value, Decimal)
    assert value.as_tuple() == Decimal("20000000.01").as_tuple()


@pytest.mark.parametrize(
    ("value", "wire", "comes_back"),
    [
        (Decimal("1E+2"), b"D\x00" + struct.pack(">i", 100), "100"),
        (Decimal("0E+5"), b"D\x00" + struct.pack(">i", 0), "0"),
        (Decimal("-0.00"), b"D\x02" + struct.pack(">i", 0), "0.00"),
    ],
)
def test_decimal_without_a_wire_form_is_written_as_its_value(
    value: Decimal, wire: bytes, comes_back: str
) -> None:
    """A positive exponent is written at scale 0 and -0 as 0: AMQP has neither."""
    assert encode_table({"d": value}) == _table((b"d", wire))
    assert str(_decode_one(wire)) == comes_back


def test_x_death_keeps_its_shape_and_types() -> None:
    """RabbitMQ's x-death (array of tables, Int64 counts, Timestamps) round-trips exactly."""
    headers: FieldTable = {
        "x-first-death-reason": "rejected",
        "x-death": [
            {
                "count": Int64(3),
                "reason": "rejected",
                "queue": "orders",
                "time": Timestamp(1_732_890_000),
                "exchange": "",
                "routing-keys": ["orders.created"],
            },
            {"count": Int64(1), "reason": "expired", "time": Timestamp(1_732_880_000)},
        ],
    }
    wire = encode_table(headers)
    decoded, end = decode_table(wire)
    assert end == len(wire)
    assert same_typed(decoded, headers)
    deaths = decoded["x-death"]
    assert isinstance(deaths, list)
    assert isinstance(deaths[0], dict)
    assert type(deaths[0]["count"]) is Int64
    assert encode_table(decoded) == wire


def test_zero_byte_void_decodes_to_none_and_re_encodes_as_v() -> None:
    """pamqp reads tag 0 as void; so do we, but we write void as V, the errata's tag."""
    table = decode_table(_table((b"a", b"\x00"), (b"b", b"V")))[0]
    assert table == {"a": None, "b": None}
    assert encode_table(table) == _table((b"a", b"V"), (b"b", b"V"))


def test_boolean_octets_other_than_one_read_as_true() -> None:
    """Any non-zero boolean octet is true, as RabbitMQ reads it; it is written back as 1."""
    assert _decode_one(b"t\x02") is True


def test_huge_string_round_trips() -> None:
    """A 1 MiB long string keeps its length prefix and content."""
    text = "é" * (512 * 1024)
    wire = encode_table({"big": text})
    assert wire[8:13] == b"S" + _long(1024 * 1024)
    assert decode_table(wire)[0]["big"] == text


def test_field_names_keep_their_bytes_and_order() -> None:
    """Names that are not UTF-8, and a 255-byte name, survive; order is kept (pamqp sorts)."""
    names = [b"\xff\xfe", b"z" * 255, b"a", "ü".encode()]
    wire = _table(*((name, b"V") for name in names))
    table = decode_table(wire)[0]
    assert [name.encode("utf-8", "surrogateescape") for name in table] == names
    assert encode_table(table) == wire


def test_decodes_from_an_offset_in_a_larger_buffer() -> None:
    """decode_table starts at offset, stops at the table's end, and reports that end."""
    wire = encode_table({"a": "b", "n": Int8(1)})
    framed = b"\x01\x02\x03" + wire + b"trailing"
    table, end = decode_table(framed, 3)
    assert table == {"a": "b", "n": 1}
    assert end == 3 + len(wire)
    assert decode_table(memoryview(framed), 3) == (table, end)
    assert decode_table(memoryview(framed)[3:])[0] == table


def test_pamqp_shaped_functions() -> None:
    """The pamqp hooks return (consumed, table) and treat None as the empty table."""
    wire = encode_table({"a": Int32(1)})
    assert decode_table_for_pamqp(wire + b"rest") == (len(wire), {"a": 1})
    assert encode_table_for_pamqp(None) == b"\x00\x00\x00\x00"
    assert encode_table_for_pamqp({"a": 1}) == wire


_PLUS_ONE = dt.timezone(dt.timedelta(hours=1))
# pamqp, and so the codec, read a naive datetime as UTC; the fraction of a second is dropped.
_NAIVE_NEW_YEAR = dt.datetime(2024, 1, 1, 0, 0, 0, 999_999)  # noqa: DTZ001


class _Colour(enum.IntEnum):
    RED = 1


class _Mode(enum.StrEnum):
    LAZY = "lazy"


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (bytearray(b"ab"), b"x" + _long(2) + b"ab"),
        (dt.datetime(2024, 1, 1, tzinfo=dt.UTC), b"T" + struct.pack(">Q", 1_704_067_200)),
        (dt.datetime(2024, 1, 1, 1, tzinfo=_PLUS_ONE), b"T" + struct.pack(">Q", 1_704_067_200)),
        (_NAIVE_NEW_YEAR, b"T" + struct.pack(">Q", 1_704_067_200)),
        ((Int8(1), "a"), b"A" + _long(8) + b"b\x01S" + _long(1) + b"a"),
        (MappingProxyType({"a": None}), b"F" + _table((b"a", b"V"))),
        (_Colour.RED, b"I\x00\x00\x00\x01"),
        (_Mode.LAZY, b"S" + _long(4) + b"lazy"),
    ],
)
def test_accepts_the_plain_values_pamqp_is_handed(value: object, wire: bytes) -> None:
    """Connection properties and queue arguments hold plain Python values; they still encode."""
    assert encode_table_for_pamqp({"k": value}) == _table((b"k", wire))


def test_pamqp_hooks_exist() -> None:
    """The adapter installs the codec at these keys; a pamqp upgrade that moves them fails here."""
    assert callable(pamqp.decode.METHODS["table"])
    assert callable(pamqp.encode.METHODS["table"])


def test_codec_works_installed_in_pamqp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through pamqp's own framing, headers keep their types and queue arguments still encode."""
    monkeypatch.setitem(pamqp.decode.METHODS, "table", decode_table_for_pamqp)
    monkeypatch.setitem(pamqp.encode.METHODS, "table", encode_table_for_pamqp)
    headers: FieldTable = {"ratio": 0.1, "small": Int8(-1), "raw": b"\xff", "when": Timestamp(5)}
    # pamqp's own FieldTable type is narrower than ours (no bytes, no Decimal subclasses).
    properties = pamqp.commands.Basic.Properties(
        headers=headers,  # type: ignore[arg-type]
        content_type="text/plain",
    )
    data = pamqp.frame.marshal(pamqp.header.ContentHeader(0, 10, properties), 1)
    _, _, frame = pamqp.frame.unmarshal(data)
    assert isinstance(frame, pamqp.header.ContentHeader)
    assert same_typed(frame.properties.headers, headers)
    assert frame.properties.content_type == "text/plain"
    declare = pamqp.commands.Queue.Declare(queue="q").marshal()
    assert declare.endswith(b"\x00\x00\x00\x00")


# ----------------------------------------------------------------------------- properties


@given(field_tables())
def test_typed_values_round_trip_with_their_classes(table: FieldTable) -> None:
    """decode(encode(t)) is t with the same class at every level and the same key order."""
    wire = encode_table(table)
    decoded, end = decode_table(wire)
    assert end == len(wire)
    assert same_typed(decoded, table)


@given(field_table_bytes())
@example(_table((b"f", b"f\x7f\x80\x00\x01"), (b"d", b"d\x7f\xf0" + b"\x00" * 5 + b"\x01")))
def test_well_formed_bytes_re_encode_identically(wire: bytes) -> None:
    """encode(decode(b)) == b byte for byte, whatever the payload bits and name bytes."""
    table, end = decode_table(wire)
    assert end == len(wire)
    assert encode_table(table) == wire


@given(field_values())
def test_tag_of_matches_the_encoder(value: FieldValue) -> None:
    """tag_of names the tag byte the encoder writes, for every kind of value."""
    wire = encode_table({"": value})
    assert tag_of(value) == chr(wire[5])


@given(st.binary())
@example(b"\x00\x00\x00\x00\x01")  # an empty table and a byte after it
def test_random_bytes_raise_only_wire_error(data: bytes) -> None:
    """Arbitrary network bytes either decode or raise WireError, never anything else."""
    with contextlib.suppress(WireError):
        _, end = decode_table(data)
        assert end == 4 + int.from_bytes(data[:4]), "the table ends where its length says"


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_random_table_bodies_raise_only_wire_error(body: bytes, trailing: bytes) -> None:
    """A correct length around random contents gets past the prefix check into the values."""
    with contextlib.suppress(WireError):
        _, end = decode_table(_long(len(body)) + body + trailing)
        assert end == 4 + len(body), "the table ends where its length says"


@given(field_table_bytes(), st.data())
def test_truncated_tables_raise_wire_error(wire: bytes, data: st.DataObject) -> None:
    """Every proper prefix of a table is an error: its length promises more bytes."""
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(WireError):
        decode_table(wire[:cut])


@given(field_table_bytes(), st.data())
def test_corrupted_tables_raise_only_wire_error(wire: bytes, data: st.DataObject) -> None:
    """A table with some bytes overwritten either decodes or raises WireError."""
    corrupted = bytearray(wire)
    for _ in range(data.draw(st.integers(1, 4))):
        corrupted[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        _, end = decode_table(bytes(corrupted))
        assert end == 4 + int.from_bytes(corrupted[:4]), "the table ends where its length says"


# ----------------------------------------------------------------------------- malformed


def _nested_tables(levels: int) -> bytes:
    """Return a table holding ``levels`` tables, each inside the previous one."""
    inner = _long(0)
    for _ in range(levels):
        inner = _table((b"n", b"F" + inner))
    return inner


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x00\x00\x00", "field table: table length at offset 0 needs 4 bytes, 3 left"),
        (_long(5) + b"\x01a", "field table: table of 5 bytes at offset 0 runs 3 bytes past"),
        (_table((b"a", b"Q")), "a: unknown type tag b'Q' at offset 6"),
        (_long(3) + b"\x05abc", "field name of 5 bytes at offset 4 runs past the end"),
        (_long(2) + b"\x01a", "a: no type tag after the field name at offset 4"),
        (_table((b"a", b"I\x00\x00")), "a: Int32 at offset 6 runs past the end of the data"),
        (_table((b"a", b"I\x00\x00")) + b"\x00\x00", "a: Int32 at offset 6 runs 2 bytes past"),
        (_table((b"a", b"S" + _long(9) + b"abc")), "a: long string at offset 6 runs 6 bytes"),
        (_table((b"a", b"x" + _long(1))), "a: byte array at offset 6 runs 1 bytes past"),
        (_table((b"a", b"A" + _long(9))), "a: array of 9 bytes at offset 7 runs 9 bytes past"),
        (_table((b"a", b"V"), (b"a", b"V")), "a: the field name appears twice in its table"),
        (
            _table(
                (b"x-death", b"A" + _long(14) + b"F" + _table((b"count", b"l\x00\x00"))),
                (b"z", b"S" + _long(0)),
            ),
            "x-death[0].count: Int64 at offset 28 runs 6 bytes past the end of its container",
        ),
        (_nested_tables(MAX_DEPTH + 1), f"nest deeper than {MAX_DEPTH} levels"),
    ],
)
def test_malformed_tables_name_the_field_and_the_problem(wire: bytes, message: str) -> None:
    """Each malformation is a WireError saying where (a dotted path) and what is wrong."""
    with pytest.raises(WireError) as caught:
        decode_table(wire)
    assert message in str(caught.value)


def test_nesting_up_to_the_limit_is_accepted() -> None:
    """MAX_DEPTH levels of nesting decode and encode; one more is refused both ways."""
    table = decode_table(_nested_tables(MAX_DEPTH))[0]
    assert encode_table(table) == _nested_tables(MAX_DEPTH)
    with pytest.raises(WireError, match="deeper than"):
        encode_table({"n": table})


def test_negative_offset_is_refused() -> None:
    """A negative offset would read from the end of the buffer; it is an error instead."""
    with pytest.raises(WireError, match="negative"):
        decode_table(_long(0), -4)


# ----------------------------------------------------------------------------- encode errors


class _HugeBytes(bytes):
    """Claims to be over 4 GiB, to reach the long-string limit without allocating it."""

    def __len__(self) -> int:
        return 2**32


_cyclic: dict[str, object] = {}
_cyclic["self"] = _cyclic


@pytest.mark.parametrize(
    ("table", "message"),
    [
        *[
            ({"n": cls(bad)}, f"n: {cls.__name__} {bad} is outside {low}..{high}")
            for cls, low, high in [
                (Int8, -128, 127),
                (UInt8, 0, 255),
                (Int16, -32768, 32767),
                (UInt16, 0, 65535),
                (Int32, -(2**31), 2**31 - 1),
                (UInt32, 0, 2**32 - 1),
                (Int64, -(2**63), 2**63 - 1),
                (UInt64, 0, 2**64 - 1),
                (Timestamp, 0, 2**64 - 1),
            ]
            for bad in (low - 1, high + 1)
        ],
        ({"n": 2**63}, "n: integer 9223372036854775808 is outside the signed 64-bit range"),
        ({"n": -(2**63) - 1}, "is outside the signed 64-bit range"),
        ({"a": [1, {"b": Int8(300)}]}, "a[1].b: Int8 300 is outside -128..127"),
        ({"f": Float32(1e39)}, "f: Float32 1e+39 is outside the 32-bit float range"),
        ({"d": Decimal("NaN")}, "d: Decimal NaN has no AMQP encoding"),
        ({"d": Decimal("-Infinity")}, "d: Decimal -Infinity has no AMQP encoding"),
        ({"d": Decimal("sNaN")}, "d: Decimal sNaN has no AMQP encoding"),
        ({"d": Decimal("1E-256")}, "d: Decimal 1E-256 has scale 256; AMQP allows 0..255"),
        ({"d": Decimal("214748364.8")}, "d: Decimal 214748364.8 needs an unscaled value outside"),
        ({"d": Decimal(-2147483649)}, "needs an unscaled value outside signed 32-bit"),
        ({"d": Decimal("3E+9")}, "needs an unscaled value outside signed 32-bit"),
        ({"d": Decimal("1E+999999")}, "needs an unscaled value outside signed 32-bit"),
        ({"d": Decimal("1.00000000000")}, "needs an unscaled value outside signed 32-bit"),
        ({"t": dt.datetime(1969, 12, 31, tzinfo=dt.UTC)}, "t: datetime 1969-12-31T00:00:00"),
        ({"é" * 128: None}, "field name is 256 bytes long; AMQP allows 255"),
        ({1: None}, "field name 1 is of type int, not str"),
        ({"\ud800": None}, "field name is not encodable as UTF-8"),
        ({"s": "a\ud800"}, "s: string is not encodable as UTF-8"),
        ({"s": _HugeBytes()}, "s: long string or byte array is longer than the 4 GiB"),
        ({"o": object()}, "o: object has no AMQP field type"),
        ({"o": {1, 2}}, "o: set has no AMQP field type"),
        ({"o": memoryview(b"")}, "o: memoryview has no AMQP field type"),
        (_cyclic, "self.self.self"),
    ],
)
def test_unencodable_values_raise_wire_error(table: dict[str, object], message: str) -> None:
    """Out-of-range widths, NaN decimals, long names and foreign types name the field."""
    with pytest.raises(WireError) as caught:
        encode_table_for_pamqp(table)
    assert message in str(caught.value)


def test_tag_of_refuses_what_the_encoder_refuses() -> None:
    """tag_of raises WireError for a type with no tag and for a plain int beyond 64 bits."""
    with pytest.raises(WireError, match="no AMQP field type"):
        tag_of(object())  # type: ignore[arg-type]
    with pytest.raises(WireError, match="64-bit"):
        tag_of(2**64)
