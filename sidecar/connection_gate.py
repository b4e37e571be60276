"""One connection's publish gate: the probe after a quiet spell, and the publishes that wait.

``sidecar.publish_gate`` decides (why a quiet connection probes before a copy goes out:
RabbitMQ blocks a connection only when a publish meets an alarm); this carries it out
for every publish lane of one connection. The probe goes on the channel of the publish
that found the connection quiet: nothing else is in flight then, so a refusal that
closes it (403: no write permission on the default exchange) takes no copy down. A
publish enters before it is written and leaves once it has its answer; entering costs a
comparison while the connection keeps publishing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from typing import TYPE_CHECKING, ClassVar, assert_never

from sidecar.amqp import ChannelClosedError, ChannelLostError
from sidecar.publish_gate import (
    PROBE_BODY,
    PROBE_ROUTING_KEY,
    QUIET_S,
    Admit,
    GateState,
    admit,
    probe_again,
)
from sidecar.waits import first_of

if TYPE_CHECKING:
    from sidecar.amqp import Publisher, RelayConnection

__all__ = ["ConnectionGate"]

log = logging.getLogger("sidecar.relay")

PROBE_SLOW_S = 30.0  # the probe's on_slow is not used: its answer is awaited however long
PROBE_PROPERTIES = {"app_id": "acemq-sidecar", "type": "acemq-sidecar.publish-gate"}


class ConnectionGate:
    """The publish gate of one connection; ``ConnectionGate.of(connection)`` finds it."""

    # By identity, not by hash (a connection need not be hashable); an entry goes with
    # its connection.
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
        self._connection = connection
        self.in_flight = 0  # publishes entered and not left yet
        self._answered_at = -math.inf  # the loop's time when the last one left
        self._loop = asyncio.get_running_loop()
        self._proving = False  # a probe or a lead publish is out, unanswered
        self._probe_refused = False
        self._waiters: list[asyncio.Future[None]] = []  # for the probe's or the lead's answer
        self._probe: asyncio.Task[None] | None = None
        self.probes = 0  # probes sent on this connection (for the tests and the bench)

    def try_enter(self) -> bool:
        """Enter at once while the connection keeps publishing; False: ``enter`` must wait."""
        if (
            not self._proving
            and (self.in_flight or self._loop.time() - self._answered_at < QUIET_S)
            and self._connection.blocked_reason is None
        ):
            self.in_flight += 1
            return True
        return False

    async def enter(self, stop: asyncio.Event, *, channel: Publisher) -> bool:
        """Wait until a publish may go out; True when it leads (see ``sidecar.publish_gate``).

        ``channel`` is the one it will go on, and the probe's if one is due. Raises
        ``ChannelLostError`` when ``stop`` comes while the broker blocks: nothing was
        written.
        """
        while True:
            decision = admit(
                GateState(
                    blocked=self._connection.blocked_reason is not None,
                    in_flight=self.in_flight,
                    quiet_s=self._loop.time() - self._answered_at,
                    proving=self._proving,
                    probe_refused=self._probe_refused,
                )
            )
            match decision:
                case Admit.GO:
                    self.in_flight += 1
                    return False
                case Admit.LEAD:
                    self.in_flight += 1
                    self._proving = True
                    return True
                case Admit.PROBE:
                    self._start_probe(channel)
                    if await self._proof(stop):
                        return False
                case Admit.WAIT if self._proving:
                    if await self._proof(stop):
                        return False
                case Admit.WAIT:
                    await first_of(self._connection.wait_unblocked(), stop.wait())
                    if stop.is_set() and self._connection.blocked_reason is not None:
                        raise ChannelLostError("stopping while the broker blocks publishing")
                case _:
                    assert_never(decision)

    def leave(self, *, lead: bool) -> None:
        """Count out a publish that has its answer (or failed); a lead's lets the others go."""
        self.in_flight -= 1
        self._answered_at = self._loop.time()
        if lead:
            self._proven()

    async def _proof(self, stop: asyncio.Event) -> bool:
        """Wait for the probe's or the lead's answer; True: entered, False: decide again.

        Again when ``connection.blocked`` came with the answer. A stop lets the publish go
        (unwritten) only while the broker blocks: else the answer is a round trip away,
        and the drain settles what is in flight.
        """
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            await first_of(asyncio.shield(granted), stop.wait())
            if not granted.done() and self._connection.blocked_reason is None:
                await granted  # stopping, not blocked: the answer comes
        finally:
            if not granted.done():
                granted.cancel()  # _proven skips it
        if granted.cancelled():
            raise ChannelLostError("stopping while the broker blocks publishing")
        if self._connection.blocked_reason is None:
            return True
        self.in_flight -= 1  # counted by _proven: not going after all
        return False

    def _proven(self) -> None:
        """Let every publish waiting go, together: the broker answered the probe or the lead."""
        self._proving = False
        self._answered_at = self._loop.time()
        waiters, self._waiters = self._waiters, []
        for granted in waiters:
            if not granted.done():
                self.in_flight += 1
                granted.set_result(None)

    def _start_probe(self, channel: Publisher) -> None:
        self._proving = True
        self.probes += 1
        self._probe = asyncio.create_task(self._send_probe(channel), name="publish-gate-probe")

    async def _send_probe(self, channel: Publisher) -> None:
        """Publish the probe and wait for any answer; then the publishes waiting go.

        No answer while the broker blocks: they wait on. The connection closing ends it
        too (they go, and fail as any publish on a closed connection does).
        """
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
            if not probe_again(closed_with=e.code):
                self._probe_refused = True
                log.warning(
                    "the broker refused the publish gate's probe to the default exchange"
                    " (%d %s): after a quiet spell the first copy goes alone instead; grant"
                    ' write on "amq.default" so that an alarm catches no copy at all',
                    e.code,
                    e.text,
                )
        except ChannelLostError:
            pass  # the channel or the connection is gone: the publishes waiting fail on it
        except Exception:
            log.exception("the publish gate's probe failed; the connection leads instead")
            self._probe_refused = True  # never stall publishing on a bug here
        finally:
            self._probe = None
            self._proven()


def _nothing() -> None:
    """Report nothing of a slow probe: the broker's block is reported (readyz, metric)."""
