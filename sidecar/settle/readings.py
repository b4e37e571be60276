"""What each broker answer means for each plan: the settle step's table, kept as data.

``READINGS`` maps the answer's kind and the plan's kind (the copy for the target, or the
original for quarantine) to a ``Reading``, as h11 keeps its transitions: every pair has
one entry, and the tests walk the table. ``settle.step.after`` looks the pair up and
builds the next step from the reading; the reasons and bounds each reading needs are
``settlement``'s and ``holds``'s. Pure: no I/O.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from sidecar.settle.answers import (
    Blocked,
    Confirmed,
    Failed,
    Lost,
    Nacked,
    Refused,
    Returned,
    Unwritable,
)
from sidecar.settle.holds import after_refusal
from sidecar.settle.settlement import (
    Hold,
    Quarantine,
    after_publish,
    unencodable,
    unwritable_quarantine,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.settle.answers import Answer
    from sidecar.settle.rules import Rules
    from sidecar.settle.settlement import Decision, Plan

__all__ = [
    "ANSWER_KINDS",
    "LOST_CHANNEL",
    "PLAN_KINDS",
    "READINGS",
    "Reading",
    "answer_kind",
    "decision_for",
    "plan_kind",
]

LOST_CHANNEL = "the publish channel closed; retrying on a new one"


class Reading(Enum):
    """What an answer to a publish means for the delivery."""

    DONE = "the copy was taken: ack, and count the plan's outcome"
    UNROUTABLE = "nothing takes the copy's routing key: the original to quarantine"
    NACKED = "the target refused the copy for now: hold, publish again (may duplicate)"
    UNTAKEN = "the quarantine exchange returned or nacked its copy: hold, publish again"
    REFUSED = "the broker closed the channel: its code and the channel say (after_refusal)"
    LET_GO = "a stop or the connection took the channel: leave the delivery to the broker"
    LOST = "another publish's refusal took the shared channel: hold (may duplicate)"
    UNENCODABLE = "the copy cannot be written: the original to quarantine"
    UNWRITABLE = "the quarantine copy cannot be written either: dead-letter"
    BUG = "a bug while publishing the copy: the original to quarantine, logged"
    BUG_IN_QUARANTINE = "a bug while publishing the quarantine copy: give the delivery back"
    BLOCKED = "the broker blocks the connection: wait for the unblock, publish nothing"


ANSWER_KINDS: Final = (
    "confirmed",
    "returned",
    "nacked",
    "refused",
    "lost, gone",
    "lost",
    "unwritable",
    "failed",
    "blocked",
)
PLAN_KINDS: Final = ("copy", "quarantine")

READINGS: Final[Mapping[tuple[str, str], Reading]] = MappingProxyType(
    {
        ("confirmed", "copy"): Reading.DONE,
        ("confirmed", "quarantine"): Reading.DONE,
        ("returned", "copy"): Reading.UNROUTABLE,
        ("returned", "quarantine"): Reading.UNTAKEN,
        ("nacked", "copy"): Reading.NACKED,
        ("nacked", "quarantine"): Reading.UNTAKEN,
        ("refused", "copy"): Reading.REFUSED,
        ("refused", "quarantine"): Reading.REFUSED,
        ("lost, gone", "copy"): Reading.LET_GO,
        ("lost, gone", "quarantine"): Reading.LET_GO,
        ("lost", "copy"): Reading.LOST,
        ("lost", "quarantine"): Reading.LOST,
        ("unwritable", "copy"): Reading.UNENCODABLE,
        ("unwritable", "quarantine"): Reading.UNWRITABLE,
        ("failed", "copy"): Reading.BUG,
        ("failed", "quarantine"): Reading.BUG_IN_QUARANTINE,
        ("blocked", "copy"): Reading.BLOCKED,
        ("blocked", "quarantine"): Reading.BLOCKED,
    }
)

_KINDS: Final[Mapping[type, str]] = MappingProxyType(
    {
        Confirmed: "confirmed",
        Returned: "returned",
        Nacked: "nacked",
        Refused: "refused",
        Lost: "lost",
        Unwritable: "unwritable",
        Failed: "failed",
        Blocked: "blocked",
    }
)


def answer_kind(answer: Answer) -> str:
    """Return the answer's kind in the table: a lost channel that went with a stop apart."""
    if isinstance(answer, Lost) and answer.gone:
        return "lost, gone"
    return _KINDS[type(answer)]


def plan_kind(plan: Plan) -> str:
    """Return the plan's kind in the table."""
    return "quarantine" if isinstance(plan, Quarantine) else "copy"


def decision_for(
    reading: Reading, answer: Answer, plan: Plan, rules: Rules, *, alone: bool
) -> Decision:
    """Return what settlement decides for a reading that ends in a decision.

    Not for ``LET_GO``, ``BUG``, ``BUG_IN_QUARANTINE`` or ``BLOCKED``, which the step turns
    into its next step itself.
    """
    if isinstance(answer, (Confirmed, Returned, Nacked)):  # DONE, UNROUTABLE, NACKED, UNTAKEN
        return after_publish(
            answer.published,
            plan,
            exchange=rules.exchange,
            quarantine_exchange=rules.quarantine_exchange,
            route=rules.route,
        )
    if isinstance(answer, Refused):
        quarantine = isinstance(plan, Quarantine)
        where = rules.quarantine_exchange if quarantine else rules.exchange
        return after_refusal(answer.code, answer.text, plan, alone=alone, exchange=where)
    if reading is Reading.LOST:
        # The shared channel was closed by another publish's refusal before or while this
        # one went out: it may have been routed, or not.
        return Hold(LOST_CHANNEL, may_duplicate=True)
    if isinstance(answer, Unwritable):
        if isinstance(plan, Quarantine):
            return unwritable_quarantine(plan.reason, answer.error)
        return unencodable(answer.error)
    raise ValueError(f"{reading.name} is not read into a decision")
