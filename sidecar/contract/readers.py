"""Reading a value as the contract reads it (docs/contract.md sections 3 and 9).

This module owns the coercions of section 3: text from any field value, integers within a
field's range (base-10 text, RFC 3339 first-seen), the canonical replayed-at stamp, and
the text fine print of section 9 (U+FFFD for invalid UTF-8, names kept byte for byte).
Each reader counts what it finds in the list it is given and never raises; it must not
decide what a header defaults to (the steps of normalise do).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING

from sidecar.contract.names import INT64_MAX, REPLAYED_AT, WHITESPACE
from sidecar.contract.verdict import Kind, Violation
from sidecar.wire import Timestamp

if TYPE_CHECKING:
    from sidecar.wire import FieldValue

__all__ = [
    "as_utf8",
    "format_rfc3339",
    "read_int",
    "read_replayed_at",
    "read_text",
    "readable",
    "wire_bytes",
]

_BASE10 = re.compile(r"[+-]?[0-9]+")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_DIGITS = 20  # more significant digits than any 64-bit integer has


def _decode(raw: bytes) -> str:
    # Python's "replace" writes one U+FFFD per maximal invalid subpart (section 9).
    return raw.decode("utf-8", "replace")


def read_text(value: FieldValue, name: str, found: list[Violation]) -> str | None:
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


def format_rfc3339(epoch_ms: int) -> str | None:
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


def read_int(  # noqa: C901, PLR0912 - one case per row of section 3's integer rules
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
    return None if epoch_ms is None else format_rfc3339(epoch_ms)


def read_replayed_at(value: FieldValue, found: list[Violation]) -> FieldValue:
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
        stamp = None if epoch_ms is None else format_rfc3339(epoch_ms)
    if stamp is None:
        found.append(Violation(Kind.UNREADABLE, REPLAYED_AT))
        return value
    if stamp != value:
        found.append(Violation(Kind.COERCED, REPLAYED_AT))
    return stamp


def readable(text: str) -> str:
    """Return text safe to write as UTF-8: undecodable bytes of a name become escapes.

    The codec keeps a field name that is not UTF-8 as surrogate escapes (so it re-encodes
    byte for byte); a reason or a log line must not carry those.
    """
    return text if text.isascii() else wire_bytes(text).decode("utf-8", "backslashreplace")


def wire_bytes(text: str) -> bytes:
    """Return the bytes a decoded name or property stood for, surrogate escapes included."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no decoder of ours produced
        return text.encode("utf-8", "surrogatepass")


def as_utf8(text: str) -> str:
    """Read a property that was not valid UTF-8 (kept as surrogate escapes) like bytes.

    Section 3: invalid sequences become U+FFFD, so the header it fills can be written.
    """
    return _decode(wire_bytes(text))
