"""Exponential backoff with jitter, for reconnects, route reopens and held deliveries."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter: half the step fixed, half random, capped."""

    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """Return the next delay and step up; never zero, so a failing loop cannot spin."""
        step = min(self.cap_s, self.base_s * float(2**self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return step / 2 + self.rng.uniform(0, step / 2)

    def reset(self) -> None:
        """Start again from the base delay after a success."""
        self.attempt = 0
