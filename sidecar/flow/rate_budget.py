"""A budget of so many a second, with a burst of as many: a token bucket, its clock handed in.

A route spends it on each returned copy it publishes again (``settle.returns``): a moment
of returns after a topology change fits in it, while a route whose copies all come back
(a binding deleted) spends it in the first second and quarantines the rest at full speed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RateBudget"]


@dataclass(slots=True)
class RateBudget:
    """At most ``per_s`` a second, ``per_s`` at once; ``take(now)`` spends one if there is one."""

    per_s: float
    _tokens: float = -1.0  # full on the first take
    _at: float = 0.0

    def take(self, now: float) -> bool:
        """Spend one at ``now`` (monotonic seconds) and return True, or False if none is left."""
        per_s = self.per_s
        if per_s <= 0:
            return False
        if self._tokens < 0:
            tokens = per_s
        else:
            tokens = min(per_s, self._tokens + max(0.0, now - self._at) * per_s)
        self._at = now
        if tokens < 1:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1
        return True
