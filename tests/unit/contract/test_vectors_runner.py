"""The conformance-vector runner itself: the typed notation, its errors, and the diff it reports.

The shared vectors only show that a correct normaliser passes; these cases show that the
runner notices each kind of difference and says exactly where, since its messages are what
a conformance author reads (``acemq-sidecar conform FILE``). Vectors are built here, inline,
so that a change to tests/contract/vectors.json cannot change what these tests prove.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest

from sidecar.contract import Kind, Policy, Publishers, Reject, Relay, Violation
from sidecar.contract.vectors import (
    VectorError,
    from_json,
    message_from_json,
    run_vector,
    to_json,
    verdict_to_json,
)
from sidecar.wire import (
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

NOW = 1_790_000_000_000
ID_1 = "f67aff08-6293-4ce2-af9e-1b8797fb8451"
ID_2 = "0b6f1c9e-3d2a-4f4b-8a1e-5c7d9e0f1a2b"

# Already canonical: relayed unchanged with no violation, so only "app" is under test.
CANONICAL: dict[str, Any] = {
    "x-acemq-id": "m-1",
    "x-acemq-type": "t",
    "x-acemq-version": 1,
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": 1,
    "x-acemq-first-seen": 1_767_323_045_678,
}
CANONICAL_OUT: dict[str, Any] = {
    "x-acemq-id": "m-1",
    "x-acemq-type": "t",
    "x-acemq-version": {"$int32": 1},
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": {"$int32": 1},
    "x-acemq-first-seen": {"$int64": 1_767_323_045_678},
}
REASON = (
    'header "x-acemq-tenant", "x-acemq-zone" is in the reserved "x-acemq-" namespace and was '
    "set by the application; it would be dropped by every AceMQ consumer; use a namespace of "
    "your own, such as x-yourcompany-"
)


def _relay(app: Any, expected_app: Any) -> dict[str, Any]:
    """Return a vector relaying the application header ``app``, expected back as given."""
    return {
        "name": "runner-relay",
        "routing_key": "t",
        "properties": {"message_id": "m-1"},
        "headers": {**CANONICAL, "app": app},
        "policy": {"publishers": "acemq", "origin": None, "login": "sidecar"},
        "now_ms": NOW,
        "expect": {
            "verdict": "relay",
            "properties": {"message_id": "m-1"},
            "headers": {**CANONICAL_OUT, "app": expected_app},
            "violations": [],
        },
    }


def _reject(reason_contains: list[str]) -> dict[str, Any]:
    """Return a vector rejected under publishers apps for two unknown reserved names."""
    return {
        "name": "runner-reject",
        "routing_key": "t",
        "properties": {"message_id": "m-1"},
        "headers": {**CANONICAL, "x-acemq-zone": "eu", "x-acemq-tenant": "acme"},
        "policy": {"publishers": "apps", "origin": None, "login": "sidecar"},
        "now_ms": NOW,
        "expect": {
            "verdict": "reject",
            "violations": [["app_reserved", "x-acemq-*"], ["app_reserved", "x-acemq-*"]],
            "reason_contains": reason_contains,
        },
    }


def _ids(*values: str) -> Callable[[], str]:
    """Return a UUID source that yields these values in turn."""
    it: Iterator[str] = iter(values)
    return lambda: next(it)


# --- the typed notation --------------------------------------------------------------


TAGGED: list[tuple[dict[str, Any], type]] = [
    ({"$int8": -128}, Int8),
    ({"$uint8": 255}, UInt8),
    ({"$int16": -32768}, Int16),
    ({"$uint16": 65535}, UInt16),
    ({"$int32": -(2**31)}, Int32),
    ({"$uint32": 2**32 - 1}, UInt32),
    ({"$int64": -(2**63)}, Int64),
    ({"$uint64": 2**64 - 1}, UInt64),
    ({"$timestamp": 1_767_323_045}, Timestamp),
    ({"$bytes": "ff00"}, bytes),
    ({"$bytearray": "00ff"}, ByteArray),
    ({"$float": 0.5}, Float32),
    ({"$double": 0.1}, float),
    ({"$decimal": "1.50"}, Decimal),
]


@pytest.mark.parametrize(("typed", "cls"), TAGGED, ids=[next(iter(t)) for t, _ in TAGGED])
def test_every_tag_reads_as_its_wire_class_and_writes_back_unchanged(
    typed: dict[str, Any], cls: type
) -> None:
    """Each tag of FORMAT.md maps to exactly one wire class, and to_json inverts from_json."""
    value = from_json(typed)
    assert type(value) is cls
    assert to_json(value) == typed


def test_float_tag_rounds_to_the_nearest_float32() -> None:
    """{"$float": 0.1} is the float32 nearest 0.1, not the double 0.1."""
    value = from_json({"$float": 0.1})
    assert value == 0.10000000149011612
    assert to_json(value) == {"$float": 0.10000000149011612}


def test_decimal_tag_keeps_its_scale() -> None:
    """A decimal's scale survives both ways: "1.50" stays distinct from "1.5" (FORMAT.md)."""
    assert to_json(from_json({"$decimal": "1.50"})) == {"$decimal": "1.50"}
    assert to_json(from_json({"$decimal": "1.5"})) == {"$decimal": "1.5"}
    assert to_json(Decimal("1E+2")) == {"$decimal": "100"}


@pytest.mark.parametrize(
    ("number", "cls"),
    [(2**31 - 1, Int32), (-(2**31), Int32), (2**31, Int64), (-(2**31) - 1, Int64)],
)
def test_a_bare_integer_is_int32_where_it_fits_and_int64_beyond(number: int, cls: type) -> None:
    """An untagged integer (a contract header's value) takes the narrowest of the two widths."""
    value = from_json(number)
    assert type(value) is cls
    assert value == number


def test_plain_json_values_and_containers_read_through() -> None:
    """Strings, booleans, null, nested tables and arrays keep their shape, typed inside."""
    value = from_json({"s": "x", "b": True, "n": None, "t": {"a": [{"$int8": 1}, "y"]}})
    assert value == {"s": "x", "b": True, "n": None, "t": {"a": [Int8(1), "y"]}}
    assert isinstance(value, dict)
    inner = value["t"]
    assert isinstance(inner, dict)
    items = inner["a"]
    assert isinstance(items, list)
    assert type(items[0]) is Int8


def test_a_table_whose_keys_only_look_like_a_tag_is_a_table() -> None:
    """Only a single-key object whose key starts with "$" is a tag; others are tables."""
    assert from_json({"plain": {"$int8": 1}}) == {"plain": Int8(1)}
    assert from_json({"$int8": 1, "b": "x"}) == {"$int8": Int32(1), "b": "x"}


def test_an_untagged_python_int_writes_as_a_bare_integer() -> None:
    """A plain int (no width class) has no tag to write, so it is written bare."""
    assert to_json({"n": 5, "l": [Int16(2)]}) == {"n": 5, "l": [{"$int16": 2}]}


BAD_VALUES = [
    (
        {"$bytes": "zz"},
        (
            "headers: bad $bytes value 'zz': non-hexadecimal number found in "
            "fromhex() arg at position 0"
        ),
    ),
    ({"$bytes": 12}, "headers: bad $bytes value 12: fromhex() argument must be str, not int"),
    (
        {"$bytearray": "0"},
        (
            "headers: bad $bytearray value '0': non-hexadecimal number found in "
            "fromhex() arg at position 1"
        ),
    ),
    ({"$float": "x"}, "headers: bad $float value 'x': could not convert string to float: 'x'"),
    ({"$float": 1e300}, "headers: bad $float value 1e+300: float too large to pack with f format"),
    (
        {"$double": [1]},
        (
            "headers: bad $double value [1]: float() argument must be a string or a "
            "real number, not 'list'"
        ),
    ),
    (
        {"$decimal": "1,5"},
        "headers: bad $decimal value '1,5': [<class 'decimal.ConversionSyntax'>]",
    ),
    ({"$int128": 1}, "headers: unknown tag $int128"),
    ({"$uuid": "A"}, "headers: unknown tag $uuid"),  # a placeholder, only inside expect
    (1.5, "headers: float is not a typed value"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_VALUES, ids=[str(b) for b, _ in BAD_VALUES])
def test_a_bad_typed_value_is_a_vector_error_naming_the_tag_and_value(
    bad: Any, message: str
) -> None:
    """A malformed value is refused with the path, the tag and the offending value."""
    with pytest.raises(VectorError) as caught:
        from_json(bad)
    assert str(caught.value) == message


@pytest.mark.parametrize("bad", ["1", True, 1.0, None])
def test_an_integer_tag_needs_a_json_integer(bad: Any) -> None:
    """Booleans, strings and floats are not integers, whatever Python's int() would accept."""
    with pytest.raises(VectorError, match=r"^headers\.app: .*\$int16 needs an integer$"):
        from_json({"app": {"$int16": bad}})


def test_an_error_deep_inside_names_the_full_path() -> None:
    """The path runs through nested tables and array positions to the bad value."""
    with pytest.raises(VectorError) as caught:
        from_json({"outer": {"list": ["ok", {"$bytes": "q"}]}})
    assert str(caught.value).startswith("headers.outer.list[1]: bad $bytes value 'q': ")
    with pytest.raises(VectorError) as caught:
        from_json({"outer": [[1.5]]}, "expect.headers")
    assert str(caught.value) == "expect.headers.outer[0][0]: float is not a typed value"


# --- messages --------------------------------------------------------------------------


def test_an_empty_message_reads_with_the_documented_defaults() -> None:
    """No routing key, properties, headers or policy: "", {}, {}, acemq as guest, origin none."""
    assert message_from_json({}, now_ms=7) == ("", {}, {}, Policy(), 7)


def test_a_message_reads_its_fields_and_its_own_now_ms_wins() -> None:
    """now_ms in the message overrides the caller's clock; every other field is read as given."""
    message = {
        "routing_key": "k",
        "properties": {"priority": 3},
        "headers": {"a": {"$uint8": 1}},
        "policy": {"publishers": "apps", "origin": "o", "login": "l"},
        "now_ms": 11,
    }
    routing_key, properties, headers, policy, now_ms = message_from_json(message, now_ms=7)
    assert (routing_key, properties, now_ms) == ("k", {"priority": 3}, 11)
    assert headers == {"a": UInt8(1)}
    assert type(headers["a"]) is UInt8
    assert policy == Policy(publishers=Publishers.APPS, origin="o", login="l")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"policy": {"publishers": "app"}, "now_ms": 1}, "policy: 'app' is not a valid Publishers"),
        ({"headers": [1], "now_ms": 1}, "headers: expected a table"),
        ({"headers": {"$int8": 1}, "now_ms": 1}, "headers: expected a table"),
        ({}, "now_ms: expected an integer"),
        ({"now_ms": "1790000000000"}, "now_ms: expected an integer"),
        ({"headers": {"a": 0.5}, "now_ms": 1}, "headers.a: float is not a typed value"),
    ],
)
def test_a_malformed_message_is_a_vector_error_naming_the_field(
    message: dict[str, Any], error: str
) -> None:
    """A bad policy, a header value that is not a table, or no usable now_ms is refused."""
    with pytest.raises(VectorError) as caught:
        message_from_json(message)
    assert str(caught.value) == error


# --- verdicts ------------------------------------------------------------------------


def test_a_relay_is_written_in_the_expect_format_with_violations_sorted() -> None:
    """verdict_to_json writes tags, and the violation pairs sorted by kind then header."""
    verdict = Relay(
        properties={"message_id": "m"},
        headers={"n": Int32(1)},
        violations=(
            Violation(Kind.MIRROR, "message_id"),
            Violation(Kind.DEFAULTED, "x-acemq-type"),
            Violation(Kind.DEFAULTED, "x-acemq-id"),
        ),
    )
    assert verdict_to_json(verdict) == {
        "verdict": "relay",
        "properties": {"message_id": "m"},
        "headers": {"n": {"$int32": 1}},
        "violations": [
            ["defaulted", "x-acemq-id"],
            ["defaulted", "x-acemq-type"],
            ["mirror", "message_id"],
        ],
    }


def test_a_reject_is_written_with_its_whole_reason_and_no_message() -> None:
    """A reject carries its reason as the one reason_contains entry, no properties or headers."""
    verdict = Reject(reason="why", violations=(Violation(Kind.APP_RESERVED, "x-acemq-*"),))
    assert verdict_to_json(verdict) == {
        "verdict": "reject",
        "violations": [["app_reserved", "x-acemq-*"]],
        "reason_contains": ["why"],
    }


# --- the runner: verdicts and violations -----------------------------------------------


def test_a_matching_relay_vector_passes(new_id: Callable[[], str]) -> None:
    """The baseline the other cases break one thing at a time."""
    assert run_vector(_relay("v", "v"), new_id=new_id) is None


def test_a_relay_where_a_reject_was_expected_is_reported(new_id: Callable[[], str]) -> None:
    """A normaliser that relays what it must quarantine fails on the verdict first."""
    vector = _relay("v", "v")
    vector["expect"] = {"verdict": "reject", "violations": [], "reason_contains": []}
    assert run_vector(vector, new_id=new_id) == "verdict: expected reject, got relay"


def test_a_reject_where_a_relay_was_expected_is_reported(new_id: Callable[[], str]) -> None:
    """A normaliser that quarantines what it must relay fails on the verdict first."""
    vector = _reject([])
    vector["expect"] = _relay("v", "v")["expect"]
    assert run_vector(vector, new_id=new_id) == "verdict: expected relay, got reject"


def test_different_violations_are_reported_sorted(new_id: Callable[[], str]) -> None:
    """The expected pairs are sorted before the comparison, and both lists are shown."""
    vector = _relay("v", "v")
    vector["expect"]["violations"] = [["mirror", "message_id"], ["defaulted", "x-acemq-id"]]
    assert run_vector(vector, new_id=new_id) == (
        "violations: expected [['defaulted', 'x-acemq-id'], ['mirror', 'message_id']], got []"
    )


def test_violations_are_counted_not_deduplicated(new_id: Callable[[], str]) -> None:
    """Two stripped names give two pairs: one expected pair is a difference (FORMAT.md)."""
    vector = _reject(["x-yourcompany-"])
    vector["expect"]["violations"] = [["app_reserved", "x-acemq-*"]]
    assert run_vector(vector, new_id=new_id) == (
        "violations: expected [['app_reserved', 'x-acemq-*']], "
        "got [['app_reserved', 'x-acemq-*'], ['app_reserved', 'x-acemq-*']]"
    )


# --- the runner: reject reasons --------------------------------------------------------


@pytest.mark.parametrize(
    "parts",
    [
        [],
        [REASON],
        ['"x-acemq-tenant"', '"x-acemq-zone"', "x-yourcompany-"],
        ["header", "", "reserved"],
    ],
)
def test_reason_substrings_present_in_order_pass(
    parts: list[str], new_id: Callable[[], str]
) -> None:
    """Each substring is found after the end of the previous one; none listed is no check."""
    assert run_vector(_reject(parts), new_id=new_id) is None


def test_reason_substrings_out_of_order_are_reported(new_id: Callable[[], str]) -> None:
    """The zone is named after the tenant in the reason, so zone-then-tenant fails on tenant."""
    vector = _reject(['"x-acemq-zone"', '"x-acemq-tenant"'])
    assert run_vector(vector, new_id=new_id) == (
        f"reason: '\"x-acemq-tenant\"' not found in order in {REASON!r}"
    )


def test_a_reason_substring_that_occurs_once_cannot_match_twice(
    new_id: Callable[[], str],
) -> None:
    """The search resumes after the previous match, so a repeated part needs two occurrences."""
    vector = _reject(["x-yourcompany-", "x-yourcompany-"])
    assert run_vector(vector, new_id=new_id) == (
        f"reason: 'x-yourcompany-' not found in order in {REASON!r}"
    )


def test_a_missing_reason_substring_is_reported(new_id: Callable[[], str]) -> None:
    """A word the reason never says is named, with the whole reason to compare against."""
    vector = _reject(["reserved", "x-theircompany-"])
    assert run_vector(vector, new_id=new_id) == (
        f"reason: 'x-theircompany-' not found in order in {REASON!r}"
    )


# --- the runner: the diff of properties and headers ------------------------------------


def test_an_expected_header_that_is_missing_is_reported(new_id: Callable[[], str]) -> None:
    """The complete header table is expected: one the normaliser dropped is a difference."""
    vector = _relay("v", "v")
    vector["expect"]["headers"]["x-gone"] = {"$int8": 1}
    assert run_vector(vector, new_id=new_id) == ("headers.x-gone: missing, expected {'$int8': 1}")


def test_an_unexpected_header_is_reported(new_id: Callable[[], str]) -> None:
    """Anything not listed must be absent: an extra header is a difference."""
    vector = _relay({"$int32": 7}, "unused")
    del vector["expect"]["headers"]["app"]
    assert run_vector(vector, new_id=new_id) == "headers.app: unexpected {'$int32': 7}"


def test_a_missing_property_is_reported_before_any_header(new_id: Callable[[], str]) -> None:
    """Properties are compared first, under their own path."""
    vector = _relay("v", "w")
    vector["expect"]["properties"]["app_id"] = "a"
    assert run_vector(vector, new_id=new_id) == "properties.app_id: missing, expected 'a'"


def test_an_unexpected_property_is_reported(new_id: Callable[[], str]) -> None:
    """The complete properties are expected: an extra one is a difference."""
    vector = _relay("v", "v")
    vector["properties"]["app_id"] = "a"
    assert run_vector(vector, new_id=new_id) == "properties.app_id: unexpected 'a'"


@pytest.mark.parametrize(
    ("given", "expected", "difference"),
    [
        ("a", "b", "headers.app: expected 'b', got 'a'"),
        (True, "true", "headers.app: expected 'true', got True"),
        (True, 1, "headers.app: expected 1, got True"),
        ({"$int32": 1}, "1", "headers.app: expected '1', got {'$int32': 1}"),
        ({"$int64": 1}, {"$int32": 1}, "headers.app.$int32: missing, expected 1"),
        ({"$int32": 2}, {"$int32": 1}, "headers.app.$int32: expected 1, got 2"),
        ({"$bytes": "ff"}, {"$bytearray": "ff"}, "headers.app.$bytearray: missing, expected 'ff'"),
        (
            {"$decimal": "1.5"},
            {"$decimal": "1.50"},
            "headers.app.$decimal: expected '1.50', got '1.5'",
        ),
        ({"$double": 0.5}, {"$double": 0.25}, "headers.app.$double: expected 0.25, got 0.5"),
        ({"$double": 1.0}, {"$double": math.nan}, "headers.app.$double: expected nan, got 1.0"),
        ({"t": {"u": "x"}}, {"t": {"u": "y"}}, "headers.app.t.u: expected 'y', got 'x'"),
        (["a", "b"], ["a"], "headers.app: expected 1 items, got 2"),
        (["a"], ["a", "b"], "headers.app: expected 2 items, got 1"),
        (["a", "b"], ["a", "c"], "headers.app[1]: expected 'c', got 'b'"),
        ([["a"]], [["a"], ["b"]], "headers.app: expected 2 items, got 1"),
        (["a"], {"0": "a"}, "headers.app: expected {'0': 'a'}, got ['a']"),
    ],
)
def test_each_kind_of_value_difference_is_reported_at_its_path(
    given: Any, expected: Any, difference: str, new_id: Callable[[], str]
) -> None:
    """Wrong value, wrong type or tag, decimal scale, array length and position are named."""
    assert run_vector(_relay(given, expected), new_id=new_id) == difference


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"$double": math.nan}, {"$double": math.nan}),
        ([{"$int8": 1}, {"t": None}], [{"$int8": 1}, {"t": None}]),
        ({"$decimal": "1.50"}, {"$decimal": "1.50"}),
    ],
)
def test_equal_values_pass_including_nan(
    given: Any, expected: Any, new_id: Callable[[], str]
) -> None:
    """NaN equals NaN for the runner, and arrays and tables compare element by element."""
    assert run_vector(_relay(given, expected), new_id=new_id) is None


@pytest.mark.parametrize(
    "expected",
    [{"$float": 0.1}, {"$float": 0.10000000149011612}, {"$float": 0.100000001}],
)
def test_float32_values_compare_after_rounding_both_sides(
    expected: dict[str, float], new_id: Callable[[], str]
) -> None:
    """Any x whose nearest float32 is the value's own passes (FORMAT.md)."""
    assert run_vector(_relay({"$float": 0.1}, expected), new_id=new_id) is None


def test_float32_nan_equals_float32_nan(new_id: Callable[[], str]) -> None:
    """A float32 NaN in and out is the same value, though NaN != NaN in Python."""
    assert run_vector(_relay({"$float": math.nan}, {"$float": math.nan}), new_id=new_id) is None


@pytest.mark.parametrize(
    ("given", "expected", "difference"),
    [
        (
            {"$float": 0.1},
            {"$float": 0.1000001},
            "headers.app: expected {'$float': 0.1000001}, got {'$float': 0.10000000149011612}",
        ),
        (
            {"$float": 1.0},
            {"$float": math.nan},
            "headers.app: expected {'$float': nan}, got {'$float': 1.0}",
        ),
        (
            {"$double": 0.5},
            {"$float": 0.5},
            "headers.app: expected {'$float': 0.5}, got {'$double': 0.5}",
        ),
        ("0.5", {"$float": 0.5}, "headers.app: expected {'$float': 0.5}, got 0.5"),
    ],
)
def test_a_float32_difference_is_reported_with_both_values(
    given: Any, expected: dict[str, float], difference: str, new_id: Callable[[], str]
) -> None:
    """A different float32, or a value that is not a float32 at all, is a difference."""
    assert run_vector(_relay(given, expected), new_id=new_id) == difference


# --- the runner: UUID placeholders ---------------------------------------------------


def _generated(message_id: Any, *, identity: Any, correlation: Any) -> dict[str, Any]:
    """Return a vector with no AceMQ header, so the normaliser generates the id."""
    return {
        "routing_key": "orders",
        "properties": {},
        "headers": {},
        "policy": {"publishers": "acemq", "origin": None, "login": "sidecar"},
        "now_ms": NOW,
        "expect": {
            "verdict": "relay",
            "properties": {"message_id": message_id},
            "headers": {
                "x-acemq-id": identity,
                "x-acemq-type": "orders",
                "x-acemq-version": {"$int32": 1},
                "x-acemq-correlation": correlation,
                "x-acemq-attempt": {"$int32": 1},
                "x-acemq-first-seen": {"$int64": NOW},
            },
            "violations": [
                ["defaulted", "x-acemq-attempt"],
                ["defaulted", "x-acemq-correlation"],
                ["defaulted", "x-acemq-first-seen"],
                ["defaulted", "x-acemq-id"],
                ["defaulted", "x-acemq-type"],
                ["defaulted", "x-acemq-version"],
                ["mirror", "message_id"],
            ],
        },
    }


def test_one_letter_binds_one_generated_uuid_everywhere() -> None:
    """The generated id, its correlation and message_id are all {"$uuid": "A"}."""
    a = {"$uuid": "A"}
    assert run_vector(_generated(a, identity=a, correlation=a), new_id=_ids(ID_1)) is None


def test_a_letter_bound_to_one_uuid_rejects_another() -> None:
    """The same letter must be the same value: a second UUID under it is a difference."""
    vector = _relay(ID_2, {"$uuid": "A"})
    vector["properties"]["app_id"] = ID_1
    vector["expect"]["properties"]["app_id"] = {"$uuid": "A"}
    assert run_vector(vector, new_id=_ids()) == (
        f"headers.app: expected the UUID A ({ID_1}), got {ID_2}"
    )


def test_two_letters_must_be_two_different_uuids() -> None:
    """Different letters are different values: the generated id under A and B is a difference."""
    a, b = {"$uuid": "A"}, {"$uuid": "B"}
    vector = _generated(a, identity=b, correlation=b)
    assert run_vector(vector, new_id=_ids(ID_1)) == "headers.x-acemq-id: UUID B equals UUID A"


def test_two_letters_bound_to_two_uuids_pass() -> None:
    """Distinct UUIDs under distinct letters bind without complaint."""
    vector = _relay(ID_2, {"$uuid": "B"})
    vector["properties"]["app_id"] = ID_1
    vector["expect"]["properties"]["app_id"] = {"$uuid": "A"}
    assert run_vector(vector, new_id=_ids()) is None


@pytest.mark.parametrize(
    "value",
    [
        "f67aff08-6293-4ce2-af9e",  # too few groups
        "f67aff0-86293-4ce2-af9e-1b8797fb8451",  # groups of the wrong length
        ID_1.upper(),  # not the canonical lower-case form
        "g67aff08-6293-4ce2-af9e-1b8797fb8451",  # not hex
        "f67aff08-6293-1ce2-af9e-1b8797fb8451",  # version 1
        "f67aff08-6293-4ce2-cf9e-1b8797fb8451",  # not the RFC 4122 variant
        "",
    ],
)
def test_a_placeholder_needs_a_canonical_uuid_v4(value: str) -> None:
    """Only xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx in lower case binds a letter."""
    assert run_vector(_relay(value, {"$uuid": "A"}), new_id=_ids()) == (
        f"headers.app: expected a canonical UUID v4, got {value!r}"
    )


def test_a_placeholder_is_not_matched_by_a_typed_value() -> None:
    """A UUID carried as bytes or a table is not the string the placeholder stands for."""
    given = {"$bytes": ID_1.encode().hex()}
    assert run_vector(_relay(given, {"$uuid": "A"}), new_id=_ids()) == (
        f"headers.app: expected a canonical UUID v4, got {{'$bytes': '{ID_1.encode().hex()}'}}"
    )


# --- defects these tests found, fixed ----------------------------------------------------


@pytest.mark.parametrize(
    "typed", [{"$int8": 300}, {"$uint8": -1}, {"$int32": 2**31}, {"$uint64": 2**64}]
)
def test_a_tagged_integer_outside_its_width_is_a_vector_error(typed: dict[str, int]) -> None:
    """An integer tag is a width: a value that does not fit it is not an AMQP field value."""
    with pytest.raises(VectorError, match=r"^headers\.app: bad \$u?int\d+ value"):
        from_json({"app": typed})


def test_a_non_integer_for_an_integer_tag_names_the_path_once() -> None:
    """The message a conformance author reads says where and what, once."""
    with pytest.raises(VectorError) as caught:
        from_json({"app": {"$int16": "1"}})
    assert str(caught.value) == "headers.app: $int16 needs an integer"


@pytest.mark.parametrize("policy", ["acemq", ["acemq"], 1])
def test_a_policy_that_is_not_an_object_is_a_vector_error(policy: Any) -> None:
    """policy must be an object; anything else is a malformed vector, named as such."""
    with pytest.raises(VectorError, match=r"^policy: "):
        message_from_json({"policy": policy, "now_ms": 1})


def test_an_expected_float32_out_of_range_is_reported_not_raised(
    new_id: Callable[[], str],
) -> None:
    """A wrong expectation is a difference the runner reports, whatever its value."""
    vector = _relay({"$float": 1.0}, {"$float": 1e39})
    assert run_vector(vector, new_id=new_id) == (
        "headers.app: expected {'$float': 1e+39}, got {'$float': 1.0}"
    )


def test_reason_contains_given_as_a_string_is_not_read_letter_by_letter(
    new_id: Callable[[], str],
) -> None:
    """FORMAT.md makes reason_contains a list of substrings; a bare string is malformed."""
    vector = _reject([])
    vector["expect"]["reason_contains"] = "hxeader"
    try:
        difference = run_vector(vector, new_id=new_id)
    except VectorError:
        return
    assert difference is not None
