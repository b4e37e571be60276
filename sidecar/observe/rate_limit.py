"""A log line per key at most once per interval, with how often it was held back since.

Owns the counting only: the caller reads its clock, passes the time, and writes the line.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["RateLimit"]

K = TypeVar("K", bound=Hashable)


class RateLimit(Generic[K]):
    """Lets each key through at most once per ``interval_s``; counts the rest per key."""

    __slots__ = ("_last", "_quiet", "interval_s")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[K, float] = {}  # when each key was last let through
        self._quiet: dict[K, int] = {}  # held back since then, by key

    def admit(self, key: K, now: float) -> int | None:
        """Return None to stay quiet about ``key``, else how often it was held back since."""
        seen = self._last.get(key)
        if seen is not None and now - seen < self.interval_s:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._quiet.pop(key, 0)

    def take_quiet(self) -> dict[K, int]:
        """Return the keys held back since their last line, with how often; forget them."""
        quiet, self._quiet = self._quiet, {}
        return quiet
