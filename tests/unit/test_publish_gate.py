"""The publish gate: its decisions (a table), and the connection's gate with a fake channel."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import cast

import pytest

from sidecar.amqp import ChannelClosedError, ChannelLostError, Publisher, RelayConnection
from sidecar.connection_gate import ConnectionGate
from sidecar.delivery import PublishOutcome
from sidecar.publish_gate import (
    PROBE_BODY,
    PROBE_ROUTING_KEY,
    QUIET_S,
    Admit,
    GateState,
    admit,
    probe_again,
)

# --- the decisions ---


NEVER = math.inf  # no answer yet on the connection
JUST = QUIET_S / 2  # answered a moment ago


@pytest.mark.parametrize(
    ("blocked", "in_flight", "quiet_s", "proving", "probe_refused", "expected"),
    [
        (False, 0, NEVER, False, False, Admit.PROBE),  # the first: the broker may be blocking
        (False, 0, QUIET_S, False, False, Admit.PROBE),  # a quiet spell
        (False, 0, NEVER, False, True, Admit.LEAD),  # quiet, probe refused: one copy alone
        (False, 0, JUST, False, False, Admit.GO),  # between two bursts: still publishing
        (False, 0, JUST, False, True, Admit.GO),
        (False, 3, NEVER, False, False, Admit.GO),  # flowing: the broker is reading
        (False, 3, QUIET_S, False, True, Admit.GO),
        (False, 0, NEVER, True, False, Admit.WAIT),  # the probe is out
        (False, 1, JUST, True, True, Admit.WAIT),  # the lead is out
        (True, 0, NEVER, False, False, Admit.WAIT),  # blocked: nothing new
        (True, 5, JUST, False, False, Admit.WAIT),
        (True, 0, NEVER, True, False, Admit.WAIT),
    ],
)
def test_admit(
    *,
    blocked: bool,
    in_flight: int,
    quiet_s: float,
    proving: bool,
    probe_refused: bool,
    expected: Admit,
) -> None:
    state = GateState(
        blocked=blocked,
        in_flight=in_flight,
        quiet_s=quiet_s,
        proving=proving,
        probe_refused=probe_refused,
    )
    assert admit(state) is expected


@pytest.mark.parametrize(("code", "again"), [(403, False), (404, True), (406, True), (541, True)])
def test_a_probe_refused_for_want_of_permission_is_not_sent_again(
    *, code: int, again: bool
) -> None:
    assert probe_again(closed_with=code) is again


def test_the_probe_goes_where_no_queue_can_be() -> None:
    assert PROBE_ROUTING_KEY.startswith("amq.")  # the broker refuses to declare such a queue


# --- the connection's gate ---


@dataclass(eq=False)
class ProbeChannel:
    """Records the routing key of every publish; each waits for the test's answer."""

    published: list[str] = field(default_factory=list)
    answers: asyncio.Queue[PublishOutcome | Exception] = field(default_factory=asyncio.Queue)
    is_open: bool = True

    async def publish(
        self, body: bytes, *, exchange: str, routing_key: str, **_: object
    ) -> PublishOutcome:
        """Record it; answer when the test says."""
        assert (body, exchange) == (PROBE_BODY, "")
        self.published.append(routing_key)
        answer = await self.answers.get()
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass(eq=False)
class Connection:
    """Only what the gate reads of a connection."""

    blocked_reason: str | None = None
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_unblocked(self) -> None:
        """Return once unblocked."""
        await self.unblocked.wait()


def quiet(gate: ConnectionGate) -> None:
    """As if the last answer came a quiet spell ago."""
    gate._answered_at = -math.inf  # the test's clock


def gate_on(connection: Connection) -> ConnectionGate:
    return ConnectionGate.of(cast("RelayConnection", connection))


async def enter(gate: ConnectionGate, stop: asyncio.Event, channel: ProbeChannel) -> bool:
    return gate.try_enter() or await gate.enter(stop, channel=cast("Publisher", channel))


async def settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_quiet_connection_probes_once_and_the_waiting_publishes_go_together() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    assert gate_on(connection) is gate  # one per connection
    entering = [asyncio.create_task(enter(gate, stop, channel)) for _ in range(3)]
    await settled()
    assert channel.published == [PROBE_ROUTING_KEY]
    assert not any(task.done() for task in entering), "a copy went before the probe's answer"
    channel.answers.put_nowait(PublishOutcome.RETURNED)  # unroutable: any answer will do
    assert await asyncio.gather(*entering) == [False, False, False]  # none leads
    assert gate.in_flight == 3
    assert gate.try_enter(), "publishing on: the next one goes at once"
    for _ in range(4):
        gate.leave(lead=False)
    assert gate.in_flight == 0
    assert gate.try_enter(), "a moment after the last answer: still publishing"
    gate.leave(lead=False)
    quiet(gate)
    assert not gate.try_enter(), "quiet again: the next one probes"
    assert gate.probes == 1


async def test_a_stop_while_the_broker_blocks_lets_the_waiting_publishes_go_unwritten() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = [asyncio.create_task(enter(gate, stop, channel)) for _ in range(2)]
    await settled()
    connection.blocked_reason = "low on memory"  # the probe met the alarm: no answer
    stop.set()
    for task in entering:
        with pytest.raises(ChannelLostError, match="blocks publishing"):
            await task
    assert len(channel.published) == 1, "only the probe was written"
    assert gate.in_flight == 0


async def test_an_answer_that_comes_with_connection_blocked_admits_nothing_yet() -> None:
    """An empty publish is routed before the broker blocks: an answer is not enough."""
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    connection.blocked_reason = "low on memory"
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    await settled()
    assert not entering.done(), "a copy went while the broker blocks"
    assert gate.in_flight == 0
    connection.blocked_reason = None
    connection.unblocked.set()
    assert await entering is False  # the broker reads again: the answer came a moment ago
    assert gate.probes == 1


async def test_a_stop_while_not_blocked_still_waits_for_the_probes_answer() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    stop.set()
    await settled()
    assert not entering.done()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    assert await entering is False
    assert gate.in_flight == 1


async def test_a_blocked_connection_admits_nothing_until_unblocked() -> None:
    connection, stop, channel = (
        Connection(blocked_reason="low on disk"),
        asyncio.Event(),
        ProbeChannel(),
    )
    gate = gate_on(connection)
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert not channel.published
    assert not entering.done()
    connection.blocked_reason = None
    connection.unblocked.set()
    await settled()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)  # then it probes as any quiet one
    assert await entering is False
    stop.set()
    connection.blocked_reason = "low on disk"  # the fake's unblocked event stays set: no matter
    gate.leave(lead=False)
    with pytest.raises(ChannelLostError):
        await enter(gate, stop, channel)


async def test_a_probe_refused_403_makes_the_first_copy_after_quiet_lead_alone() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    first = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    channel.answers.put_nowait(ChannelClosedError(403, "ACCESS_REFUSED - write to amq.default"))
    assert await first is False  # the refusal is an answer: the broker read the probe
    gate.leave(lead=False)
    quiet(gate)
    assert await enter(gate, stop, channel) is True  # quiet again: this one leads
    follower = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert not follower.done(), "a copy went beside the lead"
    gate.leave(lead=True)
    assert await follower is False
    assert gate.probes == 1, "a refused probe is not sent again"


async def test_a_probe_that_fails_unexpectedly_never_stalls_publishing() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    first = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    channel.answers.put_nowait(RuntimeError("a bug"))
    assert await first is False
    gate.leave(lead=False)
    quiet(gate)
    assert await enter(gate, stop, channel) is True  # leads from then on
