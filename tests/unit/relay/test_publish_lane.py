"""The publish lane's channels: shared, reopened, retired after a nack, closed when idle."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import cast

import pytest

from sidecar.amqp import ChannelClosedError, ChannelLostError, Publisher, RelayConnection
from sidecar.errors import WireError
from sidecar.flow.publish_gate import PROBE_ROUTING_KEY
from sidecar.relay import lane as publish_lane
from sidecar.relay.lane import PublishLane
from sidecar.wire import Body, PublishOutcome
from tests.fakes.publish import Answer, Publish, PublishRecorder


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


@dataclass(eq=False)
class ClosingOnProbe(Channel):
    """A channel whose probe ends it with ``error`` (a refusal, or the sidecar closing it)."""

    error: ChannelLostError = field(default_factory=lambda: ChannelLostError("closed"))

    async def publish(self, body: Body, *, routing_key: str, **rest: object) -> PublishOutcome:
        """The probe ends the channel; anything else is recorded and confirmed."""
        if routing_key == PROBE_ROUTING_KEY:
            self.probes += 1
            self.is_open = False
            raise self.error
        return await super().publish(body, routing_key=routing_key, **rest)  # type: ignore[arg-type]


@dataclass
class Connection:
    """Opens numbered fake channels; the first ``closing`` of them end at their probe."""

    opened: list[Channel] = field(default_factory=list)
    is_open: bool = True
    blocked_reason: str | None = None
    closing: list[ChannelLostError] = field(default_factory=list)

    async def channel(self, *, prefetch: int) -> Channel:
        """A new fake channel."""
        del prefetch
        number = len(self.opened) + 1
        if self.closing:
            self.opened.append(ClosingOnProbe(number, error=self.closing.pop(0)))
        else:
            self.opened.append(Channel(number))
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


REFUSED = ChannelClosedError(403, "ACCESS_REFUSED - write access to exchange 'amq.default'")


async def test_a_publish_alone_whose_probe_was_refused_goes_on_a_new_channel() -> None:
    """Review 5: the 403 closed its channel; it was handed the closed one (a Hold, a retry)."""
    connection = Connection(closing=[REFUSED])
    lane = lane_on(connection)
    async with lane.alone() as channel:
        assert channel.is_open, "handed the channel the probe's refusal closed"
        assert cast("Channel", channel) is connection.opened[1]
    assert [c.is_open for c in connection.opened] == [False, False]
    assert lane._gate.try_enter(), "the refusal was an answer: the next publish goes at once"


async def test_a_shared_channel_closed_under_its_probe_is_replaced_and_probes_again() -> None:
    """Its probe proved nothing (the sidecar closed the channel): a new channel probes."""
    connection = Connection(closing=[ChannelLostError("channel closed by the sidecar")])
    lane = lane_on(connection)
    async with lane.shared() as channel:
        assert cast("Channel", channel) is connection.opened[1]
        assert channel.is_open
    assert [c.probes for c in connection.opened] == [1, 1]
    assert lane._gate.try_enter(), "the second probe was answered: the next goes at once"


async def test_a_lead_that_failed_unwritten_leaves_the_gate_for_the_next_to_lead() -> None:
    connection = Connection()
    lane = lane_on(connection)
    gate = lane._gate
    gate._probe_refused = True  # the connection leads instead of probing
    answered_at = gate._answered_at
    with pytest.raises(WireError):
        async with lane.alone():
            raise WireError("cannot encode it")
    assert (gate._proving, gate._answered_at) == (False, answered_at)
    with pytest.raises(WireError):
        async with lane.shared():
            raise WireError("cannot encode it")
    assert (gate._proving, gate._answered_at) == (False, answered_at)


async def test_a_publish_cancelled_while_it_takes_a_new_channel_leaves_the_gate() -> None:
    """Review 4, in the lane: through the gate, then cancelled while reopening."""
    connection = Connection(closing=[REFUSED])
    lane = lane_on(connection)
    opening = asyncio.Event()
    plain = Connection.channel

    async def hangs(self: Connection, *, prefetch: int) -> Channel:
        if self.opened:
            opening.set()
            await asyncio.Event().wait()
        return await plain(self, prefetch=prefetch)

    connection.channel = hangs.__get__(connection)  # type: ignore[method-assign]

    async def publish_on(use: Callable[[], AbstractAsyncContextManager[object]]) -> None:
        async with use():
            pass

    for use in (lane.shared, lane.alone):
        connection.opened.clear()
        connection.closing[:] = [REFUSED]
        lane._gate._probe_refused = False
        lane._gate._answered_at = -math.inf
        opening.clear()

        task = asyncio.create_task(publish_on(use))
        await opening.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lane._gate._proving, use


async def test_a_publish_whose_channel_retired_while_it_waited_at_the_gate_takes_the_new_one() -> (
    None
):
    """A nack retires the shared channel while a publish waits for the probe: not on the old one.

    RabbitMQ 3.10 can go on nacking every publish on such a channel (docs/scaling.md).
    """
    answer = asyncio.Event()

    @dataclass(eq=False)
    class HeldProbe(Channel):
        """Its probe is answered when the test says."""

        async def publish(self, body: Body, *, routing_key: str, **rest: object) -> PublishOutcome:
            """Hold the probe; record and confirm the rest."""
            if routing_key == PROBE_ROUTING_KEY:
                await answer.wait()
                self.probes += 1
                return PublishOutcome.RETURNED
            return await super().publish(body, routing_key=routing_key, **rest)  # type: ignore[arg-type]

    @dataclass
    class FirstHeld(Connection):
        """The first channel holds its probe."""

        async def channel(self, *, prefetch: int) -> Channel:
            """A held-probe channel first, then plain ones."""
            if self.opened:
                return await super().channel(prefetch=prefetch)
            self.opened.append(HeldProbe(1))
            return self.opened[-1]

    connection = FirstHeld()
    lane = lane_on(connection)
    got: list[object] = []

    async def publishes() -> None:
        async with lane.shared() as publisher:
            got.append(publisher)

    waiting = asyncio.create_task(publishes())
    for _ in range(20):
        await asyncio.sleep(0)
    (shared,) = connection.opened
    lane.retire(cast("Publisher", shared))  # another publish on it was nacked
    answer.set()
    async with asyncio.timeout(5):
        await waiting
    assert got == [connection.opened[1]], "the publish went on the retired channel"
    assert not shared.is_open


@dataclass
class Unanswered(Connection):
    """A broker that reads no channel.open (it blocks the connection)."""

    asked: int = 0

    async def channel(self, *, prefetch: int) -> Channel:
        """Never opens."""
        del prefetch
        self.asked += 1
        await asyncio.Event().wait()
        raise AssertionError


async def test_opening_a_publish_channel_ends_at_a_stop() -> None:
    connection = Unanswered()
    stop = asyncio.Event()
    lane = PublishLane(cast("RelayConnection", connection), stop=stop)
    opening = asyncio.create_task(lane.open())
    for _ in range(5):
        await asyncio.sleep(0)
    assert connection.asked == 1
    stop.set()
    with pytest.raises(ChannelLostError, match="stopping"):
        await opening


async def test_opening_a_publish_channel_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish_lane, "OPEN_TIMEOUT_S", 0.01)
    lane = lane_on(Unanswered())
    with pytest.raises(ChannelLostError, match="did not open a publish channel"):
        await lane.open()
    with pytest.raises(ChannelLostError, match="did not open a publish channel"):
        async with lane.alone():
            pass
