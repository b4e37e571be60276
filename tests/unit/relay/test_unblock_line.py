"""The unblock line: copies waiting for the broker's unblock go in the order they came."""

from __future__ import annotations

import asyncio

from sidecar.relay.unblock_line import Ticket, UnblockLine
from tests.fakes import FakeBroker


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_copies_leave_one_at_a_time_in_the_order_they_joined() -> None:
    """The next one's turn comes only when the one ahead leaves (its publish started)."""
    connection = FakeBroker().connection()
    connection.block("low on memory")
    line = UnblockLine()
    order: list[int] = []

    async def copy(n: int) -> None:
        ticket = await line.wait(connection, asyncio.Event().wait())
        assert ticket is not None
        order.append(n)
        await turns(5)  # its publish takes a few turns; nobody behind may start meanwhile
        assert order[-1] == n
        line.leave(ticket)

    tasks = [asyncio.create_task(copy(n)) for n in range(4)]
    await turns()
    assert order == []
    assert line.blocked(connection) == "low on memory"
    connection.unblock()
    assert line.blocked(connection) == "low on memory"  # copies still in line: behind them
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == [0, 1, 2, 3]
    assert line.blocked(connection) is None
    assert len(line) == 0


async def test_a_copy_that_gives_up_lets_the_next_one_go() -> None:
    """A stop or a closed channel ends the wait: out of the line, nothing published."""
    connection = FakeBroker().connection()
    connection.block("disk")
    line = UnblockLine()
    closed = asyncio.Event()
    first = asyncio.create_task(line.wait(connection, closed.wait()))
    second = asyncio.create_task(line.wait(connection, asyncio.Event().wait()))
    await turns()
    closed.set()
    assert await asyncio.wait_for(first, 5) is None
    connection.unblock()
    ticket = await asyncio.wait_for(second, 5)
    assert isinstance(ticket, Ticket)
    line.leave(ticket)
    assert len(line) == 0


async def test_blocked_again_the_head_keeps_its_place() -> None:
    """A block that returns before the head's publish: it waits again at the front."""
    connection = FakeBroker().connection()
    line = UnblockLine()
    head = await line.wait(connection, asyncio.Event().wait())
    assert head is not None
    behind = asyncio.create_task(line.wait(connection, asyncio.Event().wait()))
    await turns()
    connection.block("memory")
    again = asyncio.create_task(line.wait(connection, asyncio.Event().wait(), ticket=head))
    await turns()
    assert not again.done()
    assert not behind.done()
    connection.unblock()
    assert await asyncio.wait_for(again, 5) is head
    await turns()
    assert not behind.done()  # still behind the head, which has not left
    line.leave(head)
    line.leave(await asyncio.wait_for(behind, 5))  # type: ignore[arg-type]
    assert len(line) == 0
