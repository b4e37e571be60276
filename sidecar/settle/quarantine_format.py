"""The one shape of a quarantine copy, and the headers it falls back to.

A quarantine copy is the original's body and properties (a foreign ``user_id`` moved, as
for any copy), its headers as received plus the reason (``x-acemq-error``) and the
staging queue (``acemq-quarantined-from``); an envelope error already there moves to
``acemq-original-error``, a table the codec could not read travels whole as a byte array
in ``acemq-original-headers``, and of a content header too large to read only its size
is known (``acemq-original-header-bytes``). ``original_headers`` undoes it, for a replay.
When the original headers cannot be written (they outgrow the broker's frame, or do not
encode), ``fallbacks`` says what goes instead, in order: the reason alone with a note,
then both cut to fit the smallest frame a broker allows. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sidecar.contract import ERROR
from sidecar.settle.settlement import bounded, publishable_properties
from sidecar.wire import ByteArray

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.contract import PropertyValue
    from sidecar.wire import Delivery, FieldValue

__all__ = [
    "ORIGINAL_ERROR",
    "ORIGINAL_HEADERS",
    "ORIGINAL_HEADER_BYTES",
    "QUARANTINED_FROM",
    "SHORT_REASON_MAX",
    "fallbacks",
    "original_headers",
    "quarantine_copy",
    "reason_only",
]

QUARANTINED_FROM: Final = "acemq-quarantined-from"
ORIGINAL_HEADERS: Final = "acemq-original-headers"
ORIGINAL_ERROR: Final = "acemq-original-error"
ORIGINAL_HEADER_BYTES: Final = "acemq-original-header-bytes"
SHORT_REASON_MAX = 300  # a reason and a note that fit the smallest frame the broker allows


def quarantine_copy(
    delivery: Delivery, *, reason: str, queue: str, login: str | None
) -> tuple[dict[str, PropertyValue], dict[str, FieldValue]]:
    """Return the properties and headers of a delivery's quarantine copy.

    The headers are as received plus the reason and the staging queue; an envelope error
    already there moves to ``acemq-original-error``; a table the codec could not read
    travels whole, as a byte array, in ``acemq-original-headers``; of a content header too
    large to read, only its size is known, in ``acemq-original-header-bytes``.
    """
    headers: dict[str, FieldValue] = dict(delivery.headers)
    if delivery.undecodable is not None:
        headers[ORIGINAL_HEADERS] = ByteArray(delivery.undecodable.raw)
    if delivery.unread_header is not None:
        headers[ORIGINAL_HEADER_BYTES] = delivery.unread_header.size
    if ERROR in headers:  # the envelope's own error is kept, not overwritten
        headers[ORIGINAL_ERROR] = headers[ERROR]
    headers[ERROR] = bounded(reason)
    headers[QUARANTINED_FROM] = queue
    return publishable_properties(delivery.properties, headers, login=login), headers


def original_headers(headers: Mapping[str, FieldValue]) -> dict[str, FieldValue] | None:
    """Return the headers a quarantine copy's original had: ``quarantine_copy`` undone.

    The reason and the staging queue are removed and an envelope error the reason
    displaced is put back. None when the original's table could not be decoded (it
    travels as raw bytes in ``acemq-original-headers``): there is no table to restore.
    """
    if ORIGINAL_HEADERS in headers:
        return None
    original: dict[str, FieldValue] = {}
    for name, value in headers.items():
        if name == ERROR:
            if ORIGINAL_ERROR in headers:  # back in the place it had, with its own value
                original[ERROR] = headers[ORIGINAL_ERROR]
        elif name not in (QUARANTINED_FROM, ORIGINAL_ERROR):
            original[name] = value
    return original


def reason_only(reason: str, error: Exception, queue: str, *, short: bool) -> dict[str, FieldValue]:
    """Return the headers of a quarantine copy whose original headers could not be written.

    The body, the properties and the reason still go to quarantine, with a note saying why
    the headers are missing; ``short`` bounds both to fit the smallest frame a broker allows.
    """
    note = f" (the original headers could not be written: {error})"
    if short:
        text = f"{bounded(reason, SHORT_REASON_MAX)}{bounded(note, SHORT_REASON_MAX)}"
    else:
        text = f"{bounded(reason)}{note}"
    return {ERROR: text, QUARANTINED_FROM: queue}


def fallbacks(reason: str, error: Exception, queue: str) -> tuple[dict[str, FieldValue], ...]:
    """Return the headers to try, in order, once the original headers could not be written.

    ``error`` says why they could not; each fallback is smaller than the one before.
    """
    return (
        reason_only(reason, error, queue, short=False),
        reason_only(reason, error, queue, short=True),
    )
