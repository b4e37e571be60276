"""The envelope contract's one function (docs/contract.md section 1): one message in, one verdict.

This module owns ``normalise`` and its steps: the sorting of headers into contract,
application and unknown reserved ones (sections 4 and 5), the legacy spellings, the
identity, context and route headers (section 2), then the replay stamps, the properties
and the application headers, each in its own module. It is pure: no I/O, no clock
(``now_ms`` is passed in), no randomness except the injected ``new_id``, and it never
raises, whatever the header table holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.contract.envelope import Envelope, property_text
from sidecar.contract.names import (
    APP_LABEL,
    ATTEMPT,
    CAUSATION,
    CLAIM,
    CONTRACT_HEADERS,
    CORRELATION,
    DEFAULT_TYPE,
    ERROR,
    FIRST_SEEN,
    ID,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    LEGACY_NAMES,
    ORIGIN,
    RESERVED_PREFIX,
    ROUTE,
    ROUTE_ID,
    ROUTE_POSITION,
    TYPE,
    UNKNOWN_RESERVED_LABEL,
    VERSION,
    WHITESPACE,
)
from sidecar.contract.properties import normalise_properties
from sidecar.contract.readers import readable
from sidecar.contract.replay import normalise_replay
from sidecar.contract.verdict import Kind, Policy, Publishers, Reject, Relay, Verdict, Violation
from sidecar.contract.widen import widen_application
from sidecar.wire import FieldValue, Int32, Int64, PropertyValue

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["normalise"]


def _reject_reason(names: list[str]) -> str:
    # docs/contract.md section 4's sentence with every offending name in it, sorted; kept word
    # for word (not made plural) so that each of its phrases holds for any number of names.
    quoted = ", ".join(f'"{readable(name)}"' for name in sorted(names))
    return (
        f'header {quoted} is in the reserved "{RESERVED_PREFIX}" namespace and was set by the '
        "application; it would be dropped by every AceMQ consumer; use a namespace of your "
        "own, such as x-yourcompany-"
    )


def _split_headers(
    headers: Mapping[str, FieldValue], found: list[Violation]
) -> tuple[dict[str, FieldValue], dict[str, FieldValue], list[str]]:
    """Sort headers into contract values, application headers and unknown reserved names.

    Voids and empty strings in contract headers are removed here (section 5), so that
    presence is judged after them; top-level application voids are removed too.
    """
    contract: dict[str, FieldValue] = {}
    application: dict[str, FieldValue] = {}
    unknown: list[str] = []
    for name, value in headers.items():
        if name in CONTRACT_HEADERS:
            if value is None:
                found.append(Violation(Kind.NULL_VALUE, name))
            elif not value and isinstance(value, (str, bytes)):
                # Only empty bytes decode to "" (section 9), so this covers them too.
                found.append(Violation(Kind.EMPTY_VALUE, name))
            else:
                contract[name] = value
        elif name.startswith(RESERVED_PREFIX):
            unknown.append(name)
        elif value is None:
            found.append(Violation(Kind.NULL_VALUE, APP_LABEL))
        else:
            application[name] = value
    return contract, application, unknown


def _rename_legacy(contract: dict[str, FieldValue], found: list[Violation]) -> None:
    """Rewrite the legacy x-acemq-replayed-* spellings; the acemq- spelling wins."""
    for legacy, current in LEGACY_NAMES.items():
        if legacy not in contract:
            continue
        value = contract.pop(legacy)
        found.append(Violation(Kind.LEGACY_NAME, legacy))
        contract.setdefault(current, value)


def _normalise_identity(env: Envelope, routing_key: str, now_ms: int) -> str:
    """Write id, type, version, correlation, attempt and first-seen; return the id."""
    headers = env.headers
    msg_id = env.text(ID)
    if msg_id is None:
        msg_id = env.default(ID, property_text(env.properties, "message_id") or env.new_id())
    headers[ID] = msg_id

    msg_type = env.text(TYPE) or env.from_property(TYPE, "type")
    headers[TYPE] = msg_type or env.default(TYPE, routing_key or DEFAULT_TYPE)

    version = env.integer(VERSION, low=INT32_MIN, high=INT32_MAX)
    headers[VERSION] = Int32(
        env.default(VERSION, 1) if version is None else env.at_least(VERSION, version, 1)
    )

    correlation = env.text(CORRELATION) or env.from_property(CORRELATION, "correlation_id")
    headers[CORRELATION] = correlation or env.default(CORRELATION, msg_id)

    attempt = env.integer(ATTEMPT, low=INT32_MIN, high=INT32_MAX)
    headers[ATTEMPT] = Int32(
        env.default(ATTEMPT, 1) if attempt is None else env.at_least(ATTEMPT, attempt, 1)
    )

    first_seen = env.integer(FIRST_SEEN, low=INT64_MIN, high=INT64_MAX, is_first_seen=True)
    if first_seen is None and (stamp := _apps_first_seen(env)) is not None:
        first_seen = env.default(FIRST_SEEN, stamp)  # the AMQP timestamp fills it (section 4)
    if first_seen is None:
        first_seen = env.default(FIRST_SEEN, now_ms)
    elif first_seen <= 0:  # what Go and .NET write back after reading a missing one
        env.found.append(Violation(Kind.OUT_OF_RANGE, FIRST_SEEN))
        first_seen = now_ms
    headers[FIRST_SEEN] = Int64(first_seen)
    return msg_id


def _apps_first_seen(env: Envelope) -> int | None:
    """Under apps, the AMQP timestamp (seconds) in milliseconds, when it is usable."""
    stamp = env.properties.get("timestamp") if env.apps else None
    if type(stamp) is int and stamp <= INT64_MAX // 1000:
        return stamp * 1000  # a zero then counts out_of_range and becomes now_ms
    return None


def _normalise_context(env: Envelope, origin: str | None) -> None:
    """Write causation, origin, error and claim when they hold text."""
    env.put_text(CAUSATION)
    # Origin: header, then (apps) app_id, then the configured origin, which is
    # configuration rather than drift and so is not counted (section 9).
    value = env.text(ORIGIN) or env.from_property(ORIGIN, "app_id") or origin
    if value:
        env.headers[ORIGIN] = value
    env.put_text(ERROR)
    env.put_text(CLAIM)


def _normalise_route(env: Envelope) -> None:
    """Write the route trio, or drop a position or run id that has no route."""
    raw = env.text(ROUTE)
    if raw is None:
        steps: list[str] = []
    else:
        steps = [step for part in raw.split(",") if (step := part.strip(WHITESPACE))]
        if not steps:
            env.found.append(Violation(Kind.EMPTY_VALUE, ROUTE))
    if not steps:
        env.found.extend(
            Violation(Kind.UNREADABLE, name)
            for name in (ROUTE_POSITION, ROUTE_ID)
            if name in env.contract
        )
        return
    joined = ",".join(steps)
    if joined != raw and type(env.contract[ROUTE]) is str:  # bytes were counted already
        env.found.append(Violation(Kind.COERCED, ROUTE))
    env.headers[ROUTE] = joined
    position = env.integer(ROUTE_POSITION, low=INT32_MIN, high=INT32_MAX)
    env.headers[ROUTE_POSITION] = Int32(
        env.default(ROUTE_POSITION, 0)
        if position is None
        else env.at_least(ROUTE_POSITION, position, 0)
    )
    run_id = env.text(ROUTE_ID)
    env.headers[ROUTE_ID] = run_id if run_id is not None else env.default(ROUTE_ID, env.new_id())


def normalise(
    routing_key: str,
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue],
    *,
    policy: Policy,
    now_ms: int,
    new_id: Callable[[], str],
) -> Verdict:
    """Return the message as every AceMQ reader agrees to read it (docs/contract.md section 1).

    Pure: never raises, never reads a clock; normalising a ``Relay`` result again with the
    same ``now_ms`` changes nothing. ``properties`` use snake_case AMQP names with the
    timestamp in seconds; ``new_id`` must return a fresh UUID v4 string on every call.
    """
    found: list[Violation] = []
    contract, application, unknown = _split_headers(headers, found)
    if unknown:
        if policy.publishers is Publishers.APPS:
            reserved = Violation(Kind.APP_RESERVED, UNKNOWN_RESERVED_LABEL)
            return Reject(reason=_reject_reason(unknown), violations=(reserved,) * len(unknown))
        found.extend(Violation(Kind.UNKNOWN_RESERVED, UNKNOWN_RESERVED_LABEL) for _ in unknown)
    _rename_legacy(contract, found)
    env = Envelope(
        contract, properties, found, apps=policy.publishers is Publishers.APPS, new_id=new_id
    )
    msg_id = _normalise_identity(env, routing_key, now_ms)
    _normalise_context(env, policy.origin)
    _normalise_route(env)
    normalise_replay(env)
    out_properties = normalise_properties(env, msg_id, policy.login)
    out_headers = env.headers
    for name, value in application.items():
        out_headers.setdefault(name, widen_application(value, found))
    return Relay(
        properties=out_properties,
        headers=out_headers,
        violations=tuple(found),
        stripped=tuple(map(readable, unknown)) if unknown else (),
    )
