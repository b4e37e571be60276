"""Properties of normalise over arbitrary typed header tables (hypothesis).

Whatever the table holds (every AMQP type, nesting, voids, huge values, reserved and
lookalike names), normalise returns a verdict, its output is a fixed point, application
headers come out untouched, and everything it writes can go back on the wire.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.contract import (
    APP_LABEL,
    CONTRACT_HEADERS,
    LEGACY_NAMES,
    ORIGINAL_USER_ID,
    RESERVED_PREFIX,
    UNKNOWN_RESERVED_LABEL,
    Kind,
    Policy,
    Publishers,
    Reject,
    Relay,
    Verdict,
    normalise,
)
from sidecar.wire import FieldValue, Int32, Int64, UInt8, UInt16, UInt32, encode_table
from tests.unit.strategies import field_names, field_values, same_typed

NOW_MS = 1_790_000_000_000
INTEGER_HEADERS = {
    "x-acemq-version": Int32,
    "x-acemq-attempt": Int32,
    "x-acemq-route-position": Int32,
    "acemq-replay-count": Int32,
    "x-acemq-first-seen": Int64,
}
PROPERTY_LABELS = {"message_id", "reply_to", "user_id"}

# Values chosen to hit the parsers' edges, mixed in with arbitrary typed values.
TRICKY: list[FieldValue] = [
    "",
    " 4 ",
    "\t-7\n",
    "+0",
    "0" * 40 + "1",
    "9" * 30,
    "1_0",
    "\u0664",
    "2026-02-03T04:05:06.7891234+00:00",
    "2026-02-03t04:05:06z",
    "2026-13-03T04:05:06Z",
    "1770091506789",
    "a, ,b,,",
    " , ",
    b"\xff\xfe",
    b"",
    None,
    True,
    Int64(2**31),
    Int32(-1),
    Int32(0),
    float("nan"),
    float("-inf"),
    1e300,
]


def contract_values() -> st.SearchStrategy[FieldValue]:
    return st.one_of(st.sampled_from(TRICKY), field_values(max_depth=2, max_size=3))


def header_tables() -> st.SearchStrategy[dict[str, FieldValue]]:
    contract = st.dictionaries(
        st.sampled_from(sorted(CONTRACT_HEADERS)), contract_values(), max_size=12
    )
    reserved = st.dictionaries(
        st.text(max_size=12)
        .map(lambda s: RESERVED_PREFIX + s)
        .filter(lambda name: name not in CONTRACT_HEADERS),
        field_values(max_depth=1, max_size=2),
        max_size=2,
    )
    lookalikes = st.dictionaries(
        st.sampled_from(
            ["X-Acemq-Tenant", "x-acemq", "acemq-routing-slip", "xx-acemq-a", "ACEMQ-X"]
        ),
        field_values(max_depth=1, max_size=2),
        max_size=2,
    )
    application = st.dictionaries(
        field_names(max_bytes=40).filter(
            lambda name: name not in CONTRACT_HEADERS and not name.startswith(RESERVED_PREFIX)
        ),
        field_values(max_depth=3, max_size=3),
        max_size=5,
    )
    return st.tuples(contract, reserved, lookalikes, application).map(
        lambda parts: {k: v for part in parts for k, v in part.items()}
    )


def property_tables() -> st.SearchStrategy[dict[str, Any]]:
    text = st.one_of(
        st.just(""),
        st.text(max_size=20),
        st.sampled_from(["guest", "svc"]),
        # a short string that is not UTF-8, as the adapter keeps it (surrogate escapes)
        st.binary(max_size=12).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "message_id": text,
            "reply_to": text,
            "user_id": text,
            "correlation_id": text,
            "type": text,
            "app_id": text,
            "timestamp": st.integers(min_value=0, max_value=2**40),
            "content_type": text,
            "delivery_mode": st.sampled_from([1, 2]),
            "cluster_id": text,
        },
    )


policies = st.builds(
    Policy,
    publishers=st.sampled_from(Publishers),
    origin=st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=10)),
    login=st.sampled_from(["guest", "svc"]),
)


def same_table(a: Mapping[str, FieldValue], b: Mapping[str, FieldValue]) -> bool:
    """Equal values of the same types under the same names; top-level order aside, NaN-safe."""
    return a.keys() == b.keys() and all(same_typed(a[name], b[name]) for name in a)


def seeded_ids(seed: int) -> Callable[[], str]:
    rng = random.Random(seed)
    return lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))


def run(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> Verdict:
    return normalise(key, properties, headers, policy=policy, now_ms=NOW_MS, new_id=seeded_ids(1))


COMMON = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
routing_keys = st.one_of(st.just(""), st.text(max_size=20))


@COMMON
@given(header_tables(), property_tables(), policies, routing_keys)
def test_relay_output_is_a_fixed_point(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> None:
    """Normalising the output again changes nothing and finds nothing but an unreadable stamp."""
    first = run(headers, properties, policy, key)
    if not isinstance(first, Relay):
        return
    second = run(dict(first.headers), dict(first.properties), policy, key)
    assert isinstance(second, Relay)
    assert same_table(second.headers, first.headers)
    assert second.properties == first.properties
    assert all(
        v.kind is Kind.UNREADABLE and v.header == "acemq-replayed-at" for v in second.violations
    ), second.violations


# docs/contract.md section 7: the unsigned tags some clients cannot decode, and their signed tags.
WIDER = {UInt8: Int32, UInt16: Int32, UInt32: Int64}


def widened(value: object) -> object:
    """Return the value as section 7 says it leaves the sidecar: same value, signed tags."""
    if type(value) in WIDER:
        return WIDER[type(value)](value)
    if isinstance(value, dict):
        return {key: widened(item) for key, item in value.items()}
    if isinstance(value, list):
        return [widened(item) for item in value]
    return value


@COMMON
@given(header_tables(), property_tables(), policies, routing_keys)
def test_application_headers_pass_unchanged(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> None:
    """Every application header keeps its value and type, but for the widened unsigned tags.

    Each top-level header whose value changed (at any depth) counts one ``unportable``.
    """
    verdict = run(headers, properties, policy, key)
    if not isinstance(verdict, Relay):
        return
    moved = properties.get("user_id") not in (None, policy.login)
    changed = 0
    for name, value in headers.items():
        if name in CONTRACT_HEADERS or name.startswith(RESERVED_PREFIX) or value is None:
            continue
        if name == ORIGINAL_USER_ID and moved:
            continue
        expected = widened(value)
        assert same_typed(verdict.headers[name], expected), name
        changed += not same_typed(expected, value)
    unportable = [v for v in verdict.violations if v.kind is Kind.UNPORTABLE]
    assert unportable == [(Kind.UNPORTABLE, APP_LABEL)] * changed
    for name in headers:
        if name.startswith(RESERVED_PREFIX) and name not in CONTRACT_HEADERS:
            assert name not in verdict.headers


@COMMON
@given(header_tables(), property_tables(), policies, routing_keys)
def test_contract_headers_are_canonical_and_writable(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> None:
    """Written contract headers have their canonical types and ranges, and encode."""
    verdict = run(headers, properties, policy, key)
    if isinstance(verdict, Reject):
        assert policy.publishers is Publishers.APPS
        return
    out = verdict.headers
    for name in LEGACY_NAMES:
        assert name not in out
    for name, cls in INTEGER_HEADERS.items():
        if name in out:
            assert type(out[name]) is cls, name
    assert out["x-acemq-version"] >= 1  # type: ignore[operator]
    assert out["x-acemq-attempt"] >= 1  # type: ignore[operator]
    assert out["x-acemq-first-seen"] > 0  # type: ignore[operator]
    assert out.get("x-acemq-route-position", 0) >= 0  # type: ignore[operator]
    assert out.get("acemq-replay-count", 1) > 0  # type: ignore[operator]
    for name in ("x-acemq-id", "x-acemq-type", "x-acemq-correlation"):
        assert type(out[name]) is str, name
        assert out[name], name
    assert verdict.properties["message_id"] == out["x-acemq-id"]
    assert (
        ("x-acemq-route" in out) == ("x-acemq-route-id" in out) == ("x-acemq-route-position" in out)
    )
    user_id = verdict.properties.get("user_id")
    assert user_id is None or user_id == policy.login
    encode_table(out)


@COMMON
@given(header_tables(), property_tables(), policies, routing_keys)
def test_violations_are_bounded_labels(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> None:
    """Violation labels come from a closed set: never a raw unknown header name."""
    verdict = run(headers, properties, policy, key)
    allowed = CONTRACT_HEADERS | PROPERTY_LABELS | {UNKNOWN_RESERVED_LABEL, APP_LABEL}
    for violation in verdict.violations:
        assert isinstance(violation.kind, Kind)
        assert violation.header in allowed, violation
    unknown = [n for n in headers if n.startswith(RESERVED_PREFIX) and n not in CONTRACT_HEADERS]
    if isinstance(verdict, Reject):
        assert len(verdict.violations) == len(unknown) > 0
        for name in unknown:
            assert f'"{name}"' in verdict.reason


@COMMON
@given(header_tables(), property_tables(), policies, routing_keys)
def test_verdict_is_deterministic(
    headers: dict[str, FieldValue], properties: dict[str, Any], policy: Policy, key: str
) -> None:
    """The same input, now_ms and UUID source give the same verdict."""
    a, b = run(headers, properties, policy, key), run(headers, properties, policy, key)
    assert type(a) is type(b)
    assert sorted(a.violations) == sorted(b.violations)
    if isinstance(a, Relay) and isinstance(b, Relay):
        assert same_table(a.headers, b.headers)
        assert a.properties == b.properties


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=30), field_values(max_depth=4, max_size=4), max_size=8))
def test_never_raises_on_any_table(headers: dict[str, FieldValue]) -> None:
    """Any table at all, names included, yields a verdict under both publisher settings."""
    for publishers in Publishers:
        verdict = normalise(
            "rk",
            {},
            headers,
            policy=Policy(publishers=publishers),
            now_ms=NOW_MS,
            new_id=seeded_ids(2),
        )
        assert isinstance(verdict, (Relay, Reject))
