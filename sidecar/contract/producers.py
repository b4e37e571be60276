"""Which service produced a message, as a bounded metric label (drift by producer).

The violations metric says which route, kind and header drift; an operator needs which
*service* to fix. The producer is the service part of the envelope's ``x-acemq-origin``
as it arrived (``checkout`` of ``checkout@app-7``: the part after ``@`` is an instance or
a host, never a label), or ``app_id`` on a ``publishers: apps`` route. A label is never a
hostname or an id, and each route has at most a configured number of distinct producers:
the rest count as ``other``. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sidecar.contract.names import ORIGIN
from sidecar.contract.verdict import Publishers

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.wire import FieldValue, PropertyValue

__all__ = ["OTHER", "UNKNOWN", "ProducerLabels", "producer_of"]

OTHER = "other"  # a producer past a route's limit, or a name that cannot be a label
UNKNOWN = "unknown"  # a message that names no producer
DEFAULT_PRODUCERS_PER_ROUTE = 20

# A service name: starts with a letter, then letters, digits, '.', '_' or '-'; at most 63.
_SERVICE = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,62}")
# What is an id or a host, not a service: a UUID, a long run of hex digits, an IP address.
_NOT_A_SERVICE = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
    r"|.*[0-9a-fA-F]{16,}.*"
    r"|[0-9.]+"
)


def producer_of(
    headers: Mapping[str, FieldValue],
    properties: Mapping[str, PropertyValue],
    *,
    publishers: Publishers,
) -> str:
    """Return the producer label of a message as it arrived: a service name, or a marker.

    ``UNKNOWN`` when the message names none; ``OTHER`` when what it names cannot be a
    label (not a service name, or one that looks like an id or an address).
    """
    origin = headers.get(ORIGIN)
    name: str | None = None
    if isinstance(origin, str) and origin:
        name = origin.partition("@")[0].strip()
    elif publishers is Publishers.APPS:
        app_id = properties.get("app_id")
        name = app_id.strip() if isinstance(app_id, str) and app_id else None
    if not name:
        return UNKNOWN
    if not _SERVICE.fullmatch(name) or _NOT_A_SERVICE.fullmatch(name):
        return OTHER
    return name


class ProducerLabels:
    """Admits at most ``limit`` distinct producers per route; later ones become ``other``.

    The first producers seen keep their labels for the life of the process (a series must
    not change its meaning); ``UNKNOWN`` and ``OTHER`` do not count against the limit.
    """

    def __init__(self, limit: int = DEFAULT_PRODUCERS_PER_ROUTE) -> None:
        if limit < 0:
            raise ValueError(f"limit must be 0 or more, got {limit}")
        self.limit = limit
        self._seen: dict[str, set[str]] = {}

    def label(self, route: str, producer: str) -> str:
        """Return the label to count ``producer`` under on ``route``."""
        if producer in (UNKNOWN, OTHER):
            return producer
        seen = self._seen.setdefault(route, set())
        if producer in seen:
            return producer
        if len(seen) >= self.limit:
            return OTHER
        seen.add(producer)
        return producer

    def forget(self, route: str) -> None:
        """Forget a removed route's producers (its series are removed with it)."""
        self._seen.pop(route, None)
