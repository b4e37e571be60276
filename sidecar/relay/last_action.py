"""A delivery's last action but an ack, carried out: dead-letter, give back, let go, requeue.

What the settle step decided last, on the channel the delivery came on: a dead-letter is a
reject (requeue=false), logged at error and counted, never silent (an ack is the
``Settling``'s, which counts it whichever path acks). A give-back pauses the route and
closes the channel (the broker redelivers what it held, after the route's backoff); a
requeue is counted as a round of a body passed through, so that the next round is timed
from the first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.settle import DeadLetter, GiveBack, LetGo, Requeue

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel
    from sidecar.observe import Metrics
    from sidecar.relay.passing_rounds import PassingRounds
    from sidecar.relay.state import RouteState
    from sidecar.routemap import Route
    from sidecar.wire import Delivery

__all__ = ["LastAction"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class LastAction:
    """Carries out one route's last actions; see the module docstring."""

    def __init__(
        self,
        *,
        route: Route,
        rounds: PassingRounds,
        metrics: Metrics,
        state: RouteState,
    ) -> None:
        self._route = route
        self._rounds = rounds
        self._metrics = metrics
        self._state = state

    async def run(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        action: DeadLetter | GiveBack | LetGo | Requeue,
        *,
        started: float,
    ) -> None:
        """Carry out ``action`` for ``delivery``, consumed on ``consumer``."""
        match action:
            case DeadLetter(reason=reason):
                self._rounds.forget(delivery)
                await self.dead_letter(consumer, delivery, reason)
            case GiveBack(reason=reason):
                self._state.pause(reason)
                await consumer.close()  # the broker redelivers it, after the route's backoff
            case LetGo():
                pass  # the broker redelivers it
            case Requeue(reason=reason):
                self._rounds.again(delivery, started=started)
                await self.requeue(consumer, delivery, reason)
            case _:
                assert_never(action)

    async def dead_letter(self, consumer: AckChannel, delivery: Delivery, reason: str) -> None:
        """Reject a delivery nothing takes (requeue=false): the broker dead-letters it.

        Logged at error with the reason and counted, never silent. A channel already gone
        rejects nothing: the broker then redelivers the delivery.
        """
        route = self._route.name
        extra = {
            "route": route,
            "message_id": delivery.properties.get("message_id"),
            "queue": self._route.queue,
        }
        if await consumer.reject(delivery.delivery_tag, requeue=False):
            self._metrics.count_dead_lettered(route)
            log.error(
                "route %s rejected a message to the dead-letter exchange of queue %s"
                " (dropped by the broker if it has none): %s",
                route,
                self._route.queue,
                reason,
                extra=extra,
            )

    async def requeue(self, consumer: AckChannel, delivery: Delivery, reason: str) -> None:
        """Give a delivery back to its queue (reject, requeue=true), logged with the reason.

        A channel already gone rejects nothing: the broker then redelivers it anyway.
        """
        route = self._route.name
        if await consumer.reject(delivery.delivery_tag, requeue=True):
            log.warning(
                "route %s gave a message back to queue %s: %s",
                route,
                self._route.queue,
                reason,
                extra={
                    "route": route,
                    "message_id": delivery.properties.get("message_id"),
                    "queue": self._route.queue,
                },
            )
