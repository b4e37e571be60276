"""The AceMQ envelope contract (docs/contract.md section 1): one message in, one verdict out.

This module owns every rule of docs/contract.md and nothing else. It is pure: no I/O, no clock
(``now_ms`` is passed in), no randomness except the injected ``new_id``, and it never
raises, whatever the header table holds. Values are the typed field values of
``sidecar.wire``; the adapter turns them into bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping  # noqa: TC003 - see the note on the wire import
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, TypeVar

# Mapping and FieldValue are read at run time too: the compiled build (scripts/compile)
# builds the dataclasses below from their annotations.
from sidecar.wire import (
    INT_BOUNDS,
    MAX_DEPTH,
    FieldValue,
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
    from collections.abc import Callable

__all__ = [
    "CONTRACT_VERSION",
    "Kind",
    "Policy",
    "PropertyValue",
    "Publishers",
    "Reject",
    "Relay",
    "Verdict",
    "Violation",
    "move_user_id",
    "normalise",
    "stamp_replay",
]

CONTRACT_VERSION = "1.2"


class Publishers(StrEnum):
    """Who feeds a staging queue (docs/contract.md section 4)."""

    ACEMQ = "acemq"
    APPS = "apps"


class Kind(StrEnum):
    """The closed set of violation kinds (docs/contract.md section 6); values are metric labels."""

    DEFAULTED = "defaulted"
    NULL_VALUE = "null_value"
    EMPTY_VALUE = "empty_value"
    COERCED = "coerced"
    UNREADABLE = "unreadable"
    OUT_OF_RANGE = "out_of_range"
    LEGACY_NAME = "legacy_name"
    UNKNOWN_RESERVED = "unknown_reserved"
    APP_RESERVED = "app_reserved"
    MIRROR = "mirror"
    MOVED = "moved"
    UNPORTABLE = "unportable"


class Violation(NamedTuple):
    """One rule that fired: its kind and the header (or property) label it fired on."""

    kind: Kind
    header: str


PropertyValue: TypeAlias = str | int


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What normalise needs to know about the route and the sidecar."""

    publishers: Publishers = Publishers.ACEMQ
    origin: str | None = None
    # The name the broker knows the sidecar by, which every user_id must equal; None when
    # it is not known (EXTERNAL: the client certificate's), so no user_id may stay.
    login: str | None = "guest"


@dataclass(frozen=True, slots=True, kw_only=True)
class Relay:
    """Publish the message with these properties and headers; the body is unchanged."""

    properties: Mapping[str, PropertyValue]
    headers: Mapping[str, FieldValue]
    violations: tuple[Violation, ...]
    # The unknown x-acemq- names stripped: for the log, never for a metric label (section 6).
    stripped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """Do not publish; quarantine the original with this reason."""

    reason: str
    violations: tuple[Violation, ...]


Verdict: TypeAlias = Relay | Reject

# --- names ---------------------------------------------------------------------------

RESERVED_PREFIX = "x-acemq-"
ID = "x-acemq-id"
TYPE = "x-acemq-type"
VERSION = "x-acemq-version"
CORRELATION = "x-acemq-correlation"
ATTEMPT = "x-acemq-attempt"
FIRST_SEEN = "x-acemq-first-seen"
CAUSATION = "x-acemq-causation"
ORIGIN = "x-acemq-origin"
ERROR = "x-acemq-error"
CLAIM = "x-acemq-claim"
ROUTE = "x-acemq-route"
ROUTE_POSITION = "x-acemq-route-position"
ROUTE_ID = "x-acemq-route-id"
REPLAYED_FROM = "acemq-replayed-from"
REPLAYED_AT = "acemq-replayed-at"
REPLAY_COUNT = "acemq-replay-count"
REPLY_TO = "acemq-reply-to"
ORIGINAL_USER_ID = "acemq-original-user-id"
LEGACY_REPLAY_COUNT = "x-acemq-replay-count"
LEGACY_NAMES = {
    "x-acemq-replayed-from": REPLAYED_FROM,
    "x-acemq-replayed-at": REPLAYED_AT,
    LEGACY_REPLAY_COUNT: REPLAY_COUNT,
}
# Every header section 2 normalises plus the legacy spellings: the contract's headers.
CONTRACT_HEADERS = frozenset(
    {
        ID,
        TYPE,
        VERSION,
        CORRELATION,
        ATTEMPT,
        FIRST_SEEN,
        CAUSATION,
        ORIGIN,
        ERROR,
        CLAIM,
        ROUTE,
        ROUTE_POSITION,
        ROUTE_ID,
        REPLAYED_FROM,
        REPLAYED_AT,
        REPLAY_COUNT,
        REPLY_TO,
        *LEGACY_NAMES,
    }
)
UNKNOWN_RESERVED_LABEL = "x-acemq-*"
APP_LABEL = "app"
DEFAULT_TYPE = "message"

# An AMQP short string (message_id, reply_to) holds at most this many bytes (section 2).
SHORT_STRING_MAX = 255

INT32_MIN, INT32_MAX = INT_BOUNDS[Int32]
INT64_MIN, INT64_MAX = INT_BOUNDS[Int64]
# docs/contract.md section 9: whitespace is ASCII space, TAB, CR, LF, VT, FF.
WHITESPACE = " \t\r\n\x0b\x0c"
_BASE10 = re.compile(r"[+-]?[0-9]+")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_DIGITS = 20  # more significant digits than any 64-bit integer has


# --- reading values (section 3) ----------------------------------------------------------


def _decode(raw: bytes) -> str:
    # Python's "replace" writes one U+FFFD per maximal invalid subpart (section 9).
    return raw.decode("utf-8", "replace")


def _read_text(value: FieldValue, name: str, found: list[Violation]) -> str | None:
    """Read a text field; a value that cannot be read is counted and reads as absent."""
    match value:
        case str():
            return value
        case bytes():  # a non-UTF-8 long string or a byte array
            found.append(Violation(Kind.COERCED, name))
            return _decode(value)
        case bool():
            found.append(Violation(Kind.COERCED, name))
            return "true" if value else "false"
        case Timestamp():
            pass
        case int():
            found.append(Violation(Kind.COERCED, name))
            return str(int(value))
        case _:
            pass
    found.append(Violation(Kind.UNREADABLE, name))
    return None


def _parse_base10(text: str) -> int | None:
    stripped = text.strip(WHITESPACE)
    if _BASE10.fullmatch(stripped) is None:
        return None
    if len(stripped.lstrip("+-").lstrip("0")) > _MAX_DIGITS:
        # Beyond any field's range; int() would also refuse thousands of digits.
        return INT64_MAX + 1
    return int(stripped)


def _parse_rfc3339_ms(text: str) -> int | None:
    """Return epoch milliseconds of an RFC 3339 time, fraction truncated; None if not one."""
    # No trimming: section 3 allows surrounding whitespace for base-10 integers only.
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    seconds_field = int(second)
    if seconds_field == 60 and hour == "23" and minute == "59":
        seconds_field = 59  # a leap second, read as Java's Instant.parse reads it
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), seconds_field, tzinfo=UTC
        )
    except ValueError:
        return None
    offset_minutes = 0
    if zulu is None:
        if int(off_h) > 23 or int(off_m) > 59:
            return None
        offset_minutes = int(off_h) * 60 + int(off_m)
        if sign == "-":
            offset_minutes = -offset_minutes
    millis = int((fraction or "0")[:3].ljust(3, "0"))
    delta = moment - _EPOCH
    seconds = delta.days * 86_400 + delta.seconds - offset_minutes * 60
    return seconds * 1000 + millis


def _format_rfc3339(epoch_ms: int) -> str | None:
    """Write epoch milliseconds as YYYY-MM-DDTHH:MM:SS[.fff]Z; None outside years 1-9999."""
    try:
        moment = _EPOCH + timedelta(milliseconds=epoch_ms)
    except OverflowError:
        return None
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    millis = moment.microsecond // 1000
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


def _read_int(  # noqa: C901, PLR0912 - one case per row of section 3's integer rules
    value: FieldValue,
    name: str,
    found: list[Violation],
    *,
    low: int,
    high: int,
    is_first_seen: bool = False,
) -> int | None:
    """Read an integer field; a value that cannot be read is counted and reads as absent."""
    number: int | None = None
    coerced = True
    match value:
        case bool():
            pass
        case Timestamp():
            if is_first_seen:
                number = int(value) * 1000
        case int():
            number, coerced = int(value), False
        case str() | bytes():
            text = value if isinstance(value, str) else _decode(value)
            number = _parse_base10(text)
            if number is None and is_first_seen and isinstance(value, str):
                # Section 9: an RFC 3339 first-seen is accepted only as a string.
                number = _parse_rfc3339_ms(text)
        case float():
            if math.isfinite(value):
                number = math.trunc(value)
        case Decimal():
            if value.is_finite() and value.adjusted() <= _MAX_DIGITS:
                number = int(value)
        case _:
            pass
    if number is None or not low <= number <= high:
        found.append(Violation(Kind.UNREADABLE, name))
        return None
    if coerced:
        found.append(Violation(Kind.COERCED, name))
    return number


_CACHED_STAMP_CHARS = 64  # real stamps are ~20-35 characters; junk is not cached


@lru_cache(maxsize=1024)
def _restamp(text: str) -> str | None:
    """Return the canonical form of a textual replay stamp; None when it is unreadable.

    Cached: a replayed batch carries the same few stamps, and parsing one costs more than
    the rest of a canonical message.
    """
    epoch_ms = _parse_base10(text)
    if epoch_ms is None:
        epoch_ms = _parse_rfc3339_ms(text)
    return None if epoch_ms is None else _format_rfc3339(epoch_ms)


def _read_replayed_at(value: FieldValue, found: list[Violation]) -> FieldValue:
    """Return the canonical replayed-at stamp, or the value unchanged when it is unreadable."""
    epoch_ms: int | None = None
    text: str | None = None
    match value:
        case bool():
            pass
        case Timestamp():
            epoch_ms = int(value) * 1000
        case int():
            epoch_ms = int(value)
        case str():
            text = value
        case bytes():
            text = _decode(value)
        case _:
            pass
    if text is not None:
        stamp = _restamp(text) if len(text) <= _CACHED_STAMP_CHARS else _restamp.__wrapped__(text)
    else:
        stamp = None if epoch_ms is None else _format_rfc3339(epoch_ms)
    if stamp is None:
        found.append(Violation(Kind.UNREADABLE, REPLAYED_AT))
        return value
    if stamp != value:
        found.append(Violation(Kind.COERCED, REPLAYED_AT))
    return stamp


# --- the steps of normalise ------------------------------------------------------------


def readable(text: str) -> str:
    """Return text safe to write as UTF-8: undecodable bytes of a name become escapes.

    The codec keeps a field name that is not UTF-8 as surrogate escapes (so it re-encodes
    byte for byte); a reason or a log line must not carry those.
    """
    return text if text.isascii() else _wire_bytes(text).decode("utf-8", "backslashreplace")


def _wire_bytes(text: str) -> bytes:
    """Return the bytes a decoded name or property stood for, surrogate escapes included."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no decoder of ours produced
        return text.encode("utf-8", "surrogatepass")


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


def _widen_application(value: FieldValue, found: list[Violation]) -> FieldValue:
    """Return an application header with section 7's unsigned tags widened, counting it once."""
    widened = _widen(value, 0)
    if isinstance(widened, _Unchanged):
        return value
    found.append(Violation(Kind.UNPORTABLE, APP_LABEL))
    return widened


class _Unchanged:
    """The marker _widen returns for a value that holds no unsigned integer tag."""


_UNCHANGED = _Unchanged()


def _widen(value: FieldValue, depth: int) -> FieldValue | _Unchanged:
    """Widen B, u, i to I, I, l at any depth (section 7); _UNCHANGED when nothing was.

    A container deeper than the codec admits is left as it is: it cannot be encoded anyway,
    and the encoder says why, so normalise still never raises on a table that holds itself.
    """
    match value:
        case UInt8():
            return Int32(value)
        case UInt16():
            return Int32(value)
        case UInt32():
            return Int64(value)
        case dict() if depth < MAX_DEPTH:
            return _widen_table(value, depth)
        case list() if depth < MAX_DEPTH:
            return _widen_array(value, depth)
        case _:
            return _UNCHANGED


def _widen_table(value: dict[str, FieldValue], depth: int) -> FieldValue | _Unchanged:
    table: dict[str, FieldValue] | None = None  # copied at the first change only
    for key, item in value.items():
        new = _widen(item, depth + 1)
        if not isinstance(new, _Unchanged):
            if table is None:
                table = dict(value)
            table[key] = new
    return _UNCHANGED if table is None else table


def _widen_array(value: list[FieldValue], depth: int) -> FieldValue | _Unchanged:
    items: list[FieldValue] | None = None  # copied at the first change only
    for index, item in enumerate(value):
        new = _widen(item, depth + 1)
        if not isinstance(new, _Unchanged):
            if items is None:
                items = list(value)
            items[index] = new
    return _UNCHANGED if items is None else items


def _rename_legacy(contract: dict[str, FieldValue], found: list[Violation]) -> None:
    """Rewrite the legacy x-acemq-replayed-* spellings; the acemq- spelling wins."""
    for legacy, current in LEGACY_NAMES.items():
        if legacy not in contract:
            continue
        value = contract.pop(legacy)
        found.append(Violation(Kind.LEGACY_NAME, legacy))
        contract.setdefault(current, value)


def _property_text(properties: Mapping[str, PropertyValue], name: str) -> str | None:
    value = properties.get(name)
    if not isinstance(value, str) or not value:
        return None
    return value if value.isascii() else _as_utf8(value)


def _as_utf8(text: str) -> str:
    """Read a property that was not valid UTF-8 (kept as surrogate escapes) like bytes.

    Section 3: invalid sequences become U+FFFD, so the header it fills can be written.
    """
    return _decode(_wire_bytes(text))


_T = TypeVar("_T", str, int)

# The width classes an integer header arrives in; bool and Timestamp are not among them.
_INTEGER_TYPES = frozenset({Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64, int})


class _Envelope:
    """One message being normalised: the contract values read so far and what they yield.

    Each read counts what it finds in ``found``; a header that could not be read is
    remembered in ``unread`` so that its default is not counted a second time.
    """

    __slots__ = ("apps", "contract", "found", "headers", "new_id", "properties", "unread")

    def __init__(
        self,
        contract: dict[str, FieldValue],
        properties: Mapping[str, PropertyValue],
        found: list[Violation],
        *,
        apps: bool,
        new_id: Callable[[], str],
    ) -> None:
        self.contract = contract
        self.properties = properties
        self.found = found
        self.apps = apps
        self.new_id = new_id
        self.headers: dict[str, FieldValue] = {}
        self.unread: set[str] = set()

    def text(self, name: str) -> str | None:
        """Read a text header; None when absent or unreadable."""
        value = self.contract.get(name)
        if value is None or type(value) is str:  # the common case, first
            return value
        text = _read_text(value, name, self.found)
        if text is None:
            self.unread.add(name)
        return text

    def integer(self, name: str, *, low: int, high: int, is_first_seen: bool = False) -> int | None:
        """Read an integer header; None when absent or unreadable."""
        value = self.contract.get(name)
        if value is None:
            return None
        if type(value) in _INTEGER_TYPES and low <= value <= high:  # type: ignore[operator]
            return value  # type: ignore[return-value]
        number = _read_int(value, name, self.found, low=low, high=high, is_first_seen=is_first_seen)
        if number is None:
            self.unread.add(name)
        return number

    def default(self, name: str, value: _T) -> _T:
        """Return a default, counted unless the header was unreadable (counted already)."""
        if name not in self.unread:
            self.found.append(Violation(Kind.DEFAULTED, name))
        return value

    def from_property(self, name: str, prop: str) -> str | None:
        """Under apps, fill an absent or unreadable header from its AMQP property."""
        if not self.apps:
            return None
        value = _property_text(self.properties, prop)
        return None if value is None else self.default(name, value)

    def at_least(self, name: str, value: int, low: int) -> int:
        """Raise a value below the field's floor to the floor (out_of_range)."""
        if value < low:
            self.found.append(Violation(Kind.OUT_OF_RANGE, name))
            return low
        return value

    def put_text(self, name: str) -> None:
        """Write an optional text header when it holds text."""
        value = self.text(name)
        if value is not None:
            self.headers[name] = value


def _normalise_identity(env: _Envelope, routing_key: str, now_ms: int) -> str:
    """Write id, type, version, correlation, attempt and first-seen; return the id."""
    headers = env.headers
    msg_id = env.text(ID)
    if msg_id is None:
        msg_id = env.default(ID, _property_text(env.properties, "message_id") or env.new_id())
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


def _apps_first_seen(env: _Envelope) -> int | None:
    """Under apps, the AMQP timestamp (seconds) in milliseconds, when it is usable."""
    stamp = env.properties.get("timestamp") if env.apps else None
    if type(stamp) is int and stamp <= INT64_MAX // 1000:
        return stamp * 1000  # a zero then counts out_of_range and becomes now_ms
    return None


def _normalise_context(env: _Envelope, origin: str | None) -> None:
    """Write causation, origin, error and claim when they hold text."""
    env.put_text(CAUSATION)
    # Origin: header, then (apps) app_id, then the configured origin, which is
    # configuration rather than drift and so is not counted (section 9).
    value = env.text(ORIGIN) or env.from_property(ORIGIN, "app_id") or origin
    if value:
        env.headers[ORIGIN] = value
    env.put_text(ERROR)
    env.put_text(CLAIM)


def _normalise_route(env: _Envelope) -> None:
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


def _normalise_replay(env: _Envelope) -> None:
    """Write the three acemq-replay* stamps (legacy spellings already renamed)."""
    env.put_text(REPLAYED_FROM)
    stamp = env.contract.get(REPLAYED_AT)
    if stamp is not None:
        env.headers[REPLAYED_AT] = _read_replayed_at(stamp, env.found)
    count = env.integer(REPLAY_COUNT, low=INT32_MIN, high=INT32_MAX)
    if count is None:
        return
    if count <= 0:
        env.found.append(Violation(Kind.OUT_OF_RANGE, REPLAY_COUNT))
        return
    env.headers[REPLAY_COUNT] = Int32(count)


def stamp_replay(
    headers: Mapping[str, FieldValue], *, replayed_from: str, now_ms: int
) -> dict[str, FieldValue]:
    """Return the headers of a message sent again by hand, stamped as a replay (section 2).

    ``acemq-replayed-from`` names where it was replayed from, ``acemq-replayed-at`` is
    ``now_ms`` in the canonical RFC 3339 form, and ``acemq-replay-count`` is one more than
    the count the message carried (read as section 3 reads it, in either spelling; an
    unreadable or non-positive count counts as none). The legacy spellings are removed:
    the new stamps replace them. Every other header is kept as it is, in its place.
    """
    stamp = _format_rfc3339(now_ms)
    if stamp is None:
        raise ValueError(f"now_ms {now_ms} is outside the years 1 to 9999")
    count = 0
    for name in (REPLAY_COUNT, LEGACY_REPLAY_COUNT):  # the current spelling wins (section 5)
        value = headers.get(name)
        read = None if value is None else _read_int(value, name, [], low=INT32_MIN, high=INT32_MAX)
        if read is not None:
            count = max(read, 0)
            break
    stamped = {name: value for name, value in headers.items() if name not in LEGACY_NAMES}
    stamped[REPLAYED_FROM] = replayed_from
    stamped[REPLAYED_AT] = stamp
    stamped[REPLAY_COUNT] = Int32(min(count + 1, INT32_MAX))
    return stamped


def _normalise_properties(
    env: _Envelope, msg_id: str, login: str | None
) -> dict[str, PropertyValue]:
    """Mirror message_id and reply_to from the headers; move a foreign user_id."""
    found, headers = env.found, env.headers
    properties = dict(env.properties)
    if properties.get("message_id") != msg_id and _fits_short_string(msg_id):
        found.append(Violation(Kind.MIRROR, "message_id"))
        properties["message_id"] = msg_id

    reply_to = env.text(REPLY_TO)
    if reply_to is None:
        from_property = _property_text(properties, "reply_to")
        if from_property is not None:
            reply_to = env.default(REPLY_TO, from_property)
    if reply_to is not None:
        headers[REPLY_TO] = reply_to
        if properties.get("reply_to") != reply_to and _fits_short_string(reply_to):
            found.append(Violation(Kind.MIRROR, "reply_to"))
            properties["reply_to"] = reply_to

    moved = move_user_id(properties, headers, login=login)
    if moved is not None:
        found.append(Violation(moved, "user_id"))
    return properties


def _fits_short_string(text: str) -> bool:
    """Whether text fits an AMQP short string property; a longer one stays in its header."""
    # Four bytes per character at most: only long text needs encoding to know.
    return len(text) * 4 <= SHORT_STRING_MAX or len(_wire_bytes(text)) <= SHORT_STRING_MAX


def move_user_id(
    properties: dict[str, PropertyValue], headers: dict[str, FieldValue], *, login: str | None
) -> Kind | None:
    """Remove a user_id the broker would refuse from our login (section 2), in place.

    RabbitMQ refuses a publish whose user_id is not the publishing login, so any other
    value moves to ``acemq-original-user-id`` (``moved``) and an empty one is dropped
    (``empty_value``). ``login`` None: the name the broker knows us by is not known (an
    EXTERNAL login without a user), so every user_id moves. Return the kind, or None when
    user_id may stay.
    """
    user_id = properties.get("user_id")
    if user_id is None or (login is not None and user_id == login):
        return None
    del properties["user_id"]
    if user_id == "":
        return Kind.EMPTY_VALUE
    headers[ORIGINAL_USER_ID] = _as_utf8(str(user_id))
    return Kind.MOVED


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
    env = _Envelope(
        contract, properties, found, apps=policy.publishers is Publishers.APPS, new_id=new_id
    )
    msg_id = _normalise_identity(env, routing_key, now_ms)
    _normalise_context(env, policy.origin)
    _normalise_route(env)
    _normalise_replay(env)
    out_properties = _normalise_properties(env, msg_id, policy.login)
    out_headers = env.headers
    for name, value in application.items():
        out_headers.setdefault(name, _widen_application(value, found))
    return Relay(
        properties=out_properties,
        headers=out_headers,
        violations=tuple(found),
        stripped=tuple(map(readable, unknown)) if unknown else (),
    )
