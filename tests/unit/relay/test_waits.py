"""first_of: the race the relay, the service and the adapter run."""

from __future__ import annotations

import asyncio

from sidecar.relay.waits import first_of, sleep_unless


async def test_returns_the_first_finished_and_cancels_the_rest() -> None:
    """The earliest waiter wins; the others are cancelled, not left running."""
    stop = asyncio.Event()
    never = asyncio.create_task(asyncio.Event().wait())

    async def soon() -> str:
        await asyncio.sleep(0)
        return "soon"

    stop_task = asyncio.create_task(stop.wait())
    which, first = await first_of(never, soon(), stop_task)
    await asyncio.sleep(0)
    assert (which, first.result()) == (1, "soon")
    assert never.cancelled()
    assert stop_task.cancelled()


async def test_ties_go_to_the_earliest_argument() -> None:
    """Among waiters finished together, argument order decides, so callers can rank them."""
    loop = asyncio.get_running_loop()
    a, b = loop.create_future(), loop.create_future()
    b.set_result("b")
    a.set_result("a")
    assert (await first_of(a, b))[0] == 0


async def test_a_failed_waiter_is_returned_and_its_exception_retrieved() -> None:
    """A waiter that failed counts as finished; its exception does not go unretrieved."""
    loop = asyncio.get_running_loop()
    failed = loop.create_future()
    failed.set_exception(ConnectionError("gone"))
    which, first = await first_of(failed, asyncio.Event().wait())
    assert which == 0
    assert isinstance(first.exception(), ConnectionError)
    assert failed._log_traceback is False  # asyncio will not log "never retrieved"


async def test_sleep_unless_ends_early_on_stop() -> None:
    """A backoff sleep ends as soon as a stop is requested, and not before."""
    stop = asyncio.Event()
    sleeping = asyncio.create_task(sleep_unless(stop, 30))
    await asyncio.sleep(0.01)
    assert not sleeping.done()
    stop.set()
    async with asyncio.timeout(1):
        await sleeping
