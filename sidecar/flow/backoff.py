"""Exponential backoff with jitter, for reconnects, route reopens and held deliveries."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "backoff_s"]


def backoff_s(
    attempt: int, *, rng: random.Random, base_s: float = 0.5, cap_s: float = 30.0
) -> float:
    """Return the delay after ``attempt`` earlier ones: half the step fixed, half random."""
    half = min(cap_s, base_s * float(2 ** min(attempt, 32))) / 2
    return half + half * rng.random()  # rng.uniform(0, half), without its call


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter: half the step fixed, half random, capped."""

    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """Return the next delay and step up; never zero, so a failing loop cannot spin."""
        delay = backoff_s(self.attempt, rng=self.rng, base_s=self.base_s, cap_s=self.cap_s)
        self.attempt = min(self.attempt + 1, 32)
        return delay

    def reset(self) -> None:
        """Start again from the base delay after a success."""
        self.attempt = 0
