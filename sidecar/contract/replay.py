"""The replay stamps (docs/contract.md section 2): read on the way through, written by hand.

This module owns the three ``acemq-replay*`` headers: the step of normalise that keeps
them canonical, and ``stamp_replay``, which stamps a message that is sent again by hand
(the quarantine tool's replay). It must not read a clock: ``now_ms`` is passed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.contract.names import (
    INT32_MAX,
    INT32_MIN,
    LEGACY_NAMES,
    LEGACY_REPLAY_COUNT,
    REPLAY_COUNT,
    REPLAYED_AT,
    REPLAYED_FROM,
)
from sidecar.contract.readers import format_rfc3339, read_int, read_replayed_at
from sidecar.contract.verdict import Kind, Violation
from sidecar.wire import Int32

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.contract.envelope import Envelope
    from sidecar.wire import FieldValue

__all__ = ["normalise_replay", "stamp_replay"]


def normalise_replay(env: Envelope) -> None:
    """Write the three acemq-replay* stamps (legacy spellings already renamed)."""
    env.put_text(REPLAYED_FROM)
    stamp = env.contract.get(REPLAYED_AT)
    if stamp is not None:
        env.headers[REPLAYED_AT] = read_replayed_at(stamp, env.found)
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
    stamp = format_rfc3339(now_ms)
    if stamp is None:
        raise ValueError(f"now_ms {now_ms} is outside the years 1 to 9999")
    count = 0
    for name in (REPLAY_COUNT, LEGACY_REPLAY_COUNT):  # the current spelling wins (section 5)
        value = headers.get(name)
        read = None if value is None else read_int(value, name, [], low=INT32_MIN, high=INT32_MAX)
        if read is not None:
            count = max(read, 0)
            break
    stamped = {name: value for name, value in headers.items() if name not in LEGACY_NAMES}
    stamped[REPLAYED_FROM] = replayed_from
    stamped[REPLAYED_AT] = stamp
    stamped[REPLAY_COUNT] = Int32(min(count + 1, INT32_MAX))
    return stamped
