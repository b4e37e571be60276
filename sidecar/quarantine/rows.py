"""What an operator sees of a quarantined message, and which ones a command selects.

Pure: the rows of ``acemq-sidecar quarantine list`` and the filters of ``list`` and
``replay``, made from a quarantine copy's routing key, properties and headers (the
quarantine format of ``sidecar.settle.settlement``). The commands' I/O is in
``sidecar.quarantine.tool``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from sidecar.contract import ERROR, FIRST_SEEN, ID, ORIGIN, TYPE
from sidecar.settle import QUARANTINED_FROM

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sidecar.contract import PropertyValue
    from sidecar.wire import FieldValue

__all__ = ["QuarantinedMessage", "Selection", "format_rows", "row_of"]

_COLUMN_MAX = 60  # characters of a reason or an origin in a table cell


@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantinedMessage:
    """One row of ``quarantine list``: what the message is and why it is there."""

    position: int  # 1 for the head of the queue
    message_id: str | None
    route: str  # the quarantine copy's routing key: the route that quarantined it
    staging_queue: str | None  # where it came from (acemq-quarantined-from)
    reason: str | None
    origin: str | None
    type: str | None
    age_s: float | None  # since its envelope's first-seen, else its AMQP timestamp


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """The messages a command acts on: all that match every filter given, up to a limit."""

    route: str | None = None
    reason_contains: str | None = None
    message_id: str | None = None
    limit: int | None = None

    def matches(self, row: QuarantinedMessage) -> bool:
        """Return whether the row passes every filter (the limit is the caller's)."""
        if self.route is not None and row.route != self.route:
            return False
        if self.message_id is not None and row.message_id != self.message_id:
            return False
        return self.reason_contains is None or self.reason_contains in (row.reason or "")


def row_of(
    *,
    position: int,
    routing_key: str,
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue],
    now_ms: int,
) -> QuarantinedMessage:
    """Return the row of one quarantine copy; a header it lacks is None, never an error."""
    message_id = _text(headers.get(ID))
    if message_id is None:
        message_id = _text(properties.get("message_id"))
    return QuarantinedMessage(
        position=position,
        message_id=message_id,
        route=routing_key,
        staging_queue=_text(headers.get(QUARANTINED_FROM)),
        reason=_text(headers.get(ERROR)),
        origin=_text(headers.get(ORIGIN)) or _text(properties.get("app_id")),
        type=_text(headers.get(TYPE)) or _text(properties.get("type")),
        age_s=_age_s(headers.get(FIRST_SEEN), properties.get("timestamp"), now_ms),
    )


def format_rows(rows: Iterable[QuarantinedMessage], *, as_json: bool) -> list[str]:
    """Return the lines of ``quarantine list``: JSON lines, or a table with a header line."""
    if as_json:
        return [json.dumps(asdict(row), ensure_ascii=False, sort_keys=True) for row in rows]
    table = [("#", "ID", "ROUTE", "FROM", "AGE", "TYPE", "ORIGIN", "REASON")]
    table += [
        (
            str(row.position),
            row.message_id or "-",
            row.route,
            row.staging_queue or "-",
            _age(row.age_s),
            row.type or "-",
            _cell(row.origin),
            _cell(row.reason),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    return [
        "  ".join(
            [*(cell.ljust(width) for cell, width in zip(line, widths, strict=False)), line[-1]]
        )
        for line in table
    ]


def _text(value: object) -> str | None:
    match value:
        case str():
            return value or None
        case bytes():
            return value.decode("utf-8", "replace") or None
        case None | dict() | list():
            return None
        case _:
            return str(value)


def _age_s(first_seen: object, timestamp: object, now_ms: int) -> float | None:
    if isinstance(first_seen, int) and not isinstance(first_seen, bool) and first_seen > 0:
        return max(0.0, (now_ms - first_seen) / 1000)
    if isinstance(timestamp, int) and not isinstance(timestamp, bool) and timestamp > 0:
        return max(0.0, now_ms / 1000 - timestamp)
    return None


def _age(age_s: float | None) -> str:
    if age_s is None:
        return "-"
    for unit, seconds in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if age_s >= seconds:
            return f"{age_s / seconds:.0f}{unit}"
    return f"{age_s:.0f}s"


def _cell(text: str | None) -> str:
    if text is None:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= _COLUMN_MAX else f"{flat[: _COLUMN_MAX - 3]}..."
