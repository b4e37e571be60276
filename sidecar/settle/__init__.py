"""What becomes of one delivery, decided without I/O.

The plan, the broker's answer read (each answer to each plan: ``readings``, a table),
the holds and their bounds, a returned copy published again (``returns``), the quarantine
copy's format. Pure: no asyncio, socket, logging, clock or environment; the relay carries
out what these decide. How fast the relay may go (its window, the publish gate, the
backoff, the budget of returned copies published again) is ``sidecar.flow``'s.
"""

from __future__ import annotations

from sidecar.settle.answers import (
    PUBLISHED,
    Answer,
    Blocked,
    Confirmed,
    Failed,
    Lost,
    Refused,
    Unwritable,
)
from sidecar.settle.events import (
    Bug,
    Event,
    Held,
    Left,
    Quarantined,
    RetriedCopy,
    ReturnRetried,
    RoutedOnRetry,
    Violations,
)
from sidecar.settle.holds import (
    QUARANTINE_SHARE,
    HoldLimits,
    consumer_timeout_after,
    delivery_limit_reached,
    quarantine_deadline_s,
    read_permission_named,
    slow_confirm,
)
from sidecar.settle.quarantine_format import (
    ORIGINAL_HEADER_BYTES,
    QUARANTINED_FROM,
    fallbacks,
    original_headers,
    quarantine_copy,
    reason_only,
)
from sidecar.settle.readings import READINGS, Reading
from sidecar.settle.rules import Rules
from sidecar.settle.settlement import (
    DEFAULT_DELIVERY_LIMIT,
    DELIVERY_COUNT,
    QUEUE_COUNTERS,
    Copy,
    Outcome,
    Plan,
    Quarantine,
    Target,
    bounded,
    log_origin,
    reason_kind,
)
from sidecar.settle.step import (
    BUG_REASON,
    Ack,
    Attempt,
    DeadLetter,
    GiveBack,
    LetGo,
    Publish,
    Requeue,
    Step,
    Wait,
    WaitUnblocked,
    after,
    begin,
)

__all__ = [
    "BUG_REASON",
    "DEFAULT_DELIVERY_LIMIT",
    "DELIVERY_COUNT",
    "ORIGINAL_HEADER_BYTES",
    "PUBLISHED",
    "QUARANTINED_FROM",
    "QUARANTINE_SHARE",
    "QUEUE_COUNTERS",
    "READINGS",
    "Ack",
    "Answer",
    "Attempt",
    "Blocked",
    "Bug",
    "Confirmed",
    "Copy",
    "DeadLetter",
    "Event",
    "Failed",
    "GiveBack",
    "Held",
    "HoldLimits",
    "Left",
    "LetGo",
    "Lost",
    "Outcome",
    "Plan",
    "Publish",
    "Quarantine",
    "Quarantined",
    "Reading",
    "Refused",
    "Requeue",
    "RetriedCopy",
    "ReturnRetried",
    "RoutedOnRetry",
    "Rules",
    "Step",
    "Target",
    "Unwritable",
    "Violations",
    "Wait",
    "WaitUnblocked",
    "after",
    "begin",
    "bounded",
    "consumer_timeout_after",
    "delivery_limit_reached",
    "fallbacks",
    "log_origin",
    "original_headers",
    "quarantine_copy",
    "quarantine_deadline_s",
    "read_permission_named",
    "reason_kind",
    "reason_only",
    "slow_confirm",
]
