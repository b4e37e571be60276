"""One route's channel life: check, open, consume, drain, close, and reopen with backoff.

``RouteWorker`` checks the route's staging queue and exchanges passively, opens its
consuming channel and its ``RouteConsumer``, attaches the route's ``Settler`` (which
settles each delivery: publish, ack) to the session's publishing connection and lane,
and on a stop or a reload drains (acks held until nothing is on its way, cancel, settle
what is held within the grace, close). A lost channel or a missing entity pauses the
route, which reopens with backoff; a broker's 406 for a delivery held past its
consumer_timeout makes the route hold by that timeout from then on. A route consumes on
one channel and publishes on others (``sidecar.relay.lane``), so that a publish the
broker refuses by closing its channel requeues nothing. Its consumer's window follows the
bodies it sees (``sidecar.flow.window``). The decisions are ``sidecar.settle``'s; this
module carries them out, and keeps the route's state (``RouteState``) and its
rate-limited log lines (``RouteLog``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.flow import Backoff
from sidecar.observe import RouteLog
from sidecar.relay.consumer import InFlightWindow, RouteConsumer, blocked_of
from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.relay.state import RouteState
from sidecar.relay.tasks import RouteTasks
from sidecar.relay.waits import first_of, sleep_unless
from sidecar.settle import (
    consumer_timeout_after,
    quarantine_deadline_s,
    read_permission_named,
)

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Any

    from sidecar.amqp import Consumer, RelayConnection
    from sidecar.relay.context import RouteContext

__all__ = ["RouteWorker"]

log = logging.getLogger("sidecar.relay")

HEALTHY_CHANNEL_S = 30.0  # a channel that lived this long resets the reopen backoff
# A drain waits at most this long for its consumer's window to fill before the cancel: a
# backlog fills it within a round trip, a trickle may never (docs/decisions/0030).
DRAIN_FILL_MAX_S = 2.0


class RouteWorker:
    """Consumes one route's staging queue and settles every delivery it receives."""

    def __init__(self, context: RouteContext) -> None:
        route = self.route = context.route
        self._quarantine_exchange = context.quarantine_exchange
        self._clock = context.clock
        self._backoff = Backoff(rng=context.rng)
        self._stop = asyncio.Event()
        self._replaced = False  # a reload stopped or restarted the route: the process goes on
        self._log = RouteLog(route.name)
        self.state = RouteState(
            route.name, metrics=context.metrics, log=self._log, clock=context.clock
        )
        # Every delivery's task, named and kept: a drain waits for them (``_drain``).
        self._tasks = RouteTasks(route.name)
        self._settler = Settler(
            context, state=self.state, log=self._log, stop=self._stop, tasks=self._tasks
        )
        self._window = InFlightWindow(
            prefetch=route.prefetch,
            budget_bytes=route.limits.max_in_flight_bytes,
            fixed=route.single_active_consumer,
        )

    @property
    def pause_reason(self) -> str | None:
        """Why the route is not consuming, or None while it is (read by /readyz)."""
        return self.state.pause_reason

    def request_stop(self, *, replaced: bool = False) -> None:
        """Stop consuming and settle what it holds (``replaced``: a reload's successor runs)."""
        if replaced:
            self._replaced = True
            self.state.hand_over()
        self.state.stopping = True
        self._stop.set()

    # --- the channels' lifecycle ---

    async def run(
        self,
        connection: RelayConnection,
        *,
        grace_s: float,
        publishing: RelayConnection | None = None,
    ) -> None:
        """Consume until stopped or the connection drops; retry a paused route with backoff.

        Publishes go on ``publishing`` (``connection`` when not given).

        The backoff is reset by progress (an ack), not by a channel that merely opened:
        a route whose every publish fails must not reopen (and requeue) in a tight loop.
        """
        state = self.state
        self._publishing: RelayConnection = publishing or connection
        try:
            while not self._stop.is_set() and connection.is_open:
                try:
                    opened = await _open_unless_stopped(
                        self._open(connection), self._stop, self.route.name
                    )
                    if opened is None:
                        break
                except (MissingEntityError, ChannelLostError) as e:
                    state.pause(read_permission_named(str(e)))
                except Exception as e:
                    # Never let one route take the others down with it.
                    log.exception("route %s: unexpected error while starting", self.route.name)
                    state.pause(f"unexpected error while starting: {e!r}")
                else:
                    consumer, lane = opened
                    since = self._clock.monotonic()
                    state.acked_since_open = False
                    reason = await self._consume_until_closed(consumer, connection)
                    held_s = consumer.oldest_unsettled_s()  # the broker's timer: the oldest
                    _learn_consumer_timeout(self._settler, self._log, reason, held_s=held_s)
                    if self._stop.is_set():
                        await self._drain(consumer, lane, connection, grace_s=grace_s)
                        break
                    if consumer.cancelled_by_broker:
                        # No more deliveries, but the channel still acks: settle what it holds
                        # first, or closing it would send that back to be redelivered. /readyz
                        # says why meanwhile.
                        state.channel_closed(reason)
                        await state.settle_in_flight(grace_s)
                    if (
                        state.acked_since_open
                        or self._clock.monotonic() - since > HEALTHY_CHANNEL_S
                    ):
                        self._backoff.reset()  # it worked for a while: a fresh failure, not a loop
                    state.channel_closed(reason)
                    await _close_both(consumer, lane)
                await sleep_unless(self._stop, self._backoff.next_delay())
        finally:
            # What is left has no channel to ack on: the broker has it back.
            await self._tasks.cancel()
        state.stopped()
        self._log.stopped()

    async def _open(self, connection: RelayConnection) -> tuple[RouteConsumer, PublishLane]:
        route = self.route
        await connection.check_queue(route.queue)
        await connection.check_exchange(route.exchange)
        await connection.check_exchange(self._quarantine_exchange)
        lane = PublishLane(self._publishing, stop=self._stop)
        try:
            await lane.open()
            # Slow start: the first consumer's window is small, and grows (or shrinks) by
            # re-consuming as content headers tell the bodies' sizes (RouteConsumer.follow).
            channel: Consumer = await connection.channel(prefetch=self._window.start())
            # Bodies a closed channel's deliveries still hold count against this one's budget.
            self.state.carry_over(channel.carry)
        except BaseException:
            await lane.close()
            raise
        consumer = RouteConsumer(
            channel,
            route=route.name,
            queue=route.queue,
            window=self._window,
            state=self.state,
            settle=self._settler.offer,
            clock=self._clock,
            max_body_bytes=route.limits.max_body_bytes,
        )
        self._settler.attach(self._publishing, lane)
        # Up before the first delivery can arrive, so a delivery's pause is not undone.
        self.state.consuming(queue=route.queue, exchange=route.exchange)
        try:
            await consumer.start()
        except BaseException:
            await _close_both(consumer, lane)
            raise
        return consumer, lane

    async def _consume_until_closed(
        self, consumer: RouteConsumer, connection: RelayConnection
    ) -> str:
        """Wait until the channel or connection closes, or a stop; return what happened.

        Meanwhile the consumer's window follows the bodies seen; a change that fails ends
        the channel too.
        """
        follow = asyncio.create_task(
            consumer.follow(connection, self._publishing), name=f"follow:{self.route.name}"
        )
        try:
            which, first = await first_of(
                consumer.wait_closed(), connection.wait_closed(), self._stop.wait(), follow
            )
        finally:
            # A re-consume cut short puts its ack gate back as it ends: a drain must start
            # after that, or the gate it holds for its own cancel would be let go under it.
            follow.cancel()
            await asyncio.wait((follow,))
        if which in (0, 3):
            return str(first.result())
        return ("connection lost", "stopping")[which - 1]

    async def _drain(
        self,
        consumer: RouteConsumer,
        lane: PublishLane,
        connection: RelayConnection,
        *,
        grace_s: float,
    ) -> None:
        """Stop deliveries, settle in-flight work within the grace period, close.

        The cancel waits until nothing is on its way to the consumer, as a re-consume's
        does (``RouteConsumer.cancel``). While the broker blocks the publishing connection
        (the consuming one, when it is another, is never blocked), nothing held can be
        published: the held deliveries are let go at once, and no cancel is sent. A cancel
        would pass a single active consumer's role to another consumer while they are
        still unacked here, and they would come back behind what it took; the channel's
        close gives them back as the consumer goes. A reload closes the channels (the
        route's successor is then the queue's only consumer from this process; a blocked
        connection reads the close as it unblocks); a process stop closes the consuming
        channel unless its connection is blocked, and leaves the rest to the connection's
        close.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if blocked_of(connection, self._publishing) is not None:
            await self.state.settle_in_flight(grace_s)
            await self._tasks.wait(deadline - loop.time())
            if self._replaced:
                await _close_both(consumer, lane)
            elif connection.blocked_reason is None:
                await consumer.close()  # its nack gives back for free on 4.3 (0068)
            return
        await consumer.cancel(fill_s=min(DRAIN_FILL_MAX_S, grace_s))
        await self.state.settle_in_flight(deadline - loop.time())
        await self._tasks.wait(deadline - loop.time())
        await _close_both(consumer, lane)


async def _open_unless_stopped(
    opening_work: Coroutine[Any, Any, tuple[RouteConsumer, PublishLane]],
    stop: asyncio.Event,
    route: str,
) -> tuple[RouteConsumer, PublishLane] | None:
    """Open the route's channels, or give up when a stop comes first.

    A broker under an alarm may never answer the opening handshake; SIGTERM must not
    wait for it.
    """
    opening = asyncio.create_task(opening_work, name=f"open:{route}")
    stopping = asyncio.create_task(stop.wait(), name=f"stop:{route}")
    try:
        await asyncio.wait((opening, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if opening.done():
        opened = opening.result()
        if not stop.is_set():
            return opened
        await _close_both(*opened)
        return None
    opening.cancel()
    await asyncio.wait((opening,))
    if not opening.cancelled() and opening.exception() is None:
        # Opened although cancelled (a cancellation lost in the library, or the open
        # finishing as it came): it must not go on consuming with a replaced config.
        await _close_both(*opening.result())
    return None


async def _close_both(consumer: RouteConsumer, lane: PublishLane) -> None:
    # Together: each waits for its close-ok (bounded), which a blocked broker sends late.
    await asyncio.gather(consumer.close(), lane.close())


def _learn_consumer_timeout(
    settler: Settler, route_log: RouteLog, reason: str, *, held_s: float | None
) -> None:
    """Hold deliveries within the broker's consumer_timeout once it took one back."""
    timeout_s = consumer_timeout_after(reason, held_s=held_s, limits=settler.rules.limits)
    if timeout_s is not None:
        settler.learned_consumer_timeout(timeout_s)
        hold_s = quarantine_deadline_s(settler.rules.limits)
        route_log.took_back(held_s=held_s, timeout_s=timeout_s, hold_s=hold_s)
