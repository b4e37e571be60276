"""A delivery's last action, carried out: ack, dead-letter, give back, let go or requeue.

What the settle step decided last, on the channel the delivery came on. An ack counts the
delivery as settled with its outcome; a give-back pauses the route and closes the channel
(the broker redelivers what it held, after the route's backoff); a requeue is counted as a
round of a body passed through, so that the next round is timed from the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from sidecar.settle import Ack, DeadLetter, GiveBack, LetGo, Requeue

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel
    from sidecar.relay.publisher import PlanPublisher
    from sidecar.relay.rounds import PassingRounds
    from sidecar.relay.sink import RouteSink
    from sidecar.relay.state import HeldDelivery, RouteState
    from sidecar.wire import Delivery

__all__ = ["LastAction"]


class LastAction:
    """Carries out one route's last actions; see the module docstring."""

    def __init__(
        self,
        *,
        rounds: PassingRounds,
        sink: RouteSink,
        publisher: PlanPublisher,
        state: RouteState,
    ) -> None:
        self._rounds = rounds
        self._sink = sink
        self._publisher = publisher
        self._state = state

    async def run(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        action: Ack | DeadLetter | GiveBack | LetGo | Requeue,
        *,
        started: float,
    ) -> None:
        """Carry out ``action`` for ``delivery``, consumed on ``consumer``."""
        match action:
            case Ack(outcome=outcome):
                self._rounds.forget(delivery)
                if await consumer.ack(delivery.delivery_tag):
                    self._sink.acked(outcome, started=started, held=held)
            case DeadLetter(reason=reason):
                self._rounds.forget(delivery)
                await self._publisher.dead_letter(consumer, delivery, reason)
            case GiveBack(reason=reason):
                self._state.pause(reason)
                await consumer.close()  # the broker redelivers it, after the route's backoff
            case LetGo():
                pass  # the broker redelivers it
            case Requeue(reason=reason):
                self._rounds.again(delivery, started=started)
                await self._publisher.requeue(consumer, delivery, reason)
            case _:
                assert_never(action)
