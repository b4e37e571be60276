"""A copy the broker returned, published again a few times before it counts as unroutable.

A mandatory publish comes back when no binding takes its routing key. From RabbitMQ 4.2
the metadata store may be Khepri (the only one from 4.3): a binding just made through one
node of a cluster can be unseen for a moment on another, so a copy published through that
other node comes back although a binding exists. So the route publishes a returned copy
again, at most ``Rules.returns_retried`` times, first after ``Rules.return_delay_s`` and
then twice as long each time, while its budget allows (the step's ``IfReturnBudget``, so
many a second, asked by the relay: a route whose copies all come back goes on at full
speed); then the original goes to quarantine as unroutable. A returned copy reached no
queue: publishing it again duplicates nothing. Pure: no budget is taken here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.settle.settlement import Quarantine

if TYPE_CHECKING:
    from sidecar.settle.rules import Rules

__all__ = ["return_retry_delay", "unroutable_after"]


def return_retry_delay(returns: int, rules: Rules) -> float | None:
    """Return the wait before a copy returned ``returns`` times goes out again; None: never.

    The route's budget is asked after this, and only for a retry the count allows.
    """
    if returns > rules.returns_retried:
        return None
    return rules.return_delay_s * float(2 ** (returns - 1))


def unroutable_after(quarantine: Quarantine, returns: int) -> Quarantine:
    """Return the unroutable quarantine, saying how often the copy came back if more than once."""
    if returns <= 1:
        return quarantine
    retries = returns - 1
    again = "once more" if retries == 1 else f"on each of {retries} retries"
    return Quarantine(f"{quarantine.reason}; returned {again}")
