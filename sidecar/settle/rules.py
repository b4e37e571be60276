"""A route's rules for its deliveries' steps: made once per route, read by ``after``.

Where the route's copies go (its exchange, the quarantine exchange, its name, for the
reasons), the bounds on holding one of its deliveries, and how a returned copy is
published again (``settle.returns``): at most so many times, first after so long. Pure
data: the backoff's random draw and the route's budget of returned copies are the
relay's, asked when a step says so (``Wait.backoff_step``, ``IfReturnBudget``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.settle.settlement import Quarantine

if TYPE_CHECKING:
    from sidecar.settle.holds import HoldLimits
    from sidecar.settle.settlement import Plan

__all__ = ["Rules"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """What ``after`` needs of a route besides the delivery and the broker's answer."""

    limits: HoldLimits  # replaced as a whole once the broker took a delivery back
    exchange: str
    quarantine_exchange: str
    route: str
    # A returned copy is published again (settle.returns): at most so many times, first
    # after so long, while the route's budget says yes.
    returns_retried: int = 0
    return_delay_s: float = 0.0

    def exchange_of(self, plan: Plan) -> str:
        """Return the exchange ``plan`` is published to: the route's, or quarantine's."""
        return self.quarantine_exchange if isinstance(plan, Quarantine) else self.exchange
