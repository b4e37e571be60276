"""One connection's publish gate: the probe after a quiet spell, and the publishes that wait.

``sidecar.flow.publish_gate`` decides (why a quiet connection probes before a copy goes out:
RabbitMQ blocks a connection only when a publish meets an alarm); this carries it out
for every publish lane of one connection. The probe goes on the channel of the publish
that found the connection quiet; a refusal that closes it (403: no write permission on
the default exchange) closes that channel, and the publish then takes another (the
lane does). A publish enters before it is written and leaves once it has its answer
(or failed), saying whether the broker answered it; entering costs a comparison while
the broker keeps answering.

The registry holds each gate until its connection is collected; a gate holds its
connection weakly, so that the registry never keeps a closed connection alive.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, assert_never

from sidecar.amqp import ChannelClosedError, ChannelLostError
from sidecar.errors import MissingEntityError
from sidecar.flow import (
    PROBE_BODY,
    PROBE_ROUTING_KEY,
    QUIET_S,
    Admit,
    GateState,
    admit,
    probe_again,
)
from sidecar.relay.waits import first_of

if TYPE_CHECKING:
    from sidecar.amqp import Publisher, RelayConnection

__all__ = ["ConnectionGate", "answered"]

log = logging.getLogger("sidecar.relay")

PROBE_SLOW_S = 30.0  # the probe's on_slow is not used: its answer is awaited however long
# A probe unanswered this long while the broker has not blocked the connection lets the
# publishes waiting go all the same: a broker that read it during an alarm says
# connection.blocked at once, as it reads it; an answer held up by something else (a
# channel the broker stopped confirming on) must not stall every route of the connection.
PROBE_ANSWER_S = 2.0
PROBE_PROPERTIES = {"app_id": "acemq-sidecar", "type": "acemq-sidecar.publish-gate"}


def answered(error: BaseException | None) -> bool:
    """Return whether a publish that ended with ``error`` (None: its outcome) was answered.

    An outcome (confirm, nack, return) and a close of its channel by the broker are the
    broker's answers; an error before writing, or a channel the sidecar closed, is not.
    """
    return error is None or isinstance(error, ChannelClosedError | MissingEntityError)


class _Proofs:
    """A connection's probe or lead out, unanswered, and the publishes waiting for its answer."""

    _loop: asyncio.AbstractEventLoop
    _answered_at: float

    def _proofs_begin(self) -> None:
        self._proving = False  # a probe or a lead publish is out, unanswered
        # For the probe's or the lead's answer: True, entered; False, decide again.
        self._waiters: list[asyncio.Future[bool]] = []
        # The lead out now (its number; 0: none), and the last number given: a lead whose
        # bound let the others go leaves later as an ordinary publish.
        self._lead = 0
        self._leads = 0
        self._lead_bound: asyncio.TimerHandle | None = None
        # Publishes let go by an answer that have not run yet, and the newcomers that wait
        # for them: the ones that waited are written first, so a route's order holds.
        self._resuming = 0
        self._after_resume: list[asyncio.Future[None]] = []

    def _blocked(self) -> bool:
        raise NotImplementedError

    async def _behind_the_resuming(self) -> None:
        """Wait until every publish an answer let go has run (a few turns of the loop)."""
        while self._resuming:
            turn: asyncio.Future[None] = self._loop.create_future()
            self._after_resume.append(turn)
            await turn

    def _resumed(self, granted: asyncio.Future[bool]) -> None:
        """Count a let-go publish as run; the last one lets the newcomers decide."""
        if not granted.done() or granted.cancelled() or not granted.result():
            return
        self._resuming -= 1
        if self._resuming == 0:
            turns, self._after_resume = self._after_resume, []
            for turn in turns:
                if not turn.done():
                    turn.set_result(None)

    def _start_lead(self) -> int:
        """Make this publish the lead; return its number. Bounded as the probe is.

        No answer to it for ``PROBE_ANSWER_S`` while the broker does not block the
        connection lets the publishes waiting go all the same (a broker that read it during
        an alarm says ``connection.blocked`` as it reads it); an answer held up otherwise (a
        target queue that stopped confirming) must not stall every route of the connection.
        """
        self._proving = True
        self._leads += 1
        self._lead = self._leads
        self._lead_bound = self._loop.call_later(PROBE_ANSWER_S, self._lead_unanswered, self._lead)
        return self._lead

    def _lead_unanswered(self, lead: int) -> None:
        if lead != self._lead:
            return  # answered, or failed, meanwhile
        if self._blocked():
            self._lead_bound = self._loop.call_later(PROBE_ANSWER_S, self._lead_unanswered, lead)
            return
        _going_on("lead publish")
        self._settle_proof(proven=True)

    async def _proof(self, stop: asyncio.Event) -> bool:
        """Wait for the probe's or the lead's answer; True: entered, False: decide again.

        Again when ``connection.blocked`` came with the answer, or when it proved nothing.
        A stop lets the publish go (unwritten) only while the broker blocks: else the
        answer is a round trip away, and the drain settles what is in flight. A
        cancellation after the grant still counts it as run, so newcomers do not wait on it.
        """
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            await first_of(asyncio.shield(granted), stop.wait())
            if not granted.done() and not self._blocked():
                await granted  # stopping, not blocked: the answer comes
        finally:
            if not granted.done():
                granted.cancel()  # _settle_proof skips it
            self._resumed(granted)
        if granted.cancelled():
            raise ChannelLostError("stopping while the broker blocks publishing")
        if not granted.result():
            return False
        return not self._blocked()

    def _settle_proof(self, *, proven: bool) -> None:
        """Let the publishes waiting go, or make them decide again: the probe or lead is done.

        ``proven``: the broker answered it (or the connection closed): they go, together.
        Else it proved nothing (never written, its channel closed by the sidecar): they
        decide again, and one of them probes (or leads).
        """
        self._proving = False
        self._lead = 0
        if self._lead_bound is not None:
            self._lead_bound.cancel()
            self._lead_bound = None
        if proven:
            self._answered_at = self._loop.time()
        waiters, self._waiters = self._waiters, []
        for granted in waiters:
            if not granted.done():
                if proven:
                    self._resuming += 1
                granted.set_result(proven)


class ConnectionGate(_Proofs):
    """The publish gate of one connection; ``ConnectionGate.of(connection)`` finds it."""

    # By identity, not by hash (a connection need not be hashable); an entry goes with
    # its connection (the gate holds it weakly, so it can go).
    _gates: ClassVar[dict[int, ConnectionGate]] = {}

    @classmethod
    def of(cls, connection: RelayConnection) -> ConnectionGate:
        """Return the connection's gate, made at its first publish lane."""
        key = id(connection)
        gate = cls._gates.get(key)
        if gate is None:
            cls._gates[key] = gate = cls(connection)
            weakref.finalize(connection, cls._gates.pop, key, None)
        return gate

    def __init__(self, connection: RelayConnection) -> None:
        self._connection = weakref.ref(connection)
        self._answered_at = -math.inf  # the loop's time of the broker's last answer
        self._loop = asyncio.get_running_loop()
        self._proofs_begin()
        self._probe_refused = False
        self._probe: asyncio.Task[None] | None = None

    def _blocked(self) -> bool:
        connection = self._connection()
        return connection is not None and connection.blocked_reason is not None

    def _connection_gone(self) -> bool:
        connection = self._connection()
        return connection is None or not connection.is_open

    def try_enter(self) -> bool:
        """Enter at once while the broker keeps answering; False: ``enter`` must wait."""
        return (
            not self._proving
            and not self._resuming
            and self._loop.time() - self._answered_at < QUIET_S
            and not self._blocked()
        )

    async def enter(self, stop: asyncio.Event, *, channel: Publisher) -> int:
        """Wait until a publish may go out; its lead number when it leads, else 0.

        See ``sidecar.flow.publish_gate``; ``leave`` takes the number back.

        ``channel`` is the one it will go on, and the probe's if one is due. Raises
        ``ChannelLostError`` with nothing written when ``stop`` comes while the broker
        blocks, or when a probe is due and ``channel`` is closed (the caller may take
        another channel and enter again).
        """
        while True:
            await self._behind_the_resuming()
            decision = admit(
                GateState(
                    blocked=self._blocked(),
                    quiet_s=self._loop.time() - self._answered_at,
                    proving=self._proving,
                    probe_refused=self._probe_refused,
                )
            )
            match decision:
                case Admit.GO:
                    return 0
                case Admit.LEAD:
                    return self._start_lead()
                case Admit.PROBE:
                    self._start_probe(channel)
                    if await self._proof(stop):
                        return 0
                case Admit.WAIT if self._proving:
                    if await self._proof(stop):
                        return 0
                case Admit.WAIT:
                    await self._unblocked(stop)
                case _:
                    assert_never(decision)

    async def _unblocked(self, stop: asyncio.Event) -> None:
        """Wait until the broker unblocks; raise ``ChannelLostError`` at a stop meanwhile."""
        connection = self._connection()
        if connection is not None:
            await first_of(connection.wait_unblocked(), stop.wait())
        if stop.is_set() and self._blocked():
            raise ChannelLostError("stopping while the broker blocks publishing")

    def leave(self, *, lead: int, answered: bool) -> None:
        """End a publish that has its answer or failed (``answered``: the broker's).

        ``lead`` is what ``enter`` returned. The lead's answer lets the others go; a lead
        that had none makes them decide again. A lead its bound let go already (see
        ``_start_lead``) leaves as any publish.
        """
        if answered:
            self._answered_at = self._loop.time()
        if lead and lead == self._lead:
            self._settle_proof(proven=answered or self._connection_gone())

    def _start_probe(self, channel: Publisher) -> None:
        if not channel.is_open:  # it would not be written: the caller takes another
            raise ChannelLostError("the publish channel closed at the publish gate")
        self._proving = True
        self._probe = asyncio.create_task(self._send_probe(channel), name="publish-gate-probe")

    async def _send_probe(self, channel: Publisher) -> None:
        """Publish the probe and wait for its answer; then the publishes waiting go.

        No answer while the broker blocks: they wait on. No answer for ``PROBE_ANSWER_S``
        while it does not block: they go (the probe's answer is then awaited by itself).
        The connection closing ends it too (they go, and fail as any publish on a closed
        connection does). A probe the broker did not answer (not written, or its channel
        closed by the sidecar) makes them decide again.
        """
        proven = False
        answer = asyncio.get_running_loop().create_task(
            _publish_probe(channel), name="publish-gate-probe-answer"
        )
        try:
            await asyncio.wait((answer,), timeout=PROBE_ANSWER_S)
            while not answer.done() and self._blocked():
                await asyncio.wait((answer,), timeout=PROBE_ANSWER_S)
            if answer.done():
                result = answer.result()
                self._probe_refused |= result in (_Answer.REFUSED, _Answer.FAILED)
                lost = result is _Answer.LOST
                proven = self._connection_gone() if lost else result is not _Answer.FAILED
            else:
                proven = True  # not blocked, and no block came: the broker reads us
                _going_on("probe")
        finally:
            self._probe = None
            self._settle_proof(proven=proven)


class _Answer(StrEnum):
    """What became of a probe."""

    ANSWERED = "answered"  # confirmed, returned, nacked, or its channel closed by the broker
    REFUSED = "refused"  # answered with a 403: no write on the default exchange
    LOST = "lost"  # not written, or its channel ended otherwise: answered if the connection is gone
    FAILED = "failed"  # a bug: unproven, and the connection leads from then on


async def _publish_probe(channel: Publisher) -> _Answer:
    """Publish the probe; say how the broker answered it."""
    try:
        await channel.publish(
            PROBE_BODY,
            exchange="",
            routing_key=PROBE_ROUTING_KEY,
            properties=PROBE_PROPERTIES,
            headers=None,
            slow_after_s=PROBE_SLOW_S,
            on_slow=_nothing,
        )
    except ChannelClosedError as e:
        if probe_again(closed_with=e.code):
            return _Answer.ANSWERED  # the broker's answer: it read the probe
        log.warning(
            "the broker refused the publish gate's probe to the default exchange"
            " (%d %s): after a quiet spell the first copy goes alone instead; grant"
            ' write on "amq.default" so that an alarm catches no copy at all',
            e.code,
            e.text,
        )
        return _Answer.REFUSED
    except ChannelLostError:
        return _Answer.LOST
    except Exception:
        log.exception("the publish gate's probe failed; the connection leads instead")
        return _Answer.FAILED  # never stall publishing on a bug here
    return _Answer.ANSWERED


def _going_on(what: str) -> None:
    log.info(
        "the publish gate's %s has no answer after %.0fs, and the broker does not block the"
        " connection: publishing goes on",
        what,
        PROBE_ANSWER_S,
    )


def _nothing() -> None:
    """Report nothing of a slow probe: the broker's block is reported (readyz, metric)."""
