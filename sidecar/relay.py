"""The I/O loop of one route: consume, publish what settlement decides, ack on the confirm.

Its one rule: a delivery is acked only after the broker confirmed its normalised copy on
the target exchange, or its quarantine copy on the quarantine exchange. Anything else
leaves it unacked, and the broker redelivers it; the one exception is a delivery neither
the target nor quarantine takes before the broker's consumer_timeout would take it back,
which is rejected (requeue=false) to the staging queue's dead-letter exchange, logged
and counted. The decisions are ``sidecar.settlement``'s (pure, unit-tested); the wire is
the AMQP client's, seen through its Protocols (``Consumer``, ``Publisher``,
``RelayConnection``). A route consumes on one channel and publishes on others
(``sidecar.publish_lane``), so that a publish the broker refuses by closing its channel
requeues nothing. Its consumer's window follows the bodies it sees (``sidecar.window``):
slow start, bounded by the route's prefetch and ``broker.max_in_flight_bytes``, changed
by a re-consume on the same channel, whose deliveries in flight are settled as any other.
This module only carries decisions out, and keeps the route's state (``RouteState``) and
its rate-limited log lines (``RouteLog``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.backoff import Backoff
from sidecar.publish_lane import PublishLane
from sidecar.route_log import RouteLog
from sidecar.route_state import RouteState
from sidecar.settler import Settler
from sidecar.waits import first_of, sleep_unless
from sidecar.window import START_WINDOW, in_flight_window, next_window, refill

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from sidecar.amqp import Consumer, RelayConnection
    from sidecar.clock import Clock
    from sidecar.delivery import Delivery
    from sidecar.metrics import Metrics
    from sidecar.routes import Route

__all__ = ["InFlightWindow", "RouteWorker"]

log = logging.getLogger(__name__)

HEALTHY_CHANNEL_S = 30.0  # a channel that lived this long resets the reopen backoff
# A re-consume's qos and consume: a broker that does not answer them in this time leaves
# the consumer unknown, so the channel is closed (and reopened) instead.
RECONSUME_TIMEOUT_S = 10.0
# How long a new consumer waits for what the old one left in flight to make room for its
# whole window; past it, it starts with what fits (deliveries held for the broker can take
# minutes to settle, and the route would consume nothing meanwhile).
REFILL_WAIT_S = 1.0


class InFlightWindow:
    """One route's consumer window and what ``sidecar.window`` decides it from.

    The largest body seen is kept across the route's channels; the consumer's window, the
    body sizes seen since it was set and whether it may still grow are per channel.
    ``note`` runs for every content header, in the client's frame handler: it counts,
    compares, and sets ``wanted`` when a change is due; the worker makes the change.
    """

    def __init__(self, *, prefetch: int, budget_bytes: int) -> None:
        self._prefetch = prefetch
        self._budget = budget_bytes
        self.largest: int | None = None
        self.allowed = prefetch  # in_flight_window for the largest body seen
        self.current = START_WINDOW
        self._seen = 0
        self._may_grow = True
        self.wanted = asyncio.Event()

    def start(self) -> int:
        """Return the window a new channel starts with: slow start, whatever was learned."""
        self.current = min(START_WINDOW, self.allowed)
        self._seen = 0
        self._may_grow = True
        self.wanted.clear()
        return self.current

    def note(self, size: int) -> None:
        """Record a delivery's body size, from its content header."""
        self._seen += 1
        largest = self.largest
        if largest is not None and size <= largest and not self._may_grow:
            return  # the common case: only a larger body can change anything now
        if largest is None or size > largest:
            self.largest = size
            self.allowed = in_flight_window(
                prefetch=self._prefetch, budget_bytes=self._budget, largest_bytes=size
            )
        if self.target() is not None:
            self.wanted.set()
        elif self._seen >= self.current:
            # A whole window seen and still no growth: none can come later either (the
            # allowed window only shrinks), so stop asking.
            self._may_grow = False

    def target(self) -> int | None:
        """Return the window the consumer should move to now, or None."""
        return next_window(
            current=self.current,
            allowed=self.allowed,
            prefetch=self._prefetch,
            seen=self._seen,
            may_grow=self._may_grow,
        )

    def applied(self, window: int, *, whole: bool) -> None:
        """Record the new consumer's window; not ``whole``: it had to start smaller."""
        self.current = window
        self._seen = 0
        # Smaller because deliveries stayed in flight past REFILL_WAIT_S (held ones): the
        # next growth would wait for them again, so the channel keeps this window.
        self._may_grow = self._may_grow and whole
        if self.target() is not None:
            self.wanted.set()


class RouteWorker:
    """Consumes one route's staging queue and settles every delivery it receives."""

    def __init__(
        self,
        route: Route,
        *,
        quarantine_exchange: str,
        login: str,
        metrics: Metrics,
        clock: Clock,
        new_id: Callable[[], str],
        rng: random.Random | None = None,
    ) -> None:
        self.route = route
        self._quarantine_exchange = quarantine_exchange
        self._clock = clock
        self._backoff = Backoff(rng=rng or random.Random())  # noqa: S311 - jitter, not security
        self._stop = asyncio.Event()
        self._log = RouteLog(route.name)
        self.state = RouteState(route.name, metrics=metrics, log=self._log, clock=clock)
        self._settler = Settler(
            route,
            quarantine_exchange=quarantine_exchange,
            login=login,
            metrics=metrics,
            clock=clock,
            new_id=new_id,
            state=self.state,
            log=self._log,
            stop=self._stop,
            rng=self._backoff.rng,
        )
        # A channel's first consumer is acemq-sidecar.<route>, each re-consume on it
        # acemq-sidecar.<route>#<n>: unique on the channel ("#" is not in route names).
        self._tag_base = f"acemq-sidecar.{route.name}"
        self._consumer_tag = self._tag_base
        self._consumers = 1  # consumers started on the current channel
        self._deliver: Callable[[Delivery], Coroutine[Any, Any, None]] | None = None
        self._window = InFlightWindow(
            prefetch=route.prefetch, budget_bytes=route.limits.max_in_flight_bytes
        )

    @property
    def pause_reason(self) -> str | None:
        """Why the route is not consuming, or None while it is (read by /readyz)."""
        return self.state.pause_reason

    def request_stop(self, *, replaced: bool = False) -> None:
        """Ask the worker to stop consuming and settle what it holds.

        ``replaced``: a successor runs the same route now (a reload), so this worker must
        no longer report the route up or down.
        """
        if replaced:
            self.state.hand_over()
        self.state.stopping = True
        self._stop.set()

    # --- the channels' lifecycle ---

    async def run(self, connection: RelayConnection, *, grace_s: float) -> None:
        """Consume until stopped or the connection drops; retry a paused route with backoff.

        The backoff is reset by progress (an ack), not by a channel that merely opened:
        a route whose every publish fails must not reopen (and requeue) in a tight loop.
        """
        state = self.state
        while not self._stop.is_set() and connection.is_open:
            try:
                opened = await self._open_unless_stopped(connection)
                if opened is None:
                    break
            except (MissingEntityError, ChannelLostError) as e:
                state.pause(str(e))
            except Exception as e:
                # Never let one route take the others down with it.
                log.exception("route %s: unexpected error while starting", self.route.name)
                state.pause(f"unexpected error while starting: {e!r}")
            else:
                consumer, lane = opened
                since = self._clock.monotonic()
                state.acked_since_open = False
                reason = await self._consume_until_closed(consumer, connection)
                if self._stop.is_set():
                    await self._drain(consumer, lane, connection, grace_s=grace_s)
                    break
                if state.acked_since_open or self._clock.monotonic() - since > HEALTHY_CHANNEL_S:
                    self._backoff.reset()  # it worked for a while: a fresh failure, not a loop
                state.channel_closed(reason)
                await consumer.close()
                await lane.close()
            await sleep_unless(self._stop, self._backoff.next_delay())
        state.stopped()
        self._log.stopped()

    async def _open_unless_stopped(
        self, connection: RelayConnection
    ) -> tuple[Consumer, PublishLane] | None:
        """Open the route's channels, or give up when a stop comes first.

        A broker under an alarm may never answer the opening handshake; SIGTERM must not
        wait for it.
        """
        opening = asyncio.create_task(self._open(connection), name=f"open:{self.route.name}")
        stopping = asyncio.create_task(self._stop.wait(), name=f"stop:{self.route.name}")
        try:
            await asyncio.wait((opening, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if opening.done():
            opened = opening.result()
            if not self._stop.is_set():
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

    async def _open(self, connection: RelayConnection) -> tuple[Consumer, PublishLane]:
        route = self.route
        await connection.check_queue(route.queue)
        await connection.check_exchange(route.exchange)
        await connection.check_exchange(self._quarantine_exchange)
        lane = PublishLane(connection)
        try:
            await lane.open()
            # Slow start: the first consumer's window is small, and grows (or shrinks) by
            # re-consuming as content headers tell the bodies' sizes (_follow_window).
            consumer: Consumer = await connection.channel(prefetch=self._window.start())
        except BaseException:
            await lane.close()
            raise
        settler = self._settler

        async def on_delivery(delivery: Delivery) -> None:
            await settler.settle(consumer, delivery)

        settler.attach(connection, lane)
        self._deliver = on_delivery
        self._consumer_tag, self._consumers = self._tag_base, 1
        # Up before the first delivery can arrive, so a delivery's pause is not undone.
        self.state.consuming(queue=route.queue, exchange=route.exchange)
        try:
            await consumer.consume(
                route.queue,
                on_delivery,
                consumer_tag=self._consumer_tag,
                on_body_size=self._window.note,
            )
        except BaseException:
            await _close_both(consumer, lane)
            raise
        return consumer, lane

    async def _consume_until_closed(self, consumer: Consumer, connection: RelayConnection) -> str:
        """Wait until the channel or connection closes, or a stop; return what happened.

        Meanwhile the consumer's window follows the bodies seen; a change that fails ends
        the channel too. A stop cancels a change half-way: ``_consumer_tag`` is the new
        tag from before its consume is sent, so the drain's cancel covers whichever
        consumer the broker has.
        """
        which, first = await first_of(
            consumer.wait_closed(),
            connection.wait_closed(),
            self._stop.wait(),
            self._follow_window(consumer, connection),
        )
        if which in (0, 3):
            return str(first.result())
        return ("connection lost", "stopping")[which - 1]

    # --- the consumer's window ---

    async def _follow_window(self, consumer: Consumer, connection: RelayConnection) -> str:
        """Re-consume whenever the window should change; return why, if a change failed."""
        window = self._window
        while True:
            await window.wanted.wait()
            if connection.blocked_reason is not None:
                # The broker reads nothing from a blocked connection: a qos or a cancel
                # now would only time out. Deliveries keep to the current window meanwhile.
                await connection.wait_unblocked()
                if not connection.is_open:
                    return "connection lost"
                continue
            window.wanted.clear()
            if window.target() is None:
                continue
            try:
                reason = await self._reconsume(consumer)
            except (ChannelLostError, MissingEntityError) as e:
                return str(e)
            except Exception as e:
                log.exception("route %s: unexpected error while re-consuming", self.route.name)
                return f"unexpected error while re-consuming: {e!r}"
            if reason is not None:
                return reason

    async def _reconsume(self, consumer: Consumer) -> str | None:
        """Move the route to a new consumer on the same channel; return why not, if it failed.

        Cancel first, and wait for the cancel-ok: after it nothing more comes for the old
        tag, and what it delivered stays unacked on the channel, settled as any other
        delivery (never requeued). Then qos and consume under a new tag, once what the old
        consumer left in flight leaves room (``sidecar.window.refill``).
        """
        window, old, old_tag = self._window, self._window.current, self._consumer_tag
        if not await consumer.cancel(old_tag):
            return f"the broker did not confirm the cancel of consumer {old_tag}"
        if consumer.consumer_cancelled:
            return None  # the broker's own cancel: wait_closed has returned, run takes over
        # A body larger than the target may have come before the cancel-ok.
        new = window.target() or old
        take = await self._room_for(old=old, new=new)
        self._consumers += 1
        tag = self._consumer_tag = f"{self._tag_base}#{self._consumers}"
        assert self._deliver is not None  # noqa: S101 - set when the channel opened
        try:
            async with asyncio.timeout(RECONSUME_TIMEOUT_S):
                await consumer.qos(take)
                await consumer.consume(
                    self.route.queue, self._deliver, consumer_tag=tag, on_body_size=window.note
                )
        except TimeoutError:
            return f"the broker did not answer the re-consume within {RECONSUME_TIMEOUT_S:g}s"
        window.applied(take, whole=take == new)
        extra = {"route": self.route.name, "window": take, "largest_bytes": window.largest}
        if take < old:
            log.info(
                "route %s: window %d -> %d for bodies of up to %s bytes",
                self.route.name,
                old,
                take,
                window.largest,
                extra=extra,
            )
        else:
            log.debug("route %s: window %d -> %d", self.route.name, old, take, extra=extra)
        return None

    async def _room_for(self, *, old: int, new: int) -> int:
        """Return the window the new consumer may start with, waiting for room if need be."""
        state, window = self.state, self._window

        def room() -> int:
            return refill(old=old, new=new, allowed=window.allowed, in_flight=state.in_flight)

        # In flight counts every delivery handed over before the cancel-ok: each one's
        # task starts (and counts itself) before the cancel's waiter resumes.
        if room() < new:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFILL_WAIT_S):
                    await state.wait_in_flight_at_most(max(old, window.allowed) - new)
        while room() == 0:  # every slot held: as the old consumer would, take nothing yet
            await state.wait_in_flight_at_most(max(old, window.allowed) - 1)
        return room()

    async def _drain(
        self, consumer: Consumer, lane: PublishLane, connection: RelayConnection, *, grace_s: float
    ) -> None:
        """Stop deliveries, settle in-flight work within the grace period, close.

        While the broker blocks the connection it reads nothing, so a cancel would only
        wait for its bound: the held deliveries are let go at once (they publish nothing
        while blocked) and the channels are left to the connection's close.
        """
        state = self.state
        deadline = asyncio.get_running_loop().time() + grace_s
        is_blocked = connection.blocked_reason is not None
        if not is_blocked:
            await consumer.cancel(self._consumer_tag)
        extra = {"route": self.route.name, "in_flight": state.in_flight}
        log.info(
            "route %s draining %d in-flight messages", self.route.name, state.in_flight, extra=extra
        )
        try:
            async with asyncio.timeout_at(deadline):
                await state.idle.wait()
        except TimeoutError:
            extra = {"route": self.route.name, "in_flight": state.in_flight}
            log.warning(
                "route %s: %d messages unsettled after %.1fs; the broker will redeliver them",
                self.route.name,
                state.in_flight,
                grace_s,
                extra=extra,
            )
        if not is_blocked:
            await _close_both(consumer, lane)


async def _close_both(consumer: Consumer, lane: PublishLane) -> None:
    await consumer.close()
    await lane.close()
