"""The I/O of one delivery: carry out what the settle step decides, until it is settled.

``Settler`` runs ``sidecar.settle.step`` for each delivery a route's ``RouteWorker`` hands
it: ``begin``, then, unless the fast pass settles it (``sidecar.relay.fast_pass``), each
action carried out as a task (a publish by ``PlanPublisher`` on the route's publish lane,
a wait, the ack or reject on the channel the delivery came on) and each publish's result
or exception read into an answer, in one place (``publish_answer``), for ``after``. What
the step observed goes to metrics, the route log and the route's state in one place too
(``sidecar.relay.sink``). Its one rule is the relay's: a delivery is acked only after the
broker confirmed its normalised copy, or its quarantine copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.contract import Policy
from sidecar.errors import WireError
from sidecar.relay.fast_pass import FastPass, Queued, answer_of_error, delay_s_for, not_now
from sidecar.relay.held_waits import wait_out
from sidecar.relay.last_action import LastAction
from sidecar.relay.publisher import CONFIRM_TIMEOUT_S, PlanPublisher
from sidecar.relay.rounds import PassingRounds, held_for
from sidecar.relay.sink import RouteSink
from sidecar.relay.unblock_line import Ticket, UnblockLine
from sidecar.routemap import Mode
from sidecar.settle import (
    BUG_REASON,
    PUBLISHED,
    Blocked,
    Failed,
    HoldLimits,
    Publish,
    Target,
    Unwritable,
    Wait,
    WaitUnblocked,
    after,
    begin,
)

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine

    from sidecar.amqp import AckChannel, BodyStream, RelayConnection
    from sidecar.observe import DeliveryTrace, RouteLog, RouteTracer
    from sidecar.relay.context import RouteContext
    from sidecar.relay.lane import PublishLane
    from sidecar.relay.state import HeldDelivery, RouteState
    from sidecar.routemap import Route
    from sidecar.settle import Answer, Step
    from sidecar.wire import Delivery

__all__ = ["Settler", "publish_answer"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class Settler:
    """Settles one route's deliveries: the settle step's actions carried out.

    What to do with each delivery is ``sidecar.settle.step``'s; the common case is settled
    by the fast pass (``sidecar.relay.fast_pass``), everything else here: this class
    publishes (by its ``PlanPublisher``), waits, acks and rejects as the step says.
    """

    def __init__(
        self,
        context: RouteContext,
        *,
        state: RouteState,
        log: RouteLog,
        stop: asyncio.Event,
    ) -> None:
        self.route = context.route
        self._target = _target_of(context)
        # Lowered by the worker once the broker took a delivery back (its consumer_timeout).
        self.limits = _limits_of(context.route)
        self.quarantine_exchange = context.quarantine_exchange
        self._clock = context.clock
        self.monotonic = context.clock.monotonic
        self._new_id = context.new_id
        self._stop = stop
        self.rng = context.rng
        self._sink = RouteSink.of(context, route_log=log, state=state)
        self._publisher = PlanPublisher(context)
        self._rounds = PassingRounds()  # of the bodies passed through, given back
        self._last = LastAction(
            rounds=self._rounds, sink=self._sink, publisher=self._publisher, state=state
        )
        self._line = UnblockLine()  # copies waiting for the broker's unblock, in order
        self._fast = FastPass(
            self, sink=self._sink, stop=stop, line=self._line, limit_s=CONFIRM_TIMEOUT_S
        )
        self._lane: PublishLane | None = None
        self._connection: RelayConnection | None = None
        self._tracer = context.tracer

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane`` from now on, and watch ``connection`` for a broker's block."""
        self._lane, self._connection = lane, connection
        self._fast.attach(connection, lane)

    def offer(self, consumer: AckChannel, delivery: Delivery) -> Coroutine[Any, Any, None] | None:
        """Take one delivery: settled by the fast pass, or the coroutine that settles it.

        The plan is made once, here. A held delivery stays unacked and is published again
        after the step's wait (a requeue would spend a quorum queue's delivery); a publish
        without a confirm is never sent twice. A delivery traced (tracing on, sampled) has
        its span told each step, on either path.
        """
        held = self._sink.begin(delivery)
        started = self.monotonic()
        trace = None if self._tracer is None else _start_trace(self._tracer, delivery, self.route)
        try:
            step = begin(delivery, self._target, now_ms=self._clock.now_ms(), new_id=self._new_id)
            if step.events:
                _observe(self._sink, step, delivery, held, trace)
            if self._fast.publish(consumer, delivery, step, held, started=started, trace=trace):
                return None
        except Exception as e:  # noqa: BLE001 - a bug must not reach the frame handler
            if trace is not None:
                trace.end(None)
            return self._sink.give_back(consumer, held, BUG_REASON, bug=e)
        queued = self._fast.queue(step)  # no later copy overtakes it
        return self.settle_from(
            consumer, delivery, held, step, started=started, queued=queued, trace=trace
        )

    async def settle_from(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        step: Step,
        *,
        started: float,
        queued: Queued | None = None,
        trace: DeliveryTrace | None = None,
    ) -> None:
        """Carry out a delivery's steps from ``step`` (its events observed) until settled.

        ``trace``: the delivery's span, told each publish and ended with the last action.
        """
        # A body over max_body_bytes: its frames wait on the connection for the publish
        # that takes them, or are dropped at the end if none did.
        stream = consumer.passing_body(delivery.delivery_tag) if delivery.unread_body else None
        try:
            lane = self._lane
            assert lane is not None  # noqa: S101 - attached before consuming starts
            await self._carry_out(
                consumer,
                lane,
                delivery,
                held,
                step=step,
                started=started,
                stream=stream,
                queued=queued,
                trace=trace,
            )
        except MissingEntityError as e:
            # The passive checks of a reopen say when it exists again; till then the
            # deliveries wait in staging, not here.
            await self._sink.give_back(consumer, None, str(e))
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", self.route.name, e)
        except Exception as e:  # noqa: BLE001 - logged with its traceback, the route paused
            await self._sink.give_back(consumer, None, BUG_REASON, bug=e)
        finally:
            if queued is not None:
                queued()
            if stream is not None:
                stream.discard()
            if trace is not None:
                trace.end(None)  # left unsettled, unless its last action ended it
            self._sink.finished(held)

    async def _carry_out(
        self,
        consumer: AckChannel,
        lane: PublishLane,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        step: Step,
        started: float,
        stream: BodyStream | None,
        queued: Queued | None,
        trace: DeliveryTrace | None,
    ) -> None:
        """Carry out each action of the settle step, from ``step`` to the last one."""
        route = self.route
        ticket: Ticket | None = None  # its place in the unblock line, once its turn came
        try:
            while True:
                action = step.action
                match action:
                    case Publish():
                        answer = await publish_answer(
                            self._publisher,
                            lane,
                            delivery,
                            action,
                            held,
                            consumer=consumer,
                            stop=self._stop,
                            connection=self._connection,
                            line=self._line,
                            ticket=ticket,
                            stream=stream,
                            trace=trace,
                        )
                        if not isinstance(answer, Blocked):
                            ticket = None  # it left the line as its publish started
                            if queued is not None:
                                queued()  # published: later copies may take the fast pass
                        attempt = step.attempt
                        held_s, holds = held_for(
                            self._rounds,
                            delivery,
                            answer,
                            attempt,
                            started=started,
                            now=self.monotonic(),
                            stream=stream,
                        )
                        step = after(
                            attempt,
                            answer,
                            held_s=held_s,
                            delay_s=delay_s_for(answer, holds, self.rng),
                            limits=self.limits,
                            exchange=route.exchange,
                            quarantine_exchange=self.quarantine_exchange,
                            route=route.name,
                        )
                    case Wait() | WaitUnblocked():
                        then, ticket = await wait_out(
                            action, consumer, self._stop, self._line, self._connection, ticket
                        )
                        if then is None:
                            return  # the broker redelivers it
                        step = then
                    case _:
                        await self._last.run(consumer, delivery, held, action, started=started)
                        if trace is not None:
                            trace.end(action)
                        return
                if step.events:
                    _observe(self._sink, step, delivery, held, trace)
        finally:
            if ticket is not None:  # it left without publishing
                self._line.leave(ticket)


def _start_trace(tracer: RouteTracer, delivery: Delivery, route: Route) -> DeliveryTrace | None:
    """Start the delivery's span; None when not sampled (or tracing failed: logged)."""
    try:
        return tracer.start(delivery)
    except Exception:  # a bug in tracing must not hold a delivery
        log.exception("route %s: the delivery's span could not start", route.name)
        return None


def _observe(
    sink: RouteSink, step: Step, delivery: Delivery, held: HeldDelivery, trace: DeliveryTrace | None
) -> None:
    """Hand what the step saw to the sink, and to the delivery's span when traced."""
    sink.observe(step.events, delivery, held)
    if trace is not None:
        trace.saw(step.events)


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
    )


async def publish_answer(
    publisher: PlanPublisher,
    lane: PublishLane,
    delivery: Delivery,
    publish: Publish,
    held: HeldDelivery,
    *,
    consumer: AckChannel,
    stop: asyncio.Event,
    connection: RelayConnection | None,
    line: UnblockLine,
    ticket: Ticket | None = None,
    stream: BodyStream | None = None,
    trace: DeliveryTrace | None = None,
) -> Answer:
    """Publish once; return the broker's answer, told to ``trace``'s send span when traced.

    A target copy may go with the send span as its traceparent (``tracing.traceparent``).
    """
    send = None if trace is None else trace.send(publish.plan)
    if send is not None and send.plan is not publish.plan:
        publish = Publish(send.plan, alone=publish.alone)
    answer = await _answer(
        publisher,
        lane,
        delivery,
        publish,
        held,
        consumer=consumer,
        stop=stop,
        connection=connection,
        line=line,
        ticket=ticket,
        stream=stream,
    )
    if send is not None:
        send.answered(answer)
    return answer


async def _answer(
    publisher: PlanPublisher,
    lane: PublishLane,
    delivery: Delivery,
    publish: Publish,
    held: HeldDelivery,
    *,
    consumer: AckChannel,
    stop: asyncio.Event,
    connection: RelayConnection | None,
    line: UnblockLine,
    ticket: Ticket | None = None,
    stream: BodyStream | None = None,
) -> Answer:
    """Publish once; return the broker's answer. Every exception of a publish ends here.

    Nothing is published for a delivery whose channel is closing (its ack would be refused
    and the broker redelivers it: the copy would be a certain duplicate), nor while
    ``connection`` is blocked (a copy written then would sit in the socket and might reach
    the broker after a SIGTERM gave its delivery back). A missing entity is the route's,
    not the delivery's: it goes up to pause the route. ``stream``: the delivery's body,
    passing through. Copies waiting in ``line`` for the broker's unblock go first: one with
    the line's ``ticket`` leaves the line as its publish starts.
    """
    if (not_yet := not_now(consumer, connection, line, ticket=ticket)) is not None:
        if ticket is not None and not isinstance(not_yet, Blocked):
            line.leave(ticket)
        return not_yet
    if ticket is not None:
        line.leave(ticket)
    try:
        published = await publisher.publish(
            lane, delivery, publish.plan, held, alone=publish.alone, stream=stream
        )
    except (ChannelLostError, MissingEntityError) as e:  # a missing entity is raised again
        return answer_of_error(e, gone=stop.is_set() or not lane.connection_open)
    except (WireError, ValueError, TypeError) as e:
        return Unwritable(str(e))
    except Exception as e:  # noqa: BLE001 - a bug while publishing: the step decides, Bug logs it
        return Failed(e)
    return PUBLISHED[published]
