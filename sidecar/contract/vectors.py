"""The conformance-vector format (contract/README.md): typed JSON values and the vector runner.

Owns the mapping between the vectors' JSON notation (``{"$int32": 1}``, ``{"$bytes": ..}``)
and ``sidecar.wire`` values, and the comparison of a verdict with a vector's ``expect``.
Pure: callers read the files. Never compiled (scripts/compile): its dispatch on a value's
class must see the int subclasses as the classes they are.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from sidecar.contract.normaliser import normalise
from sidecar.contract.verdict import Kind, Policy, Publishers, Reject, Relay
from sidecar.errors import VectorError
from sidecar.wire import (
    INT_BOUNDS,
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

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.contract.verdict import Verdict
    from sidecar.wire import FieldValue

__all__ = [
    "VectorError",
    "from_json",
    "message_from_json",
    "run_vector",
    "to_json",
    "verdict_to_json",
]

_INT_TAGS: dict[str, type[int]] = {
    "$int8": Int8,
    "$uint8": UInt8,
    "$int16": Int16,
    "$uint16": UInt16,
    "$int32": Int32,
    "$uint32": UInt32,
    "$int64": Int64,
    "$uint64": UInt64,
    "$timestamp": Timestamp,
}
_TAG_OF_INT: dict[type, str] = {cls: tag for tag, cls in _INT_TAGS.items()}
_FLOAT32 = struct.Struct(">f")


def _float32(x: float) -> Float32:
    return Float32(_FLOAT32.unpack(_FLOAT32.pack(x))[0])


def from_json(value: Any, path: str = "headers") -> FieldValue:  # noqa: ANN401 - JSON is untyped
    """Turn a typed JSON value of the vector notation into a wire value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        low, high = INT_BOUNDS[Int32]
        return Int32(value) if low <= value <= high else Int64(value)
    if isinstance(value, list):
        return [from_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, dict):
        raise VectorError(f"{path}: {type(value).__name__} is not a typed value")
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag.startswith("$"):
            return _from_tagged(tag, inner, path)
    return {str(key): from_json(item, f"{path}.{key}") for key, item in value.items()}


def _from_tagged(tag: str, inner: Any, path: str) -> FieldValue:  # noqa: ANN401
    if tag in _INT_TAGS:
        return _tagged_int(tag, inner, path)
    try:
        match tag:
            case "$bytes":
                return bytes.fromhex(inner)
            case "$bytearray":
                return ByteArray(bytes.fromhex(inner))
            case "$float":
                return _float32(float(inner))
            case "$double":
                return float(inner)
            case "$decimal":
                return Decimal(inner)
    except (ValueError, TypeError, InvalidOperation, OverflowError) as e:
        raise VectorError(f"{path}: bad {tag} value {inner!r}: {e}") from e
    raise VectorError(f"{path}: unknown tag {tag}")


def _tagged_int(tag: str, inner: Any, path: str) -> FieldValue:  # noqa: ANN401
    if not isinstance(inner, int) or isinstance(inner, bool):
        raise VectorError(f"{path}: {tag} needs an integer")
    kind = _INT_TAGS[tag]
    low, high = INT_BOUNDS[kind]
    if not low <= inner <= high:
        raise VectorError(f"{path}: bad {tag} value {inner!r}: outside {low}..{high}")
    return kind(inner)


def to_json(value: FieldValue) -> Any:  # noqa: ANN401, PLR0911 - JSON is untyped; a case per tag
    """Turn a wire value into the vector notation, tags included."""
    match value:
        case None | bool() | str():
            return value
        case ByteArray():
            return {"$bytearray": value.hex()}
        case bytes():
            return {"$bytes": value.hex()}
        case Float32():
            return {"$float": float(value)}
        case float():
            return {"$double": value}
        case Decimal():
            return {"$decimal": format(value, "f")}
        case int():
            tag = _TAG_OF_INT.get(type(value))
            return {tag: int(value)} if tag else int(value)
        case dict():
            return {key: to_json(item) for key, item in value.items()}
        case list():
            return [to_json(item) for item in value]
    raise VectorError(f"not a wire value: {value!r}")  # pragma: no cover - typed input


def verdict_to_json(verdict: Verdict) -> dict[str, Any]:
    """Write a verdict in the vectors' ``expect`` format (violations sorted)."""
    violations = sorted([str(v.kind), v.header] for v in verdict.violations)
    match verdict:
        case Relay():
            return {
                "verdict": "relay",
                "properties": dict(verdict.properties),
                "headers": {name: to_json(value) for name, value in verdict.headers.items()},
                "violations": violations,
            }
        case Reject():
            return {
                "verdict": "reject",
                "violations": violations,
                "reason_contains": [verdict.reason],
            }


def message_from_json(
    message: Mapping[str, Any], *, now_ms: int | None = None
) -> tuple[str, dict[str, Any], dict[str, FieldValue], Policy, int]:
    """Read routing key, properties, headers, policy and now_ms of a vector-format message."""
    policy_json = message.get("policy") or {}
    if not isinstance(policy_json, dict):
        raise VectorError(f"policy: expected an object, got {type(policy_json).__name__}")
    try:
        policy = Policy(
            publishers=Publishers(policy_json.get("publishers", "acemq")),
            origin=policy_json.get("origin"),
            login=policy_json.get("login", "guest"),
        )
    except ValueError as e:
        raise VectorError(f"policy: {e}") from e
    headers = from_json(message.get("headers") or {})
    if not isinstance(headers, dict):
        raise VectorError("headers: expected a table")
    when = message.get("now_ms", now_ms)
    if not isinstance(when, int):
        raise VectorError("now_ms: expected an integer")
    return (
        str(message.get("routing_key", "")),
        dict(message.get("properties") or {}),
        headers,
        policy,
        when,
    )


def run_vector(vector: Mapping[str, Any], *, new_id: Callable[[], str]) -> str | None:
    """Run one vector through normalise; return its first difference, or None if it passes."""
    routing_key, properties, headers, policy, now_ms = message_from_json(vector)
    verdict = normalise(
        routing_key, properties, headers, policy=policy, now_ms=now_ms, new_id=new_id
    )
    got = verdict_to_json(verdict)
    expect = vector["expect"]
    if got["verdict"] != expect["verdict"]:
        return f"verdict: expected {expect['verdict']}, got {got['verdict']}"
    expected_violations = sorted(list(pair) for pair in expect.get("violations", []))
    if got["violations"] != expected_violations:
        return f"violations: expected {expected_violations}, got {got['violations']}"
    for pair in got["violations"]:
        Kind(pair[0])  # the kind must be in the closed set
    if expect["verdict"] == "reject":
        parts = expect.get("reason_contains", [])
        if not isinstance(parts, list) or not all(isinstance(part, str) for part in parts):
            raise VectorError("expect.reason_contains: expected a list of strings")
        return _diff_reason(parts, got["reason_contains"][0])
    bindings: dict[str, str] = {}
    return _diff(expect["properties"], got["properties"], "properties", bindings) or _diff(
        expect["headers"], got["headers"], "headers", bindings
    )


def _diff_reason(parts: list[str], reason: str) -> str | None:
    at = 0
    for part in parts:
        found = reason.find(part, at)
        if found < 0:
            return f"reason: {part!r} not found in order in {reason!r}"
        at = found + len(part)
    return None


def _diff(  # noqa: C901, PLR0911, PLR0912 - one case per kind of JSON value compared
    expected: Any,  # noqa: ANN401
    actual: Any,  # noqa: ANN401
    path: str,
    bindings: dict[str, str],
) -> str | None:
    if isinstance(expected, dict) and len(expected) == 1 and "$uuid" in expected:
        return _diff_uuid(expected["$uuid"], actual, path, bindings)
    if isinstance(expected, dict) and len(expected) == 1 and "$float" in expected:
        ok = isinstance(actual, dict) and set(actual) == {"$float"}
        if ok and _same_float32(expected["$float"], actual["$float"]):
            return None
        return f"{path}: expected {expected}, got {actual}"
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected.keys() - actual.keys():
            return f"{path}.{key}: missing, expected {expected[key]!r}"
        for key in actual.keys() - expected.keys():
            return f"{path}.{key}: unexpected {actual[key]!r}"
        for key in expected:
            if (found := _diff(expected[key], actual[key], f"{path}.{key}", bindings)) is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}"
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            if (found := _diff(want, got, f"{path}[{i}]", bindings)) is not None:
                return found
        return None
    if _same_scalar(expected, actual):
        return None
    return f"{path}: expected {expected!r}, got {actual!r}"


def _same_scalar(expected: Any, actual: Any) -> bool:  # noqa: ANN401
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, float) and math.isnan(expected):
        return math.isnan(actual)
    return bool(expected == actual)


def _same_float32(a: float, b: float) -> bool:
    try:
        fa, fb = _float32(a), _float32(b)
    except (OverflowError, TypeError, struct.error):  # not a float32 at all: a difference
        return False
    return (math.isnan(fa) and math.isnan(fb)) or fa == fb


def _diff_uuid(letter: str, actual: Any, path: str, bindings: dict[str, str]) -> str | None:  # noqa: ANN401
    if not isinstance(actual, str) or not _is_uuid4(actual):
        return f"{path}: expected a canonical UUID v4, got {actual!r}"
    bound = bindings.setdefault(letter, actual)
    if bound != actual:
        return f"{path}: expected the UUID {letter} ({bound}), got {actual}"
    for other, value in bindings.items():
        if other != letter and value == actual:
            return f"{path}: UUID {letter} equals UUID {other}"
    return None


def _is_uuid4(text: str) -> bool:
    parts = text.split("-")
    if [len(p) for p in parts] != [8, 4, 4, 4, 12]:
        return False
    if any(c not in "0123456789abcdef" for c in text.replace("-", "")):
        return False
    return parts[2][0] == "4" and parts[3][0] in "89ab"
