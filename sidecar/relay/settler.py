"""One route's settling: what its deliveries share while each is settled.

``Settler.offer`` takes each delivery the route's consumer hands it: the plan made once
(``sidecar.settle.begin``), then a ``Settling`` (``relay.settling``) that carries the steps
out, from the frame handler when it can (the copy published on the shared channel, the
confirm read and acked without a task), else in a task of the route's (named and owned by
``relay.tasks``). The settler makes the route's parts once (its ``Rules``, the sink its
events go to, the plan publisher, the broker's unblock line, the rounds of bodies passed
through, the slow-confirm sweep, the count of copies a later one must not overtake) and,
at each ``attach``, the ``Crew`` a delivery is settled with. Its one rule is the relay's:
a delivery is acked only after the broker confirmed its normalised copy, or its
quarantine copy.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from sidecar.contract import Policy
from sidecar.flow import RateBudget, backoff_s
from sidecar.relay.crew import Crew, Queued
from sidecar.relay.passing_rounds import PassingRounds
from sidecar.relay.publisher import CONFIRM_TIMEOUT_S, PlanPublisher
from sidecar.relay.settling import Settling
from sidecar.relay.sink import RouteSink
from sidecar.relay.slow_confirms import SlowConfirms
from sidecar.relay.tasks import RouteTasks
from sidecar.relay.unblock_line import UnblockLine
from sidecar.routemap import Mode
from sidecar.settle import HoldLimits, Rules, Target, begin

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from sidecar.amqp import AckChannel, RelayConnection
    from sidecar.observe import DeliveryTrace, RouteLog, RouteTracer
    from sidecar.relay.context import RouteContext
    from sidecar.relay.lane import PublishLane
    from sidecar.relay.state import RouteState
    from sidecar.routemap import Route
    from sidecar.wire import Delivery

__all__ = ["Settler"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class Settler:
    """Settles one route's deliveries; see the module docstring."""

    def __init__(
        self,
        context: RouteContext,
        *,
        state: RouteState,
        log: RouteLog,
        stop: asyncio.Event,
        tasks: RouteTasks | None = None,
    ) -> None:
        route = self.route = context.route
        self._target = _target_of(context)
        rng = context.rng
        self._clock = context.clock
        self.monotonic = monotonic = context.clock.monotonic
        returns = RateBudget(route.limits.return_max_per_s)
        self.rules = Rules(
            limits=_limits_of(route),
            exchange=route.exchange,
            quarantine_exchange=context.quarantine_exchange,
            route=route.name,
            returns_retried=route.limits.return_max_attempts,
            return_delay_s=route.limits.return_delay_s,
        )
        # What a step leaves to the relay: the backoff's random draw, the returns budget.
        self._backoff: Callable[[int], float] = lambda holds: backoff_s(holds, rng=rng)
        self._may_retry_return: Callable[[], bool] = lambda: returns.take(monotonic())
        self._new_id = context.new_id
        self.stop = stop
        self.tasks = tasks if tasks is not None else RouteTasks(route.name)
        self.sink = RouteSink.of(context, route_log=log, state=state)
        self.publisher = PlanPublisher(context)
        self.rounds = PassingRounds()  # of the bodies passed through, given back
        self.line = UnblockLine()  # copies waiting for the broker's unblock, in order
        self.confirms = SlowConfirms(limit_s=CONFIRM_TIMEOUT_S, monotonic=self.monotonic)
        self.queued = Queued()  # copies on a task not yet answered: none overtakes them
        self.crew: Crew | None = None  # made at attach
        self._tracer = context.tracer

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane`` from now on, and watch ``connection`` for a broker's block."""
        self.crew = Crew(
            route=self.route.name,
            rules=self.rules,
            sink=self.sink,
            publisher=self.publisher,
            lane=lane,
            connection=connection,
            line=self.line,
            rounds=self.rounds,
            confirms=self.confirms,
            tasks=self.tasks,
            queued=self.queued,
            stop=self.stop,
            backoff=self._backoff,
            may_retry_return=self._may_retry_return,
            monotonic=self.monotonic,
        )

    def learned_consumer_timeout(self, timeout_s: float) -> None:
        """Hold deliveries within the broker's consumer_timeout, learned from a take-back.

        The deliveries that arrive from now on: those on the channel the broker closed are
        the broker's again.
        """
        limits = dataclasses.replace(self.rules.limits, consumer_timeout_s=timeout_s)
        self.rules = dataclasses.replace(self.rules, limits=limits)
        if (crew := self.crew) is not None:  # the same session's, with the new rules
            self.attach(crew.connection, crew.lane)

    def offer(self, consumer: AckChannel, delivery: Delivery) -> None:
        """Take one delivery, consumed on ``consumer``, and settle it (after ``attach``).

        The plan is made once, here. A held delivery stays unacked and is published again
        after the step's wait (a requeue would spend a quorum queue's delivery); a publish
        without a confirm is never sent twice. A delivery traced (tracing on, sampled) has
        its span told each step, on either path.
        """
        crew = self.crew
        if crew is None:
            raise RuntimeError(f"route {self.route.name}: a delivery offered before attach")
        held = self.sink.begin(delivery)
        tracer = self._tracer
        trace = None if tracer is None else _start_trace(tracer, delivery, self.route)
        settling = Settling(crew, consumer, delivery, held, started=self.monotonic(), trace=trace)
        try:
            step = begin(delivery, self._target, now_ms=self._clock.now_ms(), new_id=self._new_id)
            settling.step = step
            if step.events:
                settling.observe(step)
            if settling.publish_now(step):
                return
        except Exception as e:  # noqa: BLE001 - a bug must not reach the frame handler
            settling.go_on(None, error=e)
            return
        settling.count(step)  # no later copy overtakes it
        settling.go_on(step)


def _start_trace(tracer: RouteTracer, delivery: Delivery, route: Route) -> DeliveryTrace | None:
    """Start the delivery's span; None when not sampled (or tracing failed: logged)."""
    try:
        return tracer.start(delivery)
    except Exception:  # a bug in tracing must not hold a delivery
        log.exception("route %s: the delivery's span could not start", route.name)
        return None


def _limits_of(route: Route) -> HoldLimits:
    """Return the bounds on holding one of the route's deliveries, as its map says them."""
    limits = route.limits
    return HoldLimits(
        consumer_timeout_s=limits.consumer_timeout_s,
        nack_max_attempts=limits.nack_max_attempts,
        nack_max_s=limits.nack_max_s,
    )


def _target_of(context: RouteContext) -> Target:
    """Return where a route's copies go, and what the contract needs to know of the route."""
    route = context.route
    return Target(
        queue=route.queue,
        exchange=route.exchange,
        routing_key=route.routing_key,
        audit=route.mode is Mode.AUDIT,
        policy=Policy(publishers=route.publishers, origin=route.origin, login=context.login),
        delivery_limit=route.delivery_limit,
    )
