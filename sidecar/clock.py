"""The clocks the shell reads, passed in so that the pure core and the tests never read one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Clock"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Clock:
    """Wall time for the contract (epoch milliseconds), monotonic seconds for timing."""

    now_ms: Callable[[], int]
    monotonic: Callable[[], float]

    @classmethod
    def system(cls) -> Clock:
        """Return the process's real clocks."""
        return cls(now_ms=lambda: time.time_ns() // 1_000_000, monotonic=time.monotonic)
