"""A route's rules for its deliveries' steps: made once per route, read by ``after``.

Where the route's copies go (its exchange, the quarantine exchange, its name, for the
reasons), the bounds on holding one of its deliveries, and its backoff: the delay before
a held copy is published again, after so many holds. The backoff is the route's random
source, handed in so that the step stays pure; the step draws from it only when the
answer may hold the delivery. A returned copy may be published again a few times
(``settle.returns``) while the route's budget allows, also handed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.settle.holds import HoldLimits

__all__ = ["Rules"]


def _never() -> bool:
    """Say no: the budget of a route that publishes no returned copy again."""
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """What ``after`` needs of a route besides the delivery and the broker's answer."""

    limits: HoldLimits  # replaced as a whole once the broker took a delivery back
    exchange: str
    quarantine_exchange: str
    route: str
    backoff: Callable[[int], float]  # the delay after so many holds (random: drawn once)
    # A returned copy is published again (settle.returns): at most so many times, first
    # after so long, while the route's budget says yes.
    returns_retried: int = 0
    return_delay_s: float = 0.0
    may_retry_return: Callable[[], bool] = _never
