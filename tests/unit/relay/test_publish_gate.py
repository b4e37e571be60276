"""The publish gate: its decisions (a table), and the connection's gate with a fake channel."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref
from dataclasses import dataclass, field
from typing import cast

import pytest

from sidecar.amqp import ChannelClosedError, ChannelLostError, Publisher, RelayConnection
from sidecar.flow.publish_gate import (
    PROBE_BODY,
    PROBE_ROUTING_KEY,
    QUIET_S,
    Admit,
    GateState,
    admit,
    probe_again,
)
from sidecar.relay import connection_gate
from sidecar.relay.connection_gate import ConnectionGate
from sidecar.wire import PublishOutcome
from tests.compiled import is_compiled

# --- the decisions ---


NEVER = math.inf  # no answer yet on the connection
JUST = QUIET_S / 2  # answered a moment ago


@pytest.mark.parametrize(
    ("blocked", "quiet_s", "proving", "probe_refused", "expected"),
    [
        (False, NEVER, False, False, Admit.PROBE),  # the first: the broker may be blocking
        (False, QUIET_S, False, False, Admit.PROBE),  # a quiet spell, whatever is in flight
        (False, NEVER, False, True, Admit.LEAD),  # quiet, probe refused: one copy alone
        (False, JUST, False, False, Admit.GO),  # the broker answered a moment ago
        (False, JUST, False, True, Admit.GO),
        (False, NEVER, True, False, Admit.WAIT),  # the probe is out
        (False, JUST, True, True, Admit.WAIT),  # the lead is out
        (True, NEVER, False, False, Admit.WAIT),  # blocked: nothing new
        (True, JUST, False, False, Admit.WAIT),
        (True, NEVER, True, False, Admit.WAIT),
    ],
)
def test_admit(
    *, blocked: bool, quiet_s: float, proving: bool, probe_refused: bool, expected: Admit
) -> None:
    state = GateState(
        blocked=blocked, quiet_s=quiet_s, proving=proving, probe_refused=probe_refused
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
        if isinstance(answer, ChannelLostError):
            self.is_open = False
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass(eq=False)
class Connection:
    """Only what the gate reads of a connection."""

    blocked_reason: str | None = None
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)
    is_open: bool = True

    async def wait_unblocked(self) -> None:
        """Return once unblocked."""
        await self.unblocked.wait()


def quiet(gate: ConnectionGate) -> None:
    """As if the last answer came a quiet spell ago."""
    gate._answered_at = -math.inf  # the test's clock


def gate_on(connection: Connection) -> ConnectionGate:
    return ConnectionGate.of(cast("RelayConnection", connection))


async def enter(gate: ConnectionGate, stop: asyncio.Event, channel: ProbeChannel) -> int:
    if gate.try_enter():
        return 0
    return await gate.enter(stop, channel=cast("Publisher", channel))


async def settled() -> None:
    for _ in range(20):
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
    assert gate.try_enter(), "publishing on: the next one goes at once"
    for _ in range(4):
        gate.leave(lead=0, answered=True)
    assert gate.try_enter(), "a moment after the last answer: still publishing"
    gate.leave(lead=0, answered=True)
    quiet(gate)
    assert not gate.try_enter(), "quiet again: the next one probes"
    assert channel.published == [PROBE_ROUTING_KEY], "one probe for the three"


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
    connection.blocked_reason = None
    connection.unblocked.set()
    assert await entering == 0  # the broker reads again: the answer came a moment ago
    assert channel.published == [PROBE_ROUTING_KEY], "no second probe"


async def test_a_stop_while_not_blocked_still_waits_for_the_probes_answer() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    stop.set()
    await settled()
    assert not entering.done()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    assert await entering == 0


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
    assert await entering == 0
    stop.set()
    connection.blocked_reason = "low on disk"  # the fake's unblocked event stays set: no matter
    gate.leave(lead=0, answered=True)
    with pytest.raises(ChannelLostError):
        await enter(gate, stop, channel)


async def test_a_probe_refused_403_makes_the_first_copy_after_quiet_lead_alone() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    first = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    channel.answers.put_nowait(ChannelClosedError(403, "ACCESS_REFUSED - write to amq.default"))
    assert await first == 0  # the refusal is an answer: the broker read the probe
    gate.leave(lead=0, answered=True)
    quiet(gate)
    lead = await enter(gate, stop, channel)
    assert lead  # quiet again: this one leads
    follower = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert not follower.done(), "a copy went beside the lead"
    gate.leave(lead=lead, answered=True)
    assert await follower == 0
    assert channel.published == [PROBE_ROUTING_KEY], "a refused probe is not sent again"


async def test_a_probe_that_fails_unexpectedly_never_stalls_publishing() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    first = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    channel.answers.put_nowait(RuntimeError("a bug"))
    lead = await first
    assert lead, "no answer from the broker: it goes alone, as a lead"
    gate.leave(lead=lead, answered=True)
    quiet(gate)
    assert await enter(gate, stop, channel)  # leads from then on


async def test_the_registry_does_not_keep_a_connection_alive() -> None:
    """The registry of gates keeps no connection alive: a reconnect frees the old one whole."""
    connection = Connection()
    gone, key = weakref.ref(connection), id(connection)
    gate_on(connection)
    assert key in ConnectionGate._gates
    del connection
    gc.collect()
    assert gone() is None, "the gate's registry keeps the connection alive"
    assert key not in ConnectionGate._gates


async def test_a_probe_whose_channel_the_sidecar_closed_proves_nothing() -> None:
    """Review 2: another lane closed the prober's channel; the others must not go unproven."""
    connection, stop = Connection(), asyncio.Event()
    closing, other = ProbeChannel(), ProbeChannel()
    gate = gate_on(connection)
    on_closing = asyncio.create_task(enter(gate, stop, closing))
    await settled()
    on_other = asyncio.create_task(enter(gate, stop, other))
    await settled()
    assert closing.published == [PROBE_ROUTING_KEY]
    closing.answers.put_nowait(ChannelLostError("channel closed by the sidecar"))
    await settled()
    assert not on_other.done(), "a copy went out with no answer from the broker"
    with pytest.raises(ChannelLostError, match="closed at the publish gate"):
        await on_closing  # its channel cannot carry the next probe: nothing written
    assert other.published == [PROBE_ROUTING_KEY], "the one left probes on its own channel"
    other.answers.put_nowait(PublishOutcome.RETURNED)
    assert await on_other == 0
    assert (closing.published, other.published) == ([PROBE_ROUTING_KEY], [PROBE_ROUTING_KEY])


async def test_a_probe_on_a_channel_already_closed_is_not_sent() -> None:
    connection, stop = Connection(), asyncio.Event()
    gate = gate_on(connection)
    closed = ProbeChannel(is_open=False)
    with pytest.raises(ChannelLostError, match="closed at the publish gate"):
        await enter(gate, stop, closed)
    assert not closed.published
    channel = ProbeChannel()
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert channel.published == [PROBE_ROUTING_KEY], "the gate is not left proving"
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    assert await entering == 0


async def test_a_lead_never_answered_lets_no_one_go_unproven() -> None:
    """Review 2, lead mode: a lead not written (unencodable, channel closed) proves nothing."""
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    gate._probe_refused = True  # the broker refused the probe once (403)
    lead = await enter(gate, stop, channel)
    assert lead
    follower = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    gate.leave(lead=lead, answered=False)
    lead = await follower
    assert lead, "it must lead in turn, not go beside an unproven one"
    third = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert not third.done()
    gate.leave(lead=lead, answered=True)
    assert await third == 0


async def test_a_lead_on_a_connection_that_closed_lets_the_others_go_and_fail() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    gate._probe_refused = True
    lead = await enter(gate, stop, channel)
    assert lead
    follower = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    connection.is_open = False
    gate.leave(lead=lead, answered=False)
    assert await follower == 0


async def test_a_stuck_publish_does_not_switch_probing_off() -> None:
    """Review 3: one publish unanswered for minutes; an alarm then would catch the next."""
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    first = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    assert await first == 0  # in flight, its confirm never comes
    quiet(gate)  # ... for a quiet spell
    assert not gate.try_enter(), "went at once beside a publish stuck for a quiet spell"
    second = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    assert channel.published == [PROBE_ROUTING_KEY] * 2
    assert not second.done()
    channel.answers.put_nowait(PublishOutcome.RETURNED)
    assert await second == 0


async def test_a_publish_that_failed_unanswered_does_not_restart_the_quiet_spell() -> None:
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    gate._probe_refused = True
    lead = await enter(gate, stop, channel)
    assert lead
    gate.leave(lead=lead, answered=True)
    assert gate.try_enter()
    quiet(gate)
    gate.leave(lead=0, answered=False)  # not written (a WireError): not the broker's
    assert not gate.try_enter()


@pytest.mark.skipif(
    is_compiled(connection_gate),
    reason="replaces a method, which a compiled class does not let be replaced; plain runs it",
)
async def test_a_publish_cancelled_after_the_grant_is_counted_out() -> None:
    """Granted by the probe's answer, cancelled before it resumed: newcomers still go."""
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = [asyncio.create_task(enter(gate, stop, channel)) for _ in range(2)]
    await settled()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    granted = asyncio.Event()
    settle = gate._settle_proof

    def settle_then_flag(*, proven: bool) -> None:
        settle(proven=proven)
        granted.set()

    gate._settle_proof = settle_then_flag  # type: ignore[method-assign]
    await granted.wait()  # the probe's answer granted them ...
    entering[0].cancel()  # ... and one is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await entering[0]
    assert await entering[1] == 0
    assert gate.try_enter(), "a newcomer waits behind the cancelled grant"


async def test_a_probe_unanswered_while_the_broker_does_not_block_stalls_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No answer (a channel that stopped confirming) and no block: they go after a bound."""
    monkeypatch.setattr(connection_gate, "PROBE_ANSWER_S", 0.05)
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = [asyncio.create_task(enter(gate, stop, channel)) for _ in range(2)]
    async with asyncio.timeout(5):
        assert await asyncio.gather(*entering) == [False, False]
    assert channel.published == [PROBE_ROUTING_KEY]
    assert gate.try_enter(), "publishing goes on"


async def test_a_probe_unanswered_while_the_broker_blocks_admits_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_gate, "PROBE_ANSWER_S", 0.05)
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    entering = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    connection.blocked_reason = "low on memory"
    await asyncio.sleep(0.2)
    assert not entering.done(), "a copy went while the broker blocks"
    connection.blocked_reason = None
    connection.unblocked.set()
    channel.answers.put_nowait(PublishOutcome.CONFIRMED)
    async with asyncio.timeout(5):
        assert await entering == 0


async def test_a_lead_unanswered_while_the_broker_does_not_block_stalls_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe refused (no write on amq.default): a lead's confirm that never comes.

    The others go after the probe's bound, and the lead leaving later, answered or not,
    settles nothing of a later lead's.
    """
    monkeypatch.setattr(connection_gate, "PROBE_ANSWER_S", 0.05)
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    gate._probe_refused = True
    first = await enter(gate, stop, channel)
    assert first
    followers = [asyncio.create_task(enter(gate, stop, channel)) for _ in range(2)]
    async with asyncio.timeout(5):
        assert await asyncio.gather(*followers) == [0, 0]
    quiet(gate)
    second = await enter(gate, stop, channel)
    assert second
    assert second != first
    waiting = asyncio.create_task(enter(gate, stop, channel))
    await settled()
    gate.leave(lead=first, answered=False)  # the first lead fails at last
    await settled()
    assert not waiting.done(), "the first lead's end let a copy go beside the second"
    gate.leave(lead=second, answered=True)
    assert await waiting == 0


async def test_a_lead_unanswered_while_the_broker_blocks_admits_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_gate, "PROBE_ANSWER_S", 0.05)
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    gate._probe_refused = True
    lead = await enter(gate, stop, channel)
    assert lead
    connection.blocked_reason = "low on memory"
    follower = asyncio.create_task(enter(gate, stop, channel))
    await asyncio.sleep(0.2)
    assert not follower.done(), "a copy went beside the lead while the broker blocks"
    connection.blocked_reason = None
    connection.unblocked.set()
    async with asyncio.timeout(5):
        assert await follower == 0


async def test_the_publishes_that_waited_for_the_probe_go_before_a_newcomer() -> None:
    """Per-route order: a copy arriving as the probe is answered goes after those that waited."""
    connection, stop, channel = Connection(), asyncio.Event(), ProbeChannel()
    gate = gate_on(connection)
    written: list[int] = []

    async def copy(n: int) -> None:
        await enter(gate, stop, channel)
        written.append(n)

    waited = [asyncio.create_task(copy(n)) for n in range(3)]
    await settled()
    assert channel.published == [PROBE_ROUTING_KEY]
    channel.answers.put_nowait(PublishOutcome.RETURNED)
    for _ in range(3):  # the probe's answer is read, and the next deliveries with it
        await asyncio.sleep(0)
    newcomers = [asyncio.create_task(copy(n)) for n in range(3, 6)]
    await asyncio.gather(*waited, *newcomers)
    assert written == [0, 1, 2, 3, 4, 5]
