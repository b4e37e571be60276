"""The publish lane's channels: shared, reopened, retired after a nack, closed when idle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

from sidecar.amqp import RelayConnection
from sidecar.delivery import PublishOutcome
from sidecar.publish_lane import PublishLane
from tests.unit.fake_publish import Answer, Publish, PublishRecorder


@dataclass(eq=False)
class Channel(PublishRecorder):
    """A channel that knows whether it is open, and confirms (the gate's probe)."""

    number: int
    is_open: bool = True

    async def answer(self, publish: Publish) -> Answer:
        """Confirmed."""
        del publish
        return PublishOutcome.CONFIRMED

    async def close(self) -> None:
        """Close it."""
        self.is_open = False


@dataclass
class Connection:
    """Opens numbered fake channels."""

    opened: list[Channel] = field(default_factory=list)
    is_open: bool = True
    blocked_reason: str | None = None

    async def channel(self, *, prefetch: int) -> Channel:
        """A new fake channel."""
        del prefetch
        self.opened.append(Channel(len(self.opened) + 1))
        return self.opened[-1]


def lane_on(connection: Connection) -> PublishLane:
    return PublishLane(cast("RelayConnection", connection), stop=asyncio.Event())


async def test_publishes_share_one_channel_until_it_is_retired() -> None:
    connection = Connection()
    lane = lane_on(connection)
    async with lane.shared() as first, lane.shared() as second:
        assert first is second
    async with lane.shared() as first:
        lane.retire(first)
    async with lane.shared() as then:
        assert then is not first
    assert [c.number for c in connection.opened] == [1, 2]


async def test_a_retired_channel_closes_once_its_last_publish_has_its_answer() -> None:
    connection = Connection()
    lane = lane_on(connection)
    answered = asyncio.Event()

    async def waits_for_its_confirm() -> None:
        async with lane.shared():
            await answered.wait()

    waiting = asyncio.create_task(waits_for_its_confirm())
    await asyncio.sleep(0)
    async with lane.shared() as nacked:
        lane.retire(nacked)
        lane.retire(nacked)  # a second nack on it changes nothing
    assert nacked.is_open, "closed under a publish still waiting for its answer"
    answered.set()
    await waiting
    assert not nacked.is_open
    async with lane.shared() as new:
        assert new.is_open
        assert new is connection.opened[1]


async def test_a_channel_the_broker_closed_is_replaced_and_retiring_it_later_is_harmless() -> None:
    connection = Connection()
    lane = lane_on(connection)
    async with lane.shared() as first:
        pass
    first.is_open = False  # type: ignore[misc]  # the fake's field
    async with lane.shared() as second:
        lane.retire(first)  # not the shared one any more
        assert second.is_open
    async with lane.shared() as third:
        assert third is second


async def test_close_closes_the_shared_channel_and_retired_ones_still_in_use() -> None:
    connection = Connection()
    lane = lane_on(connection)
    gate = asyncio.Event()
    retired = asyncio.Event()

    async def in_use() -> None:
        async with lane.shared() as publisher:
            lane.retire(publisher)
            retired.set()
            await gate.wait()

    task = asyncio.create_task(in_use())
    await retired.wait()  # through the publish gate (its probe answered) and retired
    await lane.open()
    await lane.close()
    assert [c.is_open for c in connection.opened] == [False, False]
    gate.set()
    await task
    assert not lane.connection_open
