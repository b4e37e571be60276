"""The canonical JSON line every interop client prints, for Python's decoded values.

Shared by the pamqp (aiormq) and pika consumers in this directory; the format itself is
described in tests/interop/canonical.py. This module imports nothing from the project: the
consumers must decode with their own client library, not with the sidecar's codec.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

PROPERTY_NAMES = (
    "app_id",
    "cluster_id",
    "content_encoding",
    "content_type",
    "correlation_id",
    "delivery_mode",
    "expiration",
    "message_id",
    "priority",
    "reply_to",
    "timestamp",
    "type",
    "user_id",
)


def text(data: bytes | bytearray) -> str | dict[str, str]:
    """Bytes as a string when they are valid UTF-8, else ``{"hex": ...}``."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": bytes(data).hex()}


def number(value: float) -> float | str:
    """A float as JSON can hold it: NaN and the infinities become strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def seconds(value: dt.datetime) -> int:
    """A decoded timestamp as whole seconds since the epoch."""
    return math.floor(value.timestamp())


def value_of(value: Any, *, bytes_kind: str) -> list[Any]:  # noqa: C901 - a case per decoded type
    """``[KIND, VALUE]`` for one decoded field value.

    ``bytes_kind`` is what this client means by a plain ``bytes``: pamqp returns it for a long
    string that is not UTF-8 (and a ``bytearray`` for a byte array), pika for both.
    """
    kind: str
    out: Any
    if value is None:
        kind, out = "void", None
    elif isinstance(value, bool):
        kind, out = "bool", value
    elif isinstance(value, int):
        kind, out = "int", int(value)
    elif isinstance(value, float):
        kind, out = "float", number(value)
    elif isinstance(value, Decimal):
        kind, out = "decimal", str(value)
    elif isinstance(value, str):
        kind, out = "string", value
    elif isinstance(value, bytearray):
        kind, out = "bytes", text(value)
    elif isinstance(value, bytes):
        kind, out = bytes_kind, text(value)
    elif isinstance(value, dt.datetime):
        kind, out = "time", seconds(value)
    elif isinstance(value, dict):
        kind, out = "table", table_of(value, bytes_kind=bytes_kind)
    elif isinstance(value, list):
        kind, out = "array", [value_of(item, bytes_kind=bytes_kind) for item in value]
    else:
        kind, out = f"unknown:{type(value).__name__}", repr(value)
    return [kind, out]


def table_of(table: dict[Any, Any] | None, *, bytes_kind: str) -> dict[str, Any]:
    """A decoded field table, names as text."""
    out: dict[str, Any] = {}
    for name, value in (table or {}).items():
        key = name if isinstance(name, str) else str(text(name))
        out[key] = value_of(value, bytes_kind=bytes_kind)
    return out


def properties_of(values: dict[str, Any]) -> dict[str, Any]:
    """The properties present and not empty (Go cannot tell an absent one from ``""``)."""
    out: dict[str, Any] = {}
    for name in PROPERTY_NAMES:
        value = values.get(name)
        if value is None or (name != "timestamp" and value in ("", 0)):
            continue
        if isinstance(value, dt.datetime):
            value = seconds(value)
        elif isinstance(value, bytes):
            value = text(value)
        out[name] = value
    return out


def success(
    queue: str, body: bytes, properties: dict[str, Any], headers: Any, *, bytes_kind: str
) -> str:
    """The line for a message the client decoded."""
    return line(
        {
            "queue": queue,
            "ok": True,
            "body": text(body),
            "properties": properties_of(properties),
            "headers": table_of(headers, bytes_kind=bytes_kind),
        }
    )


def failure(queue: str, error: BaseException | str) -> str:
    """The line for a message the client could not decode (or get)."""
    what = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return line({"queue": queue, "ok": False, "error": what[:2000]})


def line(obj: dict[str, Any]) -> str:
    """Canonical JSON: sorted keys, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
