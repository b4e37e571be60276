"""The common case of a delivery, settled with no task, future or timer of its own.

A delivery whose first step publishes a copy to the target on the shared channel, while
that channel is open and flowing, the connection's gate lets publishes through at once and
the broker blocks nothing, is published from the frame handler that read it. Its confirm
comes back, in the frame handler that read that, to ``_Pending``, which reads the answer
with the settle step and acks. Whatever else happens (a nack, a return, a refusal, a lost
channel, acks held back by a cancel, a quarantine copy) leaves the fast pass: the delivery
goes on as a task from the step it reached (``Settler.settle_from``), the one place that
carries out the rest. Slow confirms are found by one sweep per route, not a timer each.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

from sidecar.amqp import ChannelClosedError, ChannelLostError, MissingEntityError
from sidecar.errors import WireError
from sidecar.relay.connection_gate import answered
from sidecar.settle import (
    BUG_REASON,
    PUBLISHED,
    Ack,
    Blocked,
    Confirmed,
    Copy,
    Lost,
    Publish,
    Refused,
    after,
    backoff_s,
    slow_confirm,
)
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    import random
    from collections.abc import Coroutine

    from sidecar.amqp import AckChannel, RelayConnection
    from sidecar.observe import DeliveryTrace, SendTrace
    from sidecar.relay.lane import PublishLane, Shared
    from sidecar.relay.sink import RouteSink
    from sidecar.relay.state import HeldDelivery
    from sidecar.relay.unblock_line import Ticket, UnblockLine
    from sidecar.routemap import Route
    from sidecar.settle import Answer, HoldLimits, Step
    from sidecar.wire import Delivery

__all__ = [
    "SWEEP_S",
    "FastPass",
    "Queued",
    "SlowPath",
    "answer_of_error",
    "delay_s_for",
    "not_now",
]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them

# How often a route looks for confirms slower than the limit: a slow one is held between
# the limit and the limit plus this.
SWEEP_S: Final = 5.0


def delay_s_for(answer: Answer, holds: int, rng: random.Random) -> float:
    """Return the backoff's next delay, drawn only for an answer that may hold the delivery."""
    return 0.0 if isinstance(answer, Confirmed) else backoff_s(holds, rng=rng)


def answer_of_error(error: BaseException, *, gone: bool) -> Answer:
    """Return the answer a publish's channel error means; a missing entity is raised.

    ``gone``: the channel went with a stop or its connection, not by the broker's hand.
    """
    if isinstance(error, MissingEntityError):
        raise error
    if isinstance(error, ChannelClosedError):
        return Refused(error.code, error.text)
    if isinstance(error, ChannelLostError):
        return Lost(gone=gone, error=str(error))
    raise error


def not_now(
    consumer: AckChannel,
    connection: RelayConnection | None,
    line: UnblockLine,
    *,
    ticket: Ticket | None = None,
) -> Answer | None:
    """Return the answer for a publish that must not be written now; None: publish it.

    A copy goes behind those in the broker's unblock line unless it holds a ``ticket`` of
    that line (its turn came), when only a new block stops it.
    """
    if not consumer.is_open:
        return Lost(gone=True, error="the channel it came on is closing")
    if ticket is None:
        reason = line.blocked(connection)
    else:
        reason = connection.blocked_reason if connection is not None else None
    return None if reason is None else Blocked(reason)


class SlowPath(Protocol):
    """The route's settler, as the fast pass hands it what leaves the common case."""

    route: Route
    limits: HoldLimits  # lowered by the worker once the broker took a delivery back
    rng: random.Random
    quarantine_exchange: str

    def settle_from(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        step: Step,
        *,
        started: float,
        trace: DeliveryTrace | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Carry out the rest of a delivery's steps, from ``step`` (its events observed)."""


class FastPass:
    """One route's deliveries published and settled without a task; see the module docstring."""

    def __init__(
        self,
        slow: SlowPath,
        *,
        sink: RouteSink,
        stop: asyncio.Event,
        line: UnblockLine,
        limit_s: float,
        sweep_s: float = SWEEP_S,
    ) -> None:
        self.slow = slow
        self._line = line
        self._sweep_s = sweep_s
        self.sink = sink
        self._stop = stop
        self.limit_s = limit_s  # a confirm slower than this holds its delivery
        self._pending: dict[_Pending, float] = {}  # published, by when: oldest first
        self._sweep_due: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.lane: PublishLane | None = None
        self._connection: RelayConnection | None = None
        self.monotonic = sink.monotonic
        self.queued = 0  # copies on the task path not yet answered (see ``queue``)

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane``'s shared channel, unless ``connection`` is blocked."""
        self.lane, self._connection = lane, connection

    def publish(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        step: Step,
        held: HeldDelivery,
        *,
        started: float,
        trace: DeliveryTrace | None = None,
    ) -> bool:
        """Publish the step's copy now if nothing stands in the way; False: it did not.

        ``trace``: the delivery's span (tracing on, sampled), given the copy's send span.
        """
        action, lane = step.action, self.lane
        if not isinstance(action, Publish) or action.alone or lane is None:
            return False
        plan = action.plan
        if (
            not isinstance(plan, Copy)
            or self.queued
            or not_now(consumer, self._connection, self._line)
        ):
            return False
        shared = lane.shared_now()
        if shared is None:
            return False
        pending = _Pending(
            self, consumer=consumer, delivery=delivery, step=step, held=held, started=started
        )
        pending.shared, pending.lane = shared, lane
        if trace is not None:
            plan = _traced(pending, trace, plan)
        try:
            sent = shared.publisher.publish_now(
                delivery.body,
                exchange=self.slow.route.exchange,
                routing_key=plan.routing_key,
                properties=plan.properties,
                headers=plan.headers,
                settled=pending.settled,
                content_header=plan.content_header,
            )
        except (WireError, ValueError, TypeError):  # before writing: the task path says why
            sent = False
        if not sent:
            lane.release_now(shared, answered=False)
            if pending.send is not None:
                pending.send.unsent()  # the task path publishes it, in a span of its own
            return False
        self._pending[pending] = started
        if self._sweep_due is None:
            self._sweep_due = asyncio.get_running_loop().call_later(self._sweep_s, self._sweep)
        return True

    def queue(self, step: Step) -> Queued | None:
        """Count a copy that goes to the task path; its ``Queued`` uncounts it once.

        Until its first publish has an answer, no later copy of the route takes the fast
        pass, which would overtake it: the route's copies stay in their order.
        """
        action = step.action
        if isinstance(action, Publish) and isinstance(action.plan, Copy):
            self.queued += 1
            return Queued(self)
        return None

    def gone(self, lane: PublishLane) -> bool:
        """Whether a publish channel lost now went with a stop or its connection."""
        return self._stop.is_set() or not lane.connection_open

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Go on with a delivery as a task of its own."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def done(self, pending: _Pending) -> None:
        """Forget a publish that has its answer."""
        self._pending.pop(pending, None)

    def _sweep(self) -> None:
        """Hold the deliveries whose confirm is slower than the limit (once each)."""
        self._sweep_due = None
        now = self.monotonic()
        for pending, sent in self._pending.items():
            if now - sent < self.limit_s:
                break
            pending.slow()
        if self._pending:
            self._sweep_due = asyncio.get_running_loop().call_later(self._sweep_s, self._sweep)


class Queued:
    """A copy on the task path counted by ``FastPass.queue``: called, it is uncounted once."""

    __slots__ = ("_fast",)

    def __init__(self, fast: FastPass) -> None:
        self._fast: FastPass | None = fast

    def __call__(self) -> None:
        """Uncount it: its first publish had an answer, or it left the task path."""
        if (fast := self._fast) is not None:
            self._fast = None
            fast.queued -= 1


def _traced(pending: _Pending, trace: DeliveryTrace, plan: Copy) -> Copy:
    """Start the copy's send span; return the copy to publish (it may carry the span)."""
    send = trace.send(plan)
    pending.trace, pending.send = trace, send
    published = send.plan
    return published if isinstance(published, Copy) else plan


class _Pending:
    """One delivery published by the fast pass, waiting for its confirm."""

    __slots__ = (
        "consumer",
        "delivery",
        "fast",
        "held",
        "is_slow",
        "lane",
        "send",
        "shared",
        "started",
        "step",
        "trace",
    )

    shared: Shared  # the channel it went on, and the lane that channel is of
    lane: PublishLane

    def __init__(
        self,
        fast: FastPass,
        *,
        consumer: AckChannel,
        delivery: Delivery,
        step: Step,
        held: HeldDelivery,
        started: float,
    ) -> None:
        self.fast, self.consumer, self.delivery = fast, consumer, delivery
        self.step, self.held, self.started = step, held, started
        self.is_slow = False
        self.trace: DeliveryTrace | None = None  # tracing on and sampled: its spans
        self.send: SendTrace | None = None

    def slow(self) -> None:
        """Hold the delivery: its confirm is slower than the limit (it is still awaited)."""
        if not self.is_slow:
            self.is_slow = True
            fast = self.fast
            self.held.take(slow_confirm(fast.slow.route.exchange, limit_s=fast.limit_s))

    def settled(self, result: PublishOutcome | BaseException) -> None:
        """Read the broker's answer into the next step; ack, or go on as a task."""
        fast = self.fast
        fast.done(self)
        try:
            self._settle(fast, result)
        except Exception as e:  # noqa: BLE001 - a bug must not reach the frame handler
            if self.trace is not None:
                self.trace.end(None)
            fast.spawn(fast.sink.give_back(self.consumer, self.held, BUG_REASON, bug=e))

    def _missing(self, fast: FastPass, missing: MissingEntityError) -> None:
        """Pause the route: what the copy went to is missing (its span says so)."""
        if (trace := self.trace) is not None:
            _answered(self.send, Refused(404, str(missing)))
            trace.end(None)
        fast.spawn(fast.sink.give_back(self.consumer, self.held, str(missing)))

    def _settle(self, fast: FastPass, result: PublishOutcome | BaseException) -> None:
        lane, shared = self.lane, self.shared
        if result is PublishOutcome.NACKED:
            lane.retire(shared.publisher)  # the retry goes on a new channel (see PublishLane)
        error = result if isinstance(result, BaseException) else None
        lane.release_now(shared, answered=answered(error))
        consumer, delivery, held, slow = self.consumer, self.delivery, self.held, fast.slow
        try:
            answer = (
                PUBLISHED[result]
                if isinstance(result, PublishOutcome)
                else answer_of_error(result, gone=fast.gone(lane))
            )
        except MissingEntityError as missing:
            self._missing(fast, missing)
            return
        trace = self.trace
        if trace is not None:
            _answered(self.send, answer)
        attempt = self.step.attempt
        step = after(
            attempt,
            answer,
            held_s=fast.monotonic() - self.started,
            delay_s=delay_s_for(answer, attempt.holds, slow.rng),
            limits=slow.limits,
            exchange=slow.route.exchange,
            quarantine_exchange=slow.quarantine_exchange,
            route=slow.route.name,
        )
        if step.events:
            fast.sink.observe(step.events, delivery, held)
            if trace is not None:
                trace.saw(step.events)
        action = step.action
        if isinstance(action, Ack):
            acked = consumer.try_ack(delivery.delivery_tag)
            if acked is not None:
                if acked:
                    fast.sink.acked(action.outcome, started=self.started, held=held)
                if trace is not None:
                    trace.end(action if acked else None)
                fast.sink.finished(held)
                return
        fast.spawn(
            slow.settle_from(consumer, delivery, held, step, started=self.started, trace=trace)
        )


def _answered(send: SendTrace | None, answer: Answer) -> None:
    """End the copy's send span with the broker's answer."""
    if send is not None:
        send.answered(answer)
