"""The current consumer's unsettled deliveries and the ack gate of a re-consume: AckGate.

RouteConsumer's whole re-consume runs against a fake broker in test_relay_window.py; these
pin the gate's own rules: what it counts, when it closes, and that it always opens again.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.relay.ack_gate import AckGate

BOUND_S = 10.0  # a wait that should end at once, bounded so a bug fails instead of hanging


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_it_counts_the_current_consumers_deliveries_and_their_settlements() -> None:
    gate = AckGate()
    for tag in (1, 2, 3):
        gate.delivered(tag)
    gate.settled(2)
    assert gate.holding == 2
    gate.next_consumer()  # the old consumer held 1 and 3; the new one's tags start at 4
    assert gate.holding == 0
    gate.settled(1)
    gate.settled(3)
    assert gate.holding == 0  # the old consumer's settlements are not the new one's
    gate.delivered(4)
    gate.delivered(5)
    gate.settled(4)
    assert gate.holding == 1


def test_a_late_lower_tag_does_not_move_the_next_consumers_start() -> None:
    gate = AckGate()
    gate.delivered(5)
    gate.delivered(3)  # tags only grow on a channel; the largest seen is what counts
    gate.next_consumer()
    gate.delivered(6)
    gate.settled(5)  # the old consumer's
    assert gate.holding == 1


async def test_until_full_closes_the_gate_at_half_and_returns_once_full() -> None:
    gate = AckGate()
    filling = asyncio.create_task(gate.until_full(4, idle_s=BOUND_S, bound_s=BOUND_S))
    await _turns()
    gate.delivered(1)
    assert gate.opened.is_set()  # 1 of 4: not half full, acks still go
    gate.delivered(2)
    # Closed by the delivery that made it half full, before the waiting task resumes: an
    # ack made in the same turn cannot slip through.
    assert not gate.opened.is_set()
    gate.delivered(3)
    await _turns()
    assert not filling.done()
    gate.delivered(4)
    assert await asyncio.wait_for(filling, BOUND_S) is True
    assert not gate.opened.is_set()  # held until the cancel-ok
    gate.release()
    assert gate.opened.is_set()


async def test_until_full_closes_at_once_when_already_half_full() -> None:
    gate = AckGate()
    for tag in (1, 2, 3, 4):
        gate.delivered(tag)
    assert (
        await asyncio.wait_for(gate.until_full(4, idle_s=BOUND_S, bound_s=BOUND_S), BOUND_S) is True
    )
    assert not gate.opened.is_set()


async def test_until_full_gives_up_and_opens_when_deliveries_stop() -> None:
    gate = AckGate()
    for tag in (1, 2):
        gate.delivered(tag)
    assert (
        await asyncio.wait_for(gate.until_full(4, idle_s=0.01, bound_s=BOUND_S), BOUND_S) is False
    )
    assert gate.opened.is_set()
    gate.delivered(3)  # no half-full mark left behind: later deliveries close nothing
    gate.delivered(4)
    assert gate.opened.is_set()


async def test_a_cancelled_wait_opens_the_gate() -> None:
    gate = AckGate()
    gate.delivered(1)
    filling = asyncio.create_task(gate.until_full(2, idle_s=BOUND_S, bound_s=BOUND_S))
    await _turns()
    assert not gate.opened.is_set()  # half of 2 is held: closed at once
    filling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await filling
    assert gate.opened.is_set()


async def test_a_wait_cancelled_before_half_full_leaves_no_mark() -> None:
    gate = AckGate()
    filling = asyncio.create_task(gate.until_full(4, idle_s=BOUND_S, bound_s=BOUND_S))
    await _turns()
    filling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await filling
    for tag in (1, 2, 3):
        gate.delivered(tag)
    assert gate.opened.is_set()  # the half-full mark went with the wait


async def test_a_drains_hold_closes_the_gate_at_once_and_returns_once_full() -> None:
    """A drain holds every ack from the start: one would give the broker credit to send."""
    gate = AckGate()
    gate.delivered(1)
    waiting = asyncio.create_task(gate.hold_until_full(3, idle_s=60, quiet_s=0, bound_s=60))
    await _turns()
    assert not gate.opened.is_set()
    assert not waiting.done()
    gate.delivered(2)
    gate.delivered(3)
    async with asyncio.timeout(BOUND_S):
        await waiting
    assert not gate.opened.is_set()  # held until the cancel-ok: release
    gate.release()
    assert gate.opened.is_set()


@pytest.mark.parametrize(
    ("quiet_s", "bound_s"),
    [(60, 600), (0, 0)],  # quiet for the whole idle time already; no time to wait at all
    ids=["quiet", "no-bound"],
)
async def test_a_drains_hold_does_not_wait_for_a_quiet_consumer(
    quiet_s: float, bound_s: float
) -> None:
    """No delivery nor ack for the idle time already: no backlog, nothing on its way."""
    gate = AckGate()
    gate.delivered(1)
    async with asyncio.timeout(BOUND_S):
        await gate.hold_until_full(8, idle_s=60, quiet_s=quiet_s, bound_s=bound_s)
    assert not gate.opened.is_set()


async def test_a_consumer_whose_budget_stops_the_reading_closes_the_gate_before_half() -> None:
    """Three of eight and the channel holds its bytes: closed, and full once nothing comes.

    The connection reads none of its deliveries until an ack, so it can never hold half
    of its window; what the broker sent meanwhile waits unread, on the channel.
    """
    room = [True]
    gate = AckGate(lambda: room[0])
    filling = asyncio.create_task(gate.until_full(8, idle_s=0.01, bound_s=BOUND_S))
    await _turns()
    gate.delivered(1)
    gate.delivered(2)
    assert gate.opened.is_set()
    room[0] = False  # the third one's header took the channel over its budget
    gate.delivered(3)
    assert not gate.opened.is_set()  # closed by that delivery, before the waiter resumes
    assert await asyncio.wait_for(filling, BOUND_S) is True
    assert not gate.opened.is_set()  # held until the cancel is written: release
    gate.release()
    assert gate.opened.is_set()


async def test_until_full_closes_at_once_when_the_budget_already_stops_the_reading() -> None:
    gate = AckGate(lambda: False)
    gate.delivered(1)
    filling = asyncio.create_task(gate.until_full(16, idle_s=0.01, bound_s=BOUND_S))
    await _turns()
    assert not gate.opened.is_set()
    assert await asyncio.wait_for(filling, BOUND_S) is True


async def test_a_trickle_holds_acks_no_longer_than_the_bound() -> None:
    """Deliveries that keep coming, each within ``idle_s``, never fill a large window.

    Acks are held from half full; past ``bound_s`` the fill is given up and they go, so a
    short consumer_timeout never sees a delivery held for the whole trickle.
    """
    gate = AckGate()
    for tag in range(1, 4):
        gate.delivered(tag)
    filling = asyncio.create_task(gate.until_full(100, idle_s=0.2, bound_s=0.3))
    tag = 3
    async with asyncio.timeout(BOUND_S):
        while not filling.done():
            await asyncio.sleep(0.02)
            tag += 1
            gate.delivered(tag)
    assert filling.result() is False
    assert gate.opened.is_set()
    assert tag < 100
