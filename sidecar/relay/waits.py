"""Waiting for the first of several things to happen: the one race the shell runs often.

A channel closing, the connection dropping, a stop or a reload being requested: the
relay, the service and the adapter each wait for whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Coroutine

__all__ = ["first_of", "sleep_unless"]


async def first_of(
    *waits: Coroutine[Any, Any, Any] | asyncio.Future[Any],
) -> tuple[int, asyncio.Future[Any]]:
    """Wait until one of ``waits`` finishes, cancel the others, return the first's index.

    Among several finished at once, the earliest in argument order wins. The finished
    ones' exceptions are marked as retrieved; the caller reads the result it needs.
    """
    futures = [
        wait
        if isinstance(wait, asyncio.Future)
        else asyncio.create_task(wait, name=f"first-of:{getattr(wait, '__qualname__', i)}")
        for i, wait in enumerate(waits)
    ]
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
    for future in done:
        if not future.cancelled():
            future.exception()
    index = next(i for i, future in enumerate(futures) if future in done)
    return index, futures[index]


async def sleep_unless(stop: asyncio.Event, delay_s: float) -> None:
    """Wait for the delay, or less if ``stop`` is set: a backoff that SIGTERM cuts short."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await stop.wait()
