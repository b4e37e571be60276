"""The I/O of one delivery: plan once, publish until the broker takes it, ack.

``Settler`` carries out what ``sidecar.settlement`` decides for each delivery a route's
``RouteWorker`` hands it: the plan made once, each publish of it (``PlanPublisher``, on the
route's publish lane), the holds with their own backoff on a channel that stays open, and
the ack on the channel the delivery came on. Its one rule is the relay's: a delivery is
acked only after the broker confirmed its normalised copy, or its quarantine copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.backoff import Backoff
from sidecar.contract import Policy
from sidecar.contract.producers import producer_of
from sidecar.plan_publisher import PlanPublisher
from sidecar.route_state import HeldDelivery
from sidecar.routes import Mode
from sidecar.settlement import (
    Alone,
    DeadLetter,
    Done,
    Hold,
    Outcome,
    Quarantine,
    Target,
    internal_error,
    plan_delivery,
)
from sidecar.settlement_holds import HoldLimits, Wait, after_hold, blocked
from sidecar.waits import first_of, sleep_unless

if TYPE_CHECKING:
    import asyncio
    import random

    from sidecar.amqp import AckChannel, RelayConnection
    from sidecar.publish_lane import PublishLane
    from sidecar.route_context import RouteContext
    from sidecar.route_log import RouteLog
    from sidecar.route_state import RouteState
    from sidecar.settlement import Plan
    from sidecar.wire import Delivery

__all__ = ["Settler"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class _Retries:
    """How one delivery's current plan has been retried so far."""

    __slots__ = ("alone", "attempts", "backoff")

    def __init__(self, *, rng: random.Random) -> None:
        self.backoff = Backoff(rng=rng)
        self.attempts = 0  # publishes of this plan the broker held back
        self.alone = False  # publish on a channel of its own (once a refusal was ambiguous)

    def restart(self) -> _Retries:
        """Count and back off afresh for a new plan (the quarantine copy); alone stays."""
        self.attempts = 0
        self.backoff.reset()
        return self


class Settler:
    """Settles one route's deliveries: plan once, publish until the broker takes it, ack.

    The plan and the reading of every broker answer are ``sidecar.settlement``'s; this
    class runs the loop they call for and acks, its ``PlanPublisher`` publishes each time
    (and rejects what nothing takes).
    """

    def __init__(
        self,
        context: RouteContext,
        *,
        state: RouteState,
        log: RouteLog,
        stop: asyncio.Event,
    ) -> None:
        route = self.route = context.route
        self._target = Target(
            queue=route.queue,
            exchange=route.exchange,
            routing_key=route.routing_key,
            audit=route.mode is Mode.AUDIT,
            policy=Policy(publishers=route.publishers, origin=route.origin, login=context.login),
        )
        # Lowered by the worker once the broker took a delivery back (its consumer_timeout).
        self.limits = HoldLimits(
            consumer_timeout_s=route.limits.consumer_timeout_s,
            nack_max_attempts=route.limits.nack_max_attempts,
            nack_max_s=route.limits.nack_max_s,
        )
        self._metrics = context.metrics
        self._clock = context.clock
        self._new_id = context.new_id
        self._state = state
        self._log = log
        self._stop = stop
        self._rng = context.rng
        self._publisher = PlanPublisher(context, stop=stop)
        self._lane: PublishLane | None = None
        self._connection: RelayConnection | None = None

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane`` from now on, and watch ``connection`` for a broker's block."""
        self._lane = lane
        self._connection = connection

    async def settle(self, consumer: AckChannel, delivery: Delivery) -> None:
        """Settle one delivery: publish what the plan says until the broker takes it, then ack.

        The plan is made once. When the broker will not take a copy for now (``Hold``), the
        delivery is held and retried with its own backoff, bounded by the route's limits:
        closing its channel would requeue it, and a quorum queue counts every requeue
        against its delivery limit. A publish without a confirm is never sent twice: its
        first outcome is awaited however long it takes.
        """
        state, route = self._state, self.route.name
        state.begin()
        started = self._clock.monotonic()
        held = HeldDelivery(state)
        try:
            lane = self._lane
            assert lane is not None  # noqa: S101 - attached before consuming starts
            result = await self._carry_out(consumer, lane, delivery, held, started=started)
            if isinstance(result, DeadLetter):
                await self._publisher.dead_letter(consumer, delivery, result.reason)
            elif result is not None and await consumer.ack(delivery.delivery_tag):
                self._metrics.observe_message(route, result, self._clock.monotonic() - started)
                held.release()
                state.settled()
        except MissingEntityError as e:
            # The passive checks of a reopen say when it exists again; till then the
            # deliveries wait in staging, not here.
            state.pause(str(e))
            await consumer.close()
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", route, e)
        except Exception:
            log.exception("route %s: a delivery could not be settled", route)
            state.pause("internal error; see the log")
            await consumer.close()  # the broker redelivers it, after the route's backoff
        finally:
            held.release()
            state.end()

    def _plan(self, delivery: Delivery) -> Plan:
        """Plan the delivery once, counting and logging the contract's violations."""
        try:
            plan, verdict = plan_delivery(
                delivery, self._target, now_ms=self._clock.now_ms(), new_id=self._new_id
            )
        except Exception as e:
            log.exception("route %s: unexpected error while normalising", self.route.name)
            return internal_error(e)
        if verdict is not None and verdict.violations:
            producer = producer_of(
                delivery.headers, delivery.properties, publishers=self._target.policy.publishers
            )
            self._metrics.count_violations(
                self.route.name,
                [(str(v.kind), v.header) for v in verdict.violations],
                producer=producer,
            )
            self._log.violations(verdict, delivery, now=self._clock.monotonic())
        return plan

    async def _carry_out(
        self,
        consumer: AckChannel,
        lane: PublishLane,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        started: float,
    ) -> Outcome | DeadLetter | None:
        """Publish what the plan says until the broker takes it; None when we must let go."""
        plan = self._plan(delivery)
        retries: _Retries | None = None  # made at the first retry: most deliveries have none
        while True:
            # Stopping while blocked, or the channel it came on closing (or closed): the
            # broker redelivers it, so a copy published now would be a certain duplicate.
            if not consumer.is_open or not await self._unblocked(held) or not consumer.is_open:
                return None
            decision = await self._publisher.attempt(
                lane, delivery, plan, held, alone=retries is not None and retries.alone
            )
            after: Wait | Quarantine | DeadLetter | None
            match decision:
                case Done(outcome=outcome):
                    if isinstance(plan, Quarantine):
                        self._log.quarantined(plan.reason, delivery, now=self._clock.monotonic())
                    return outcome
                case Alone():
                    retries = self._retries(retries)
                    after = self._alone(decision, retries)
                case Hold():
                    held.take(decision.reason)
                    retries = self._retries(retries)
                    after = await self._hold(consumer, decision, plan, retries, started=started)
                case _:
                    after = decision
            match after:
                case Wait():
                    continue
                case Quarantine():
                    plan = after
                    retries = self._retries(retries).restart()
                case DeadLetter() | None:
                    return after
                case _:
                    assert_never(after)

    def _retries(self, retries: _Retries | None) -> _Retries:
        return retries if retries is not None else _Retries(rng=self._rng)

    def _alone(self, alone: Alone, retries: _Retries) -> Wait:
        """Publish the same plan again at once, alone on a channel of its own."""
        retries.alone = True
        if alone.may_duplicate:
            self._metrics.count_retried_copy(self.route.name)
        return Wait(0.0)

    async def _hold(
        self, consumer: AckChannel, hold: Hold, plan: Plan, retries: _Retries, *, started: float
    ) -> Wait | Quarantine | DeadLetter | None:
        """Wait before the plan is published again, or say where the delivery goes instead.

        None: let it go (a stop, or the broker took the channel it came on away).
        """
        retries.attempts += 1
        after = after_hold(
            hold,
            plan,
            attempts=retries.attempts,
            held_s=self._clock.monotonic() - started,
            delay_s=retries.backoff.next_delay(),
            limits=self.limits,
        )
        if isinstance(after, Wait):
            await sleep_unless(self._stop, after.delay_s)
            if self._stop.is_set() or not consumer.is_open:
                return None  # the broker redelivers it
            if hold.may_duplicate:
                self._metrics.count_retried_copy(self.route.name)
        return after

    async def _unblocked(self, held: HeldDelivery) -> bool:
        """Wait while the broker blocks the connection; False when a stop comes first.

        Nothing new is published while blocked: a copy written then would sit in the
        socket and might reach the broker after a SIGTERM gave its delivery back.
        """
        connection = self._connection
        if connection is None:
            return True
        reason = connection.blocked_reason
        if reason is None:
            return True
        held.take(blocked(reason))
        await first_of(connection.wait_unblocked(), self._stop.wait())
        return not self._stop.is_set()
