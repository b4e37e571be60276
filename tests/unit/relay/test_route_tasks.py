"""A route's tasks: named, kept, waited for within a bound, and cancelled when left."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.relay.settler import Settler
from sidecar.relay.tasks import RouteTasks
from tests.fakes.route import orders_route


async def test_a_task_is_named_and_kept_until_it_ends() -> None:
    tasks = RouteTasks("orders")
    release = asyncio.Event()
    tasks.start(release.wait(), name="settle:orders:7")  # type: ignore[arg-type]
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "settle:orders:7" in names
    assert len(tasks) == 1
    release.set()
    assert await tasks.wait(1.0)
    assert len(tasks) == 0


async def test_a_wait_is_bounded_and_cancel_ends_what_is_left() -> None:
    tasks = RouteTasks("orders")
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cleaned up")

    tasks.start(forever(), name="settle:orders:1")
    assert not await tasks.wait(0.01)
    await tasks.cancel()
    assert ended == ["cleaned up"]
    assert len(tasks) == 0


async def test_a_task_that_raises_is_logged_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    tasks = RouteTasks("orders")

    async def broken() -> None:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.ERROR, logger="sidecar.relay"):
        tasks.start(broken(), name="settle:orders:3")
        assert await tasks.wait(1.0)
    assert "route orders: task settle:orders:3 ended with an error" in caplog.text


async def test_a_task_cancelled_in_the_turn_it_was_made_still_runs_its_finally() -> None:
    tasks = RouteTasks("orders")
    ended: list[str] = []

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("accounts settled")

    tasks.start(work(), name="settle:orders:9")
    await tasks.cancel()  # in the same turn: the task has not started yet
    assert ended == ["accounts settled"]


async def test_the_settler_puts_its_tasks_in_the_routes() -> None:
    """The worker's RouteTasks, handed to the settler, is the one its tasks go to."""
    orders = orders_route()
    tasks = RouteTasks("orders")
    settler = Settler(
        orders.context, state=orders.state, log=orders.log, stop=asyncio.Event(), tasks=tasks
    )
    assert settler.tasks is tasks
