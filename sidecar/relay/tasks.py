"""A route's tasks: every one it starts is named, kept and waited for by the route.

The route's deliveries that cannot be settled from a frame handler go on as tasks
(``Settling.run``), each named ``settle:<route>:<delivery tag>``. They are kept
here, not left to the event loop, so that a drain can wait for them (``wait``), bounded
by its grace period, and what is left after it is cancelled (``cancel``) rather than
outliving the route. A task that ends with an exception other than a cancellation has
it logged: a settle task catches its own, so this is a bug.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Coroutine

__all__ = ["RouteTasks"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class RouteTasks:
    """The named tasks of one route; see the module docstring."""

    __slots__ = ("_route", "_tasks")

    def __init__(self, route: str) -> None:
        self._route = route
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``work`` as a task of the route's, named ``name``."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error(
                "route %s: task %s ended with an error",
                self._route,
                task.get_name(),
                exc_info=error,
            )

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every task to end; True when none is left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(timeout_s, 0.0))
        return not self._tasks

    async def cancel(self) -> None:
        """Cancel the tasks left, and wait until they have ended.

        Each task made in this turn of the loop first takes its first step, so that a
        cancellation meets it inside its ``try`` and its ``finally`` settles its accounts.
        """
        await asyncio.sleep(0)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
