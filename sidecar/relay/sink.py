"""Where a route's settled deliveries and the settle step's events go: one sink per route.

Metrics, the route log and the route's state hear of a delivery only from here: its start
(``begin``), what the step saw (``observe``), an acked delivery counted (``acked``), a
dead-letter counted and logged at error (``dead_lettered``, never silent), a requeue
logged (``requeued``), its end (``finished``), and a route paused with its channel closed
(``give_back``), whichever path settled it (the frame handler or the delivery's task).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.contract import producer_of
from sidecar.relay.state import HeldDelivery
from sidecar.settle import (
    Bug,
    Held,
    Left,
    Quarantined,
    RetriedCopy,
    ReturnRetried,
    RoutedOnRetry,
    Violations,
)

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel
    from sidecar.clock import Clock
    from sidecar.contract import Publishers
    from sidecar.observe import Metrics, RouteLog
    from sidecar.relay.context import RouteContext
    from sidecar.relay.state import RouteState
    from sidecar.settle import Event, Outcome
    from sidecar.wire import Delivery

__all__ = ["RouteSink"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class RouteSink:
    """One route's sink for what its deliveries came to; see the module docstring."""

    __slots__ = (
        "_clock",
        "_log",
        "_metrics",
        "_publishers",
        "_queue",
        "_route",
        "_state",
        "monotonic",
    )

    def __init__(
        self,
        route: str,
        *,
        publishers: Publishers,
        metrics: Metrics,
        route_log: RouteLog,
        state: RouteState,
        clock: Clock,
        queue: str,
    ) -> None:
        self._route = route
        self._queue = queue  # the route's staging queue
        self._publishers = publishers
        self._metrics = metrics
        self._log = route_log
        self._state = state
        self._clock = clock
        self.monotonic = clock.monotonic

    @classmethod
    def of(cls, context: RouteContext, *, route_log: RouteLog, state: RouteState) -> RouteSink:
        """Return the sink of the context's route."""
        route = context.route
        return cls(
            route.name,
            publishers=route.publishers,
            metrics=context.metrics,
            route_log=route_log,
            state=state,
            clock=context.clock,
            queue=route.queue,
        )

    def observe(self, events: tuple[Event, ...], delivery: Delivery, held: HeldDelivery) -> None:
        """Hand what the step saw to metrics, the route log and the route's state."""
        route = self._route
        for event in events:
            match event:
                case Held(reason=reason):
                    held.take(reason)
                case RetriedCopy():
                    self._metrics.count_retried_copy(route)
                case ReturnRetried():
                    self._metrics.count_return_retry(route, routed=False)
                case RoutedOnRetry():
                    self._metrics.count_return_retry(route, routed=True)
                case Violations(verdict=verdict):
                    producer = producer_of(
                        delivery.headers, delivery.properties, publishers=self._publishers
                    )
                    self._metrics.count_violations(
                        route,
                        [(str(v.kind), v.header) for v in verdict.violations],
                        producer=producer,
                    )
                    self._log.violations(verdict, delivery, now=self._clock.monotonic())
                case Quarantined(reason=reason):
                    self._log.quarantined(reason, delivery, now=self._clock.monotonic())
                case Bug(while_=while_, error=error):
                    log.error("route %s: %s", route, while_, exc_info=error)
                case Left(reason=reason):
                    log.debug("route %s: delivery left to the broker: %s", route, reason)
                case _:
                    assert_never(event)

    def begin(self, delivery: Delivery) -> HeldDelivery:
        """Count a delivery in flight from now on; its share in the route's holds."""
        size = len(delivery.body)
        generation = self._state.begin(size)
        return HeldDelivery(self._state, delivery, size=size, generation=generation)

    def acked(self, outcome: Outcome, *, started: float, held: HeldDelivery) -> None:
        """Count a delivery acked with ``outcome``, ``started`` on the monotonic clock."""
        self._metrics.observe_message(self._route, outcome, self._clock.monotonic() - started)
        held.release()
        self._state.settled()

    def finished(self, held: HeldDelivery) -> None:
        """End a delivery's part in the route's state, however it ended."""
        held.release()
        self._state.end(held.size, held.generation)

    def dead_lettered(self, delivery: Delivery, reason: str) -> None:
        """Count a delivery rejected to its queue's dead-letter exchange; log it at error."""
        route, queue = self._route, self._queue
        self._metrics.count_dead_lettered(route)
        log.error(
            "route %s rejected a message to the dead-letter exchange of queue %s"
            " (dropped by the broker if it has none): %s",
            route,
            queue,
            reason,
            extra=_extra(route, delivery, queue),
        )

    def requeued(self, delivery: Delivery, reason: str) -> None:
        """Log a delivery given back to its queue, with the reason."""
        route, queue = self._route, self._queue
        log.warning(
            "route %s gave a message back to queue %s: %s",
            route,
            queue,
            reason,
            extra=_extra(route, delivery, queue),
        )

    async def give_back(
        self,
        consumer: AckChannel,
        held: HeldDelivery | None,
        reason: str,
        *,
        bug: Exception | None = None,
    ) -> None:
        """Pause the route with ``reason`` and close the delivery's channel.

        The broker redelivers what the channel holds, after the route's backoff. ``bug``:
        logged with its traceback first. ``held``: the delivery ends here too.
        """
        try:
            if bug is not None:
                log.error("route %s: a delivery could not be settled", self._route, exc_info=bug)
            self._state.pause(reason)
            await consumer.close()
        finally:
            if held is not None:
                self.finished(held)


def _extra(route: str, delivery: Delivery, queue: str) -> dict[str, object]:
    """Return a log line's fields for one message of the route."""
    return {"route": route, "message_id": delivery.properties.get("message_id"), "queue": queue}
