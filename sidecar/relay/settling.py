"""One delivery being settled: the one object its confirm callback and its task both drive.

A ``Settling`` holds where a delivery stands (its step, its span, the channel its copy
went on) and does each of its steps' pieces once, whoever asks: ``answer`` reads a
publish's result (``relay.answer_of``), ``read`` turns an answer into the next step
(``sidecar.settle.after``, with the route's ``Rules``), ``acked`` counts an ack, ``slow``
holds a delivery whose confirm is late. What can be done at once is done from the frame
handler that read the delivery or its confirm: ``publish_now`` sends the step's copy on
the route's shared channel, ``settled`` reads the confirm and acks. Anything else (a
nack, a return, a refusal, a lost channel, acks held back by a cancel, a wait, a
quarantine copy, a bug) goes on in a task the route owns, ``relay.settle_task``'s loop,
from the step reached. Its one rule is the relay's: a delivery is acked only after the
broker confirmed its normalised copy, or its quarantine copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.errors import MissingEntityError, WireError
from sidecar.relay.answer_of import answer_of
from sidecar.relay.settle_task import settle
from sidecar.settle import (
    Ack,
    Blocked,
    Copy,
    Publish,
    Quarantine,
    Refused,
    after,
    slow_confirm,
)

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel, BodyStream
    from sidecar.observe import DeliveryTrace, SendTrace
    from sidecar.relay.lane import PublishLane, Shared
    from sidecar.relay.settler import Settler
    from sidecar.relay.state import HeldDelivery
    from sidecar.settle import Answer, Plan, Step
    from sidecar.wire import Delivery, PublishOutcome

__all__ = ["Settling"]


class Settling:
    """One delivery's settlement as it goes; see the module docstring."""

    __slots__ = (
        "consumer",
        "counted",
        "delivery",
        "held",
        "is_slow",
        "lane",
        "send",
        "settler",
        "shared",
        "started",
        "step",
        "stream",
        "trace",
    )

    lane: PublishLane  # the lane its last copy went on
    shared: Shared  # and the shared channel, from the frame handler (``publish_now``)
    step: Step  # the step whose action is being carried out

    def __init__(
        self,
        settler: Settler,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        started: float,
        trace: DeliveryTrace | None,
    ) -> None:
        self.settler, self.consumer, self.delivery = settler, consumer, delivery
        self.held, self.started, self.trace = held, started, trace
        self.send: SendTrace | None = None  # the copy's span, while it waits for its answer
        self.stream: BodyStream | None = None  # a body passing through (taken by the task)
        self.counted = False  # a copy the route's later ones must not overtake
        self.is_slow = False

    # --- the pieces of a step, each done here only ---

    def observe(self, step: Step) -> None:
        """Hand what the step saw to the route's sink, and to the span when traced."""
        self.settler.sink.observe(step.events, self.delivery, self.held)
        if (trace := self.trace) is not None:
            trace.saw(step.events)

    def sending(self, plan: Plan) -> Plan:
        """Start the copy's send span when traced; return the plan to publish (it may carry it)."""
        if (trace := self.trace) is None:
            return plan
        send = self.send = trace.send(plan)
        return send.plan

    def answer(self, result: PublishOutcome | BaseException) -> Answer:
        """Read a publish's result into the broker's answer, told to the copy's span.

        A missing entity is raised (the route pauses), its span told of the 404 first.
        """
        try:
            answer = answer_of(result, gone=self.gone)
        except MissingEntityError as e:
            self.told(Refused(404, str(e)))
            raise
        self.told(answer)
        return answer

    def gone(self) -> bool:
        """Whether its copy's channel went with a stop or its connection."""
        return self.settler.gone(self.lane)

    def told(self, answer: Answer) -> None:
        """End the copy's send span, if any, with the broker's answer."""
        if (send := self.send) is not None:
            self.send = None
            send.answered(answer)

    def read(self, answer: Answer) -> Step:
        """Return the step after ``answer`` to the current step's publish (its events seen)."""
        settler, attempt = self.settler, self.step.attempt
        now = settler.monotonic()
        if (stream := self.stream) is None:
            held_s, backoff_step = now - self.started, None
        else:  # a body passed through: held over its rounds, which span its redeliveries
            if not stream.taken and not isinstance(answer, Blocked):
                stream.discard()  # its publish did not take it: it comes with the redelivery
            held_s, backoff_step = settler.rounds.timing(
                self.delivery, started=self.started, now=now
            )
        step = self.step = after(
            attempt, answer, settler.rules, held_s=held_s, backoff_step=backoff_step
        )
        if step.events:
            self.observe(step)
        return step

    def acked(self, action: Ack, *, acked: bool) -> None:
        """Count the delivery acked with the action's outcome (``acked``: the channel took it)."""
        if acked:
            self.settler.sink.acked(action.outcome, started=self.started, held=self.held)
        if (trace := self.trace) is not None:
            trace.end(action if acked else None)

    def slow(self) -> None:
        """Hold the delivery: its confirm is slower than the limit (it is still awaited)."""
        if not self.is_slow:
            self.is_slow = True
            settler = self.settler
            rules = settler.rules
            quarantine = isinstance(self.step.attempt.plan, Quarantine)
            exchange = rules.quarantine_exchange if quarantine else rules.exchange
            self.held.take(slow_confirm(exchange, limit_s=settler.confirm_limit_s))

    def count(self, step: Step) -> None:
        """Count a copy going to the task: no later copy of the route overtakes it."""
        action = step.action
        if isinstance(action, Publish) and isinstance(action.plan, Copy):
            self.counted = True
            self.settler.queued += 1

    def uncount(self) -> None:
        """Uncount it, once: its publish started, or it left."""
        if self.counted:
            self.counted = False
            self.settler.queued -= 1

    # --- from the frame handlers ---

    def publish_now(self, step: Step) -> bool:
        """Publish the step's copy now if nothing stands in the way; False: it did not."""
        action, settler = step.action, self.settler
        lane = settler.lane
        if not isinstance(action, Publish) or action.alone or lane is None:
            return False
        plan = action.plan
        if not isinstance(plan, Copy) or settler.queued or settler.not_now(self.consumer):
            return False
        shared = lane.shared_now()
        if shared is None:
            return False
        self.step, self.lane, self.shared = step, lane, shared
        self.is_slow = False  # a new publish: its own confirm may be late
        try:
            published = plan if self.trace is None else self.sending(plan)
            sent = settler.publisher.publish_now(
                shared.publisher,
                self.delivery,
                published if isinstance(published, Copy) else plan,
                self.settled,
            )
        except (WireError, ValueError, TypeError):  # before writing: the task says why
            sent = False
        except BaseException:
            lane.release_now(shared, None)  # the channel's use and the gate given back
            raise
        if not sent:
            lane.release_now(shared, None)
            if (send := self.send) is not None:
                self.send = None
                send.unsent()  # the task publishes it, in a span of its own
            return False
        settler.confirms.sent(self)
        return True

    def settled(self, result: PublishOutcome | BaseException) -> None:
        """Read the confirm callback's result into the next step; ack, or go on in a task."""
        settler = self.settler
        settler.confirms.answered(self)
        try:
            self.lane.release_now(self.shared, result)
            step = self.read(self.answer(result))
            action = step.action
            if isinstance(action, Ack):
                acked = self.consumer.try_ack(self.delivery.delivery_tag)
                if acked is not None:  # None: a cancel holds acks back, the task waits
                    self.acked(action, acked=acked)
                    settler.sink.finished(self.held)
                    return
        except Exception as e:  # noqa: BLE001 - a bug must not reach the frame handler
            self.go_on(None, error=e)
            return
        self.go_on(step)

    def go_on(self, step: Step | None, *, error: Exception | None = None) -> None:
        """Carry out the rest in a task of the route's, from ``step`` (or after ``error``)."""
        self.settler.tasks.start(
            settle(self, step, error),
            name=f"settle:{self.settler.route.name}:{self.delivery.delivery_tag}",
        )
