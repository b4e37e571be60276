"""Table-driven cases for the contract's fine print, beyond the shared vectors.

Each case pins a reading of docs/contract.md that the vectors leave open or only touch once.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.contract import (
    Policy,
    PropertyValue,
    Publishers,
    Reject,
    Relay,
    move_user_id,
    normalise,
)
from sidecar.contract.vectors import from_json, to_json
from sidecar.wire import (
    ByteArray,
    FieldValue,
    Float32,
    Int32,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    encode_table,
)

NOW = 1_790_000_000_000
BASE: dict[str, Any] = {
    "x-acemq-id": "m-1",
    "x-acemq-type": "t",
    "x-acemq-version": 1,
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": 1,
    "x-acemq-first-seen": 1_767_323_045_678,
}


def run(
    new_id: Callable[[], str],
    extra: dict[str, Any],
    *,
    properties: dict[str, Any] | None = None,
    publishers: Publishers = Publishers.ACEMQ,
    routing_key: str = "t",
    drop: tuple[str, ...] = (),
) -> Relay | Reject:
    headers = {k: from_json(v) for k, v in BASE.items() if k not in drop}
    headers.update(extra)
    return normalise(
        routing_key,
        {"message_id": "m-1"} if properties is None else properties,
        headers,
        policy=Policy(publishers=publishers, origin=None, login="sidecar"),
        now_ms=NOW,
        new_id=new_id,
    )


def pairs(verdict: Relay | Reject) -> list[tuple[str, str]]:
    return sorted((str(v.kind), v.header) for v in verdict.violations)


STAMPS = [
    ("2026-02-03T04:05:06Z", "2026-02-03T04:05:06Z", []),
    ("2026-02-03T04:05:06.000Z", "2026-02-03T04:05:06Z", [("coerced", "acemq-replayed-at")]),
    ("2026-02-03t04:05:06.5z", "2026-02-03T04:05:06.500Z", [("coerced", "acemq-replayed-at")]),
    (
        "2026-02-03T04:05:06.789999-01:30",
        "2026-02-03T05:35:06.789Z",
        [("coerced", "acemq-replayed-at")],
    ),
    ("1770091506789", "2026-02-03T04:05:06.789Z", [("coerced", "acemq-replayed-at")]),
    (Int64(1770091506789), "2026-02-03T04:05:06.789Z", [("coerced", "acemq-replayed-at")]),
    (Timestamp(1770091506), "2026-02-03T04:05:06Z", [("coerced", "acemq-replayed-at")]),
    (
        ByteArray(b"2026-02-03T04:05:06Z"),
        "2026-02-03T04:05:06Z",
        [("coerced", "acemq-replayed-at")],
    ),
    ("2026-02-30T04:05:06Z", "2026-02-30T04:05:06Z", [("unreadable", "acemq-replayed-at")]),
    (1.5, 1.5, [("unreadable", "acemq-replayed-at")]),
    (True, True, [("unreadable", "acemq-replayed-at")]),
    ("9" * 5000, "9" * 5000, [("unreadable", "acemq-replayed-at")]),
]


@pytest.mark.parametrize(("given", "written", "found"), STAMPS)
def test_replayed_at_forms(
    new_id: Callable[[], str], given: Any, written: Any, found: list[Any]
) -> None:
    """Every readable replay stamp is written in one format; an unreadable one is left as it was."""
    verdict = run(new_id, {"acemq-replayed-at": given})
    assert isinstance(verdict, Relay)
    assert verdict.headers["acemq-replayed-at"] == written
    assert type(verdict.headers["acemq-replayed-at"]) is type(written)
    assert pairs(verdict) == found


ATTEMPTS = [
    ("0007", 7, [("coerced", "x-acemq-attempt")]),
    ("+3", 3, [("coerced", "x-acemq-attempt")]),
    ("\x0b 5 \x0c", 5, [("coerced", "x-acemq-attempt")]),
    ("\u00a05", 1, [("unreadable", "x-acemq-attempt")]),  # NBSP is not ASCII whitespace
    ("\u0665", 1, [("unreadable", "x-acemq-attempt")]),  # an Arabic-Indic digit is not [0-9]
    ("1_000", 1, [("unreadable", "x-acemq-attempt")]),  # Python's int() would accept it
    ("9" * 5000, 1, [("unreadable", "x-acemq-attempt")]),  # int() would refuse it
    ("2147483648", 1, [("unreadable", "x-acemq-attempt")]),
    (Int64(2**31), 1, [("unreadable", "x-acemq-attempt")]),
    (UInt64(2**64 - 1), 1, [("unreadable", "x-acemq-attempt")]),
    ("-0", 1, [("coerced", "x-acemq-attempt"), ("out_of_range", "x-acemq-attempt")]),
    (Float32(-0.5), 1, [("coerced", "x-acemq-attempt"), ("out_of_range", "x-acemq-attempt")]),
    (float("nan"), 1, [("unreadable", "x-acemq-attempt")]),
    (float("inf"), 1, [("unreadable", "x-acemq-attempt")]),
    (Decimal("-2.99"), 1, [("coerced", "x-acemq-attempt"), ("out_of_range", "x-acemq-attempt")]),
    (Decimal("1E+300"), 1, [("unreadable", "x-acemq-attempt")]),
    (Timestamp(5), 1, [("unreadable", "x-acemq-attempt")]),
    (ByteArray(b""), 1, [("defaulted", "x-acemq-attempt"), ("empty_value", "x-acemq-attempt")]),
    (None, 1, [("defaulted", "x-acemq-attempt"), ("null_value", "x-acemq-attempt")]),
]


@pytest.mark.parametrize(("given", "written", "found"), ATTEMPTS)
def test_integer_reading(
    new_id: Callable[[], str], given: Any, written: int, found: list[Any]
) -> None:
    """Integer fields read only ASCII base-10 text and finite numbers, within 32 bits."""
    verdict = run(new_id, {"x-acemq-attempt": given})
    assert isinstance(verdict, Relay)
    assert to_json(verdict.headers["x-acemq-attempt"]) == {"$int32": written}
    assert pairs(verdict) == found


FIRST_SEEN = [
    ("2026-01-02T03:04:05.678+02:00", 1_767_315_845_678, [("coerced", "x-acemq-first-seen")]),
    (
        "1969-12-31T23:59:59Z",
        NOW,
        [("coerced", "x-acemq-first-seen"), ("out_of_range", "x-acemq-first-seen")],
    ),
    (Timestamp(2**62), NOW, [("unreadable", "x-acemq-first-seen")]),
    (1e30, NOW, [("unreadable", "x-acemq-first-seen")]),
    (UInt64(2**63), NOW, [("unreadable", "x-acemq-first-seen")]),
    (True, NOW, [("unreadable", "x-acemq-first-seen")]),
    ("2016-12-31T23:59:60Z", 1_483_228_799_000, [("coerced", "x-acemq-first-seen")]),
    ("2016-12-31T23:58:60Z", NOW, [("unreadable", "x-acemq-first-seen")]),
    # Whitespace may surround a base-10 integer, not an RFC 3339 time (section 3).
    (" 1767323045678 ", 1_767_323_045_678, [("coerced", "x-acemq-first-seen")]),
    (" 2026-01-02T03:04:05Z", NOW, [("unreadable", "x-acemq-first-seen")]),
    (ByteArray(b"1767323045678"), 1_767_323_045_678, [("coerced", "x-acemq-first-seen")]),
    # Section 9: an RFC 3339 first-seen is accepted only as a string, not as bytes.
    (ByteArray(b"2026-01-02T03:04:05Z"), NOW, [("unreadable", "x-acemq-first-seen")]),
]


@pytest.mark.parametrize(("given", "written", "found"), FIRST_SEEN)
def test_first_seen_reading(
    new_id: Callable[[], str], given: Any, written: int, found: list[Any]
) -> None:
    """first-seen reads RFC 3339 with offsets, and never writes a time at or before the epoch."""
    verdict = run(new_id, {"x-acemq-first-seen": given})
    assert isinstance(verdict, Relay)
    assert to_json(verdict.headers["x-acemq-first-seen"]) == {"$int64": written}
    assert pairs(verdict) == found


def test_invalid_utf8_is_replaced_per_maximal_subpart(new_id: Callable[[], str]) -> None:
    """One U+FFFD per maximal invalid subpart, as Python's errors="replace" does."""
    verdict = run(new_id, {"x-acemq-causation": b"a\xe2\x82b\xff"})
    assert isinstance(verdict, Relay)
    assert verdict.headers["x-acemq-causation"] == "a\ufffdb\ufffd"
    assert pairs(verdict) == [("coerced", "x-acemq-causation")]


def test_void_unknown_reserved_is_namespace_first(new_id: Callable[[], str]) -> None:
    """An unknown x-acemq- void is stripped as unknown_reserved, not counted as null_value."""
    verdict = run(new_id, {"x-acemq-new": None})
    assert isinstance(verdict, Relay)
    assert "x-acemq-new" not in verdict.headers
    assert pairs(verdict) == [("unknown_reserved", "x-acemq-*")]


def test_reject_reason_lists_every_name_sorted(new_id: Callable[[], str]) -> None:
    """Under apps every offending name is quoted, sorted, and the advice comes last."""
    verdict = run(new_id, {"x-acemq-b": "1", "x-acemq-a": None}, publishers=Publishers.APPS)
    assert isinstance(verdict, Reject)
    assert verdict.reason.index('"x-acemq-a"') < verdict.reason.index('"x-acemq-b"')
    assert verdict.reason.endswith("such as x-yourcompany-")
    assert pairs(verdict) == [("app_reserved", "x-acemq-*")] * 2


def test_reject_reason_for_several_names_keeps_every_phrase_of_the_contract(
    new_id: Callable[[], str],
) -> None:
    """docs/contract.md section 4's sentence, with the sorted list where its one name stands."""
    verdict = run(new_id, {"x-acemq-b": "1", "x-acemq-a": "2"}, publishers=Publishers.APPS)
    assert isinstance(verdict, Reject)
    assert verdict.reason == (
        'header "x-acemq-a", "x-acemq-b" is in the reserved "x-acemq-" namespace and was set'
        " by the application; it would be dropped by every AceMQ consumer; use a namespace"
        " of your own, such as x-yourcompany-"
    )


def test_legacy_void_does_not_beat_nothing(new_id: Callable[[], str]) -> None:
    """A void legacy stamp is removed as a void; nothing is renamed."""
    verdict = run(new_id, {"x-acemq-replay-count": None})
    assert isinstance(verdict, Relay)
    assert "acemq-replay-count" not in verdict.headers
    assert pairs(verdict) == [("null_value", "x-acemq-replay-count")]


def test_empty_current_stamp_loses_to_legacy(new_id: Callable[[], str]) -> None:
    """Presence is judged after empties: an empty acemq- stamp does not beat a legacy value."""
    verdict = run(new_id, {"acemq-replayed-from": "", "x-acemq-replayed-from": "q.dlq"})
    assert isinstance(verdict, Relay)
    assert verdict.headers["acemq-replayed-from"] == "q.dlq"
    assert pairs(verdict) == [
        ("empty_value", "acemq-replayed-from"),
        ("legacy_name", "x-acemq-replayed-from"),
    ]


def test_route_of_blanks_drops_position_and_id(new_id: Callable[[], str]) -> None:
    """A route with no step left is not written, and its position and run id go with it."""
    verdict = run(
        new_id, {"x-acemq-route": " , \t,", "x-acemq-route-position": 1, "x-acemq-route-id": "r"}
    )
    assert isinstance(verdict, Relay)
    assert not {"x-acemq-route", "x-acemq-route-position", "x-acemq-route-id"} & set(
        verdict.headers
    )
    assert pairs(verdict) == [
        ("empty_value", "x-acemq-route"),
        ("unreadable", "x-acemq-route-id"),
        ("unreadable", "x-acemq-route-position"),
    ]


def test_moved_user_id_overwrites_application_copy(new_id: Callable[[], str]) -> None:
    """A moved user_id overwrites an acemq-original-user-id the application set."""
    verdict = run(
        new_id,
        {"acemq-original-user-id": "spoofed"},
        properties={"message_id": "m-1", "user_id": "svc"},
    )
    assert isinstance(verdict, Relay)
    assert verdict.headers["acemq-original-user-id"] == "svc"
    assert "user_id" not in verdict.properties


def test_empty_user_id_is_removed(new_id: Callable[[], str]) -> None:
    """An empty user_id is removed and counted empty_value, with nothing moved."""
    verdict = run(new_id, {}, properties={"message_id": "m-1", "user_id": ""})
    assert isinstance(verdict, Relay)
    assert "user_id" not in verdict.properties
    assert "acemq-original-user-id" not in verdict.headers
    assert pairs(verdict) == [("empty_value", "user_id")]


def test_apps_unreadable_header_filled_from_property(new_id: Callable[[], str]) -> None:
    """Under apps an unreadable header takes its property, counted unreadable only."""
    verdict = run(
        new_id,
        {"x-acemq-correlation": 1.5},
        properties={"message_id": "m-1", "correlation_id": "c-9"},
        publishers=Publishers.APPS,
    )
    assert isinstance(verdict, Relay)
    assert verdict.headers["x-acemq-correlation"] == "c-9"
    assert pairs(verdict) == [("unreadable", "x-acemq-correlation")]


def test_unreadable_id_falls_back_to_message_id_uncounted(new_id: Callable[[], str]) -> None:
    """An unreadable value gives unreadable only, never unreadable and defaulted."""
    verdict = run(new_id, {"x-acemq-id": {"nested": "table"}})
    assert isinstance(verdict, Relay)
    assert verdict.headers["x-acemq-id"] == "m-1"
    assert pairs(verdict) == [("unreadable", "x-acemq-id")]


def test_input_is_not_mutated(new_id: Callable[[], str]) -> None:
    """normalise returns new tables and leaves its inputs as they were."""
    headers = {"x-acemq-replayed-at": "1770091506789", "x-acemq-x": "1", "a": None}
    properties = {"user_id": "svc"}
    snapshot = (dict(headers), dict(properties))
    normalise("rk", properties, headers, policy=Policy(), now_ms=NOW, new_id=new_id)
    assert (headers, properties) == snapshot


def test_undecodable_reserved_name_reason_is_writable(new_id: Callable[[], str]) -> None:
    """A reserved name that is not UTF-8 is escaped in the reason, so quarantine can write it."""
    name = b"x-acemq-\xff".decode("utf-8", "surrogateescape")  # how the codec keeps it
    verdict = run(new_id, {name: "1"}, publishers=Publishers.APPS)
    assert isinstance(verdict, Reject)
    assert '"x-acemq-\\xff"' in verdict.reason
    verdict.reason.encode("utf-8")


def test_stripped_names_are_reported_for_the_log(new_id: Callable[[], str]) -> None:
    """The real names of stripped headers travel with the verdict, never in a label."""
    verdict = run(new_id, {"x-acemq-zone": "eu", "x-acemq-b": None})
    assert isinstance(verdict, Relay)
    assert sorted(verdict.stripped) == ["x-acemq-b", "x-acemq-zone"]
    assert {v.header for v in verdict.violations} == {"x-acemq-*"}


def test_property_that_is_not_utf8_fills_headers_with_replacements(
    new_id: Callable[[], str],
) -> None:
    """A non-UTF-8 message_id or user_id is read like bytes: U+FFFD, so headers stay writable."""
    raw = b"m-\xff".decode("utf-8", "surrogateescape")
    verdict = run(new_id, {}, properties={"message_id": raw, "user_id": raw}, drop=("x-acemq-id",))
    assert isinstance(verdict, Relay)
    assert verdict.headers["x-acemq-id"] == "m-\ufffd"
    assert verdict.properties["message_id"] == "m-\ufffd"
    assert verdict.headers["acemq-original-user-id"] == "m-\ufffd"
    encode_table(dict(verdict.headers))


def test_apps_zero_timestamp_fills_then_is_out_of_range(new_id: Callable[[], str]) -> None:
    """Under apps a timestamp of 0 fills first-seen (defaulted), which 0 puts out of range."""
    verdict = run(
        new_id,
        {},
        properties={"message_id": "m-1", "timestamp": 0},
        publishers=Publishers.APPS,
        drop=("x-acemq-first-seen",),
    )
    assert isinstance(verdict, Relay)
    assert to_json(verdict.headers["x-acemq-first-seen"]) == {"$int64": NOW}
    assert pairs(verdict) == [
        ("defaulted", "x-acemq-first-seen"),
        ("out_of_range", "x-acemq-first-seen"),
    ]


def test_widening_leaves_the_input_table_as_it_was(new_id: Callable[[], str]) -> None:
    """A nested unsigned tag is widened in a new table; the caller's table keeps its tag."""
    inner: dict[str, Any] = {"n": UInt16(40000), "list": [UInt8(1)]}
    verdict = run(new_id, {"x-stats": inner})
    assert isinstance(verdict, Relay)
    out = verdict.headers["x-stats"]
    assert isinstance(out, dict)
    assert type(out["n"]) is Int32
    assert isinstance(out["list"], list)
    assert type(out["list"][0]) is Int32
    assert type(inner["n"]) is UInt16
    assert type(inner["list"][0]) is UInt8
    assert pairs(verdict) == [("unportable", "app")]


def test_a_table_that_holds_itself_still_gets_a_verdict(new_id: Callable[[], str]) -> None:
    """Widening stops at the codec's depth, so a cyclic table cannot exhaust the stack."""
    cyclic: dict[str, Any] = {"n": UInt32(1)}
    cyclic["self"] = cyclic
    verdict = run(new_id, {"x-cycle": cyclic})
    assert isinstance(verdict, Relay)
    assert pairs(verdict) == [("unportable", "app")]


@pytest.mark.parametrize(
    ("header", "prop"), [("x-acemq-id", "message_id"), ("acemq-reply-to", "reply_to")]
)
@pytest.mark.parametrize("came", [None, "short"])
def test_an_address_past_255_bytes_stays_in_its_header(
    new_id: Callable[[], str], header: str, prop: str, came: str | None
) -> None:
    """Section 2: a header too long for a short string leaves its property as it came."""
    long = "é" * 128  # 128 characters, 256 bytes of UTF-8
    properties = {} if came is None else {prop: came}
    if prop == "reply_to":
        properties["message_id"] = "m-1"
    verdict = run(new_id, {header: long}, properties=properties)
    assert isinstance(verdict, Relay)
    assert verdict.headers[header] == long
    assert verdict.properties.get(prop) == came
    assert ("mirror", prop) not in pairs(verdict)


def test_an_address_of_255_bytes_is_still_mirrored(new_id: Callable[[], str]) -> None:
    """The bound is the short string's: 255 bytes fit and are mirrored as before."""
    edge = "é" * 127 + "a"  # 255 bytes
    verdict = run(new_id, {"x-acemq-id": edge})
    assert isinstance(verdict, Relay)
    assert verdict.properties["message_id"] == edge
    assert ("mirror", "message_id") in pairs(verdict)


@pytest.mark.parametrize(
    ("user_id", "kind", "original"),
    [("guest", "moved", "guest"), ("svc", "moved", "svc"), ("", "empty_value", None)],
)
def test_with_no_known_login_every_user_id_moves(
    user_id: str, kind: str, original: str | None
) -> None:
    """EXTERNAL without a user: the broker's name for us is not known, so none may stay."""
    properties: dict[str, PropertyValue] = {"user_id": user_id}
    headers: dict[str, FieldValue] = {}
    assert move_user_id(properties, headers, login=None) == kind
    assert properties == {}
    assert headers.get("acemq-original-user-id") == original


def test_with_no_known_login_a_message_without_user_id_is_untouched() -> None:
    properties: dict[str, PropertyValue] = {"message_id": "m-1"}
    headers: dict[str, FieldValue] = {}
    assert move_user_id(properties, headers, login=None) is None
    assert (properties, headers) == ({"message_id": "m-1"}, {})


@given(user_id=st.text(max_size=40), login=st.none() | st.text(max_size=40))
def test_a_user_id_stays_only_when_it_is_the_known_login(user_id: str, login: str | None) -> None:
    """Whatever the login: what stays is the login itself, what moves is kept in the header."""
    properties: dict[str, PropertyValue] = {"user_id": user_id}
    headers: dict[str, FieldValue] = {}
    move_user_id(properties, headers, login=login)
    if login is not None and user_id == login:
        assert properties == {"user_id": login}
        assert headers == {}
    else:
        assert "user_id" not in properties
        assert ("acemq-original-user-id" in headers) == (user_id != "")


def test_normalise_under_no_known_login_moves_even_the_default_login(
    new_id: Callable[[], str],
) -> None:
    headers = {k: from_json(v) for k, v in BASE.items()}
    verdict = normalise(
        "t",
        {"message_id": "m-1", "user_id": "guest"},
        headers,
        policy=Policy(login=None),
        now_ms=NOW,
        new_id=new_id,
    )
    assert isinstance(verdict, Relay)
    assert "user_id" not in verdict.properties
    assert verdict.headers["acemq-original-user-id"] == "guest"
    assert ("moved", "user_id") in pairs(verdict)
