"""The confirms a route's frame handlers wait for, and the sweep that finds the slow ones.

A copy published from a frame handler (``Settling.publish_now``) has no task or timer of
its own: it is listed here, oldest first, until its confirm comes, and one sweep per route
every ``SWEEP_S`` holds each delivery whose confirm is slower than the limit (its
``slow``), once. A copy published from a task has the client's own timer instead
(``slow_after_s``): either way the same ``Settling.slow`` holds the delivery.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["SWEEP_S", "SlowConfirms"]

# How often a route looks for confirms slower than the limit: a slow one is held between
# the limit and the limit plus this.
SWEEP_S: Final = 5.0


class _Awaited(Protocol):
    def slow(self) -> None: ...


class SlowConfirms:
    """One route's copies awaiting a confirm from a frame handler; see the module docstring."""

    __slots__ = ("_due", "_monotonic", "_sent", "limit_s", "sweep_s")

    def __init__(
        self, *, limit_s: float, monotonic: Callable[[], float], sweep_s: float = SWEEP_S
    ) -> None:
        self.limit_s = limit_s  # a confirm slower than this holds its delivery
        self.sweep_s = sweep_s
        self._monotonic = monotonic
        self._sent: dict[_Awaited, float] = {}  # by when it was sent: oldest first
        self._due: asyncio.TimerHandle | None = None

    def sent(self, awaited: _Awaited) -> None:
        """List a copy just published; the sweep starts with the first."""
        self._sent[awaited] = self._monotonic()
        if self._due is None:
            self._due = asyncio.get_running_loop().call_later(self.sweep_s, self._sweep)

    def answered(self, awaited: _Awaited) -> None:
        """Forget a copy that has its answer."""
        self._sent.pop(awaited, None)

    def _sweep(self) -> None:
        """Hold the deliveries whose confirm is slower than the limit (``slow`` is once each)."""
        self._due = None
        now = self._monotonic()
        for awaited, sent in self._sent.items():
            if now - sent < self.limit_s:
                break
            awaited.slow()
        if self._sent:
            self._due = asyncio.get_running_loop().call_later(self.sweep_s, self._sweep)
