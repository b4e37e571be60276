"""Whether one route consumes, why not, and what it holds: what /readyz and route_up say."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.clock import Clock
    from sidecar.observe import Metrics, RouteLog
    from sidecar.wire import Delivery

__all__ = ["HeldDelivery", "RouteState"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class RouteState:
    """Whether one route consumes, why not, and what it holds: what /readyz and route_up say.

    The only writer of the route's ``route_up`` and ``in_flight`` series. A route is up
    while its channel consumes and no delivery is held; a held delivery (the broker will
    not take its copy for now) keeps it paused until that delivery is settled or let go
    (the broker took it back): when the last one goes and the channel consumes, the
    route is up again, whether or not another message ever comes.
    """

    def __init__(self, route: str, *, metrics: Metrics, log: RouteLog, clock: Clock) -> None:
        self._route = route
        self._metrics = metrics
        self._log = log
        self._clock = clock
        self.pause_reason: str | None = "starting"
        self.stopping = False
        self.held = 0  # deliveries waiting for the broker to take their copy
        self.in_flight = 0
        self.body_bytes = 0  # the bodies the deliveries in flight hold
        # Consuming channels opened so far; each delivery keeps the one it came on.
        self._generation = 0
        self._carried = 0  # bytes of deliveries from closed channels, counted by the open one
        self._carry: Callable[[int], None] | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self._fewer: list[tuple[int, asyncio.Future[None]]] = []  # (at most, waiter)
        self.acked_since_open = False
        self._channel_consumes = False
        self._paused_by_hold = False  # the pause is the held deliveries', nothing else's
        # False once a reload has handed the route's gauge to this worker's successor.
        self._owns_gauge = True

    def hand_over(self) -> None:
        """Leave the route's route_up to a successor that runs the route now (a reload)."""
        self._owns_gauge = False

    def consuming(self, *, queue: str, exchange: str) -> None:
        """Record that the channel consumes; up unless deliveries held on an old one remain."""
        self._channel_consumes = True
        self._paused_by_hold = self.held > 0
        if self.held == 0:
            self.pause_reason = None
            self._set_up(up=True)
        log.info(
            "route %s consuming %s -> exchange %r",
            self._route,
            queue,
            exchange,
            extra={"route": self._route},
        )

    def pause(self, reason: str, *, by_hold: bool = False) -> None:
        """Record that the route cannot consume or settle for now, and why (unless stopping).

        ``by_hold``: a held delivery's reason, which ends when the last held one goes.
        """
        if self.stopping:
            return
        self._paused_by_hold = by_hold
        self._set_up(up=False)
        was_up = self.pause_reason is None
        self._log.paused(reason, now=self._clock.monotonic(), was_up=was_up)
        self.pause_reason = reason

    def channel_closed(self, reason: str) -> None:
        """Record that the route's channel closed (the worker reopens it with backoff)."""
        self._channel_consumes = False
        self.pause(reason)

    def settled(self) -> None:
        """Record an acked delivery: once nothing is held, the route works (again)."""
        self.acked_since_open = True
        self._resume_if_free()

    def released(self) -> None:
        """Record that a held delivery went (settled, or let go to the broker)."""
        self.held -= 1
        if self.held == 0 and self._paused_by_hold:
            self._resume_if_free()

    def _resume_if_free(self) -> None:
        if (
            self.pause_reason is not None
            and self.held == 0
            and self._channel_consumes
            and not self.stopping
        ):
            log.info("route %s resumed", self._route, extra={"route": self._route})
            self.pause_reason = None
            self._paused_by_hold = False
            self._set_up(up=True)

    def stopped(self) -> None:
        """Record that the worker ended: the route is down."""
        self._channel_consumes = False
        self._set_up(up=False)
        if self.pause_reason is None:
            self.pause_reason = "stopped"

    def begin(self, size: int = 0) -> int:
        """Count a delivery that arrived as in flight, holding ``size`` bytes of body.

        Return the consuming channel's generation, for ``end``.
        """
        self.in_flight += 1
        self.body_bytes += size
        self.idle.clear()
        self._metrics.add_in_flight(self._route, 1)
        return self._generation

    def carry_over(self, carry: Callable[[int], None]) -> None:
        """Count what the deliveries in flight hold against a new consuming channel's budget.

        Their channel closed (the broker's consumer timeout during an alarm, say) while
        their copies wait for confirms: their bodies stay held, and the new channel must
        not read a whole budget beside them. ``carry`` is told the bytes held, and each
        release as those deliveries end.
        """
        self._generation += 1
        self._carried = self.body_bytes
        self._carry = carry
        if self._carried:
            carry(self._carried)

    def end(self, size: int = 0, generation: int | None = None) -> None:
        """Count a delivery settled or let go as no longer in flight (``begin``'s values)."""
        self.in_flight -= 1
        self.body_bytes -= size
        if generation is not None and generation < self._generation and self._carried:
            released = min(size, self._carried)
            self._carried -= released
            if released and self._carry is not None:
                self._carry(-released)
        self._metrics.add_in_flight(self._route, -1)
        if self.in_flight == 0:
            self.idle.set()
        if self._fewer:
            for count, waiter in self._fewer:
                if self.in_flight <= count and not waiter.done():
                    waiter.set_result(None)

    async def settle_in_flight(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` until every delivery the route holds is settled."""
        route = self._route
        log.info(
            "route %s draining %d in-flight messages",
            route,
            self.in_flight,
            extra={"route": route, "in_flight": self.in_flight},
        )
        try:
            async with asyncio.timeout(max(grace_s, 0.0)):
                await self.idle.wait()
        except TimeoutError:
            log.warning(
                "route %s: %d messages unsettled after %.1fs; unacked, they go back to their"
                " queue (if it still exists) to be redelivered",
                route,
                self.in_flight,
                grace_s,
                extra={"route": route, "in_flight": self.in_flight},
            )

    async def wait_in_flight_at_most(self, count: int) -> None:
        """Return once at most ``count`` deliveries are in flight (at once if so now)."""
        if self.in_flight <= count:
            return
        entry = (count, asyncio.get_running_loop().create_future())
        self._fewer.append(entry)
        try:
            await entry[1]
        finally:
            self._fewer.remove(entry)

    def _set_up(self, *, up: bool) -> None:
        if self._owns_gauge:
            self._metrics.set_route_up(self._route, up=up)


class HeldDelivery:
    """One delivery's share in its route's count of held deliveries (and the delivery)."""

    __slots__ = ("_held", "_state", "delivery", "generation", "size")

    def __init__(
        self,
        state: RouteState,
        delivery: Delivery | None = None,
        *,
        size: int = 0,
        generation: int | None = None,
    ) -> None:
        self._state = state
        self._held = False
        self.delivery = delivery
        self.size = size  # the bytes of body it holds
        self.generation = generation  # of the consuming channel it came on

    def take(self, reason: str) -> None:
        """Count the delivery as held (once) and pause the route with the reason."""
        if not self._held:
            self._held = True
            self._state.held += 1
        self._state.pause(reason, by_hold=True)

    def release(self) -> None:
        """Stop counting the delivery as held (it was settled or let go)."""
        if self._held:
            self._held = False
            self._state.released()
