"""``normalise`` over header tables and properties decoded from arbitrary content headers.

The input's first byte chooses the route's policy (publishers, origin, the sidecar's
login), the second the length of the routing key that follows it, and the rest is a
content header payload, read as the channel reads it. A header the channel could not read
(or whose table it keeps undecodable) never reaches ``normalise``: it is quarantined.

``check`` holds docs/contract.md section 1: ``normalise`` never raises; a ``Relay`` that
goes back on the wire (``content_header`` writes it; one it refuses, text that is not
UTF-8, is quarantined as an unencodable copy), read back from those bytes and normalised
again with the same ``now_ms`` it yields the same properties and headers and no violation
but ``unreadable`` for ``acemq-replayed-at`` (idempotence); a ``Reject`` gives a reason
and carries only ``app_reserved`` pairs.
"""

from __future__ import annotations

import uuid
from itertools import count
from typing import TYPE_CHECKING

from sidecar.contract import REPLAYED_AT, Kind, Policy, Publishers, Reject, normalise
from sidecar.errors import WireError
from sidecar.wire import (
    ContentHeader,
    FieldTable,
    FieldValue,
    PropertyValue,
    UndecodableTable,
    content_header,
    parse_content_header,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["check"]

NOW_MS = 1_790_000_000_000  # the vectors' clock
_WRITE_MAX = 2**32  # frame_max for writing the copy: the size is the relay's concern


def _ids() -> Callable[[], str]:
    """Return a maker of a fresh UUID v4 per call, the same sequence for each input."""
    numbers = count(1)
    return lambda: str(uuid.UUID(int=next(numbers), version=4))


def _policy(flags: int) -> Policy:
    return Policy(
        publishers=Publishers.APPS if flags & 1 else Publishers.ACEMQ,
        origin="billing@host-2" if flags & 2 else None,
        login="guest" if flags & 4 else "sidecar",
    )


def _written(properties: Mapping[str, PropertyValue], headers: Mapping[str, FieldValue]) -> bytes:
    return content_header(properties, headers, body_size=0, frame_max=_WRITE_MAX)


def _readable(payload: bytes) -> tuple[ContentHeader, FieldTable] | None:
    """Return the header and its table as the relay reads them; None: it is quarantined."""
    try:
        header = parse_content_header(payload)
    except WireError:
        return None
    table = header.headers
    return None if isinstance(table, UndecodableTable) else (header, table or {})


def check(data: bytes) -> None:
    """Raise if ``normalise`` breaks docs/contract.md section 1 (see the module docstring)."""
    if len(data) < 2:
        return
    policy, size = _policy(data[0]), data[1]
    routing_key = data[2 : 2 + size].decode("utf-8", "surrogateescape")
    readable = _readable(data[2 + size :])
    if readable is None:
        return
    header, table = readable
    first = normalise(
        routing_key,
        header.properties,
        table,
        policy=policy,
        now_ms=NOW_MS,
        new_id=_ids(),
    )
    if isinstance(first, Reject):
        if not first.reason or any(v.kind is not Kind.APP_RESERVED for v in first.violations):
            raise AssertionError(f"a reject without its reason or with other pairs: {first!r}")
        return
    try:
        wire = _written(first.properties, first.headers)
    except WireError:
        return  # an unencodable copy (text that is not UTF-8): quarantined, never relayed
    again = parse_content_header(wire)
    if isinstance(again.headers, UndecodableTable):  # a promise broken, not a caller's type
        raise AssertionError(f"the copy's headers do not read back: {again.headers.error}")  # noqa: TRY004
    second = normalise(
        routing_key,
        again.properties,
        again.headers or {},
        policy=policy,
        now_ms=NOW_MS,
        new_id=_ids(),
    )
    if isinstance(second, Reject):
        raise AssertionError(f"the relayed copy normalised again is {second!r}")  # noqa: TRY004 - a defect, not a caller's type
    if _written(second.properties, second.headers) != wire:
        raise AssertionError(f"not idempotent:\n{first!r}\nthen\n{second!r}")
    extra = [v for v in second.violations if (v.kind, v.header) != (Kind.UNREADABLE, REPLAYED_AT)]
    if extra:
        raise AssertionError(f"normalised again, it still finds {extra}")
