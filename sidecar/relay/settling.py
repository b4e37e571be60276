"""One delivery being settled: the one object its confirm callback and its task both drive.

A ``Settling`` holds where a delivery stands (its step, its span, the channel its copy
went on) and carries its steps out. What can be done at once is done from the frame
handler that read the delivery or its confirm: ``publish_now`` sends the step's copy on
the route's shared channel, ``settled`` reads the confirm and acks. Anything else (a nack,
a return, a refusal, a lost channel, acks held back by a cancel, a wait, a quarantine
copy, a bug) goes on in a task the route owns (``run``), from the step reached. Each
publish's result is read by ``settle.answer_of`` and the next step made by
``settle.after``: the step decides, this carries it out. A ``Crew`` is what it works
with (``relay.crew``): the route's rules and collaborators for a session, no
back-reference to its settler. Its one rule is the relay's: a delivery is acked only
after the broker confirmed its normalised copy, or its quarantine copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.errors import ChannelLostError, MissingEntityError, WireError
from sidecar.relay.waits import first_of, sleep_unless
from sidecar.settle import (
    BUG_REASON,
    Ack,
    Copy,
    DeadLetter,
    GiveBack,
    IfReturnBudget,
    LetGo,
    Lost,
    Publish,
    Refused,
    Requeue,
    Wait,
    WaitUnblocked,
    after,
    answer_of,
    not_now,
    shared_copy,
    slow_confirm,
    wait_s,
    waits_unblock,
)

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel, BodyStream
    from sidecar.observe import DeliveryTrace, SendTrace
    from sidecar.relay.crew import Crew
    from sidecar.relay.lane import Shared
    from sidecar.relay.state import HeldDelivery
    from sidecar.relay.unblock_line import Ticket
    from sidecar.settle import Answer, Plan, Step
    from sidecar.wire import Delivery, PublishOutcome

__all__ = ["Settling"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class Settling:
    """One delivery's settlement as it goes; see the module docstring."""

    __slots__ = (
        "consumer",
        "counted",
        "crew",
        "delivery",
        "held",
        "is_slow",
        "send",
        "shared",
        "started",
        "step",
        "stream",
        "trace",
    )

    shared: Shared  # the shared channel its copy went on from the frame handler
    step: Step  # the step whose action is being carried out

    def __init__(
        self,
        crew: Crew,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        started: float,
        trace: DeliveryTrace | None,
    ) -> None:
        self.crew, self.consumer, self.delivery = crew, consumer, delivery
        self.held, self.started, self.trace = held, started, trace
        self.send: SendTrace | None = None  # the copy's span, while it waits for its answer
        self.stream: BodyStream | None = None  # a body passing through (taken by the task)
        self.counted = False  # a copy the route's later ones must not overtake
        self.is_slow = False

    # --- the pieces of a step, each done here only ---

    def observe(self, step: Step) -> None:
        """Hand what the step saw to the route's sink, and to the span when traced."""
        self.crew.sink.observe(step.events, self.delivery, self.held)
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
        return self.crew.stop.is_set() or not self.crew.lane.connection_open

    def told(self, answer: Answer) -> None:
        """End the copy's send span, if any, with the broker's answer."""
        if (send := self.send) is not None:
            self.send = None
            send.answered(answer)

    def read(self, answer: Answer) -> Step:
        """Return the step after ``answer`` to the current step's publish (its events seen)."""
        crew, now = self.crew, self.crew.monotonic()
        if (stream := self.stream) is None:
            held_s, backoff_step = now - self.started, None
        else:  # a body passed through: held over its rounds, which span its redeliveries
            if not stream.taken and not waits_unblock(answer):
                stream.discard()  # its publish did not take it: it comes with the redelivery
            held_s, backoff_step = crew.rounds.timing(self.delivery, started=self.started, now=now)
        step = self.step = after(
            self.step.attempt, answer, crew.rules, held_s=held_s, backoff_step=backoff_step
        )
        if step.events:
            self.observe(step)
        return step

    def acked(self, action: Ack, *, acked: bool) -> None:
        """Count the delivery acked with the action's outcome (``acked``: the channel took it)."""
        if acked:
            self.crew.sink.acked(action.outcome, started=self.started, held=self.held)
        if (trace := self.trace) is not None:
            trace.end(action if acked else None)

    def slow(self) -> None:
        """Hold the delivery: its confirm is slower than the limit (it is still awaited)."""
        if not self.is_slow:
            self.is_slow = True
            exchange = self.crew.rules.exchange_of(self.step.attempt.plan)
            self.held.take(slow_confirm(exchange, limit_s=self.crew.confirms.limit_s))

    def count(self, step: Step) -> None:
        """Count a copy going to the task: no later copy of the route overtakes it."""
        action = step.action
        if isinstance(action, Publish) and isinstance(action.plan, Copy):
            self.counted = True
            self.crew.queued.count += 1

    def uncount(self) -> None:
        """Uncount it, once: its publish started, or it left."""
        if self.counted:
            self.counted = False
            self.crew.queued.count -= 1

    def not_now(self, ticket: Ticket | None = None) -> Answer | None:
        """Return the answer for a publish that must not be written now (``settle.not_now``).

        Blocked: behind the unblock line unless it holds a ``ticket`` of it (its turn
        came), when only a new block stops it.
        """
        crew = self.crew
        if ticket is None:
            blocked = crew.line.blocked(crew.connection)
        else:
            blocked = crew.connection.blocked_reason
        return not_now(channel_open=self.consumer.is_open, blocked=blocked)

    # --- from the frame handlers ---

    def publish_now(self, step: Step) -> bool:
        """Publish the step's copy now if nothing stands in the way; False: it did not."""
        crew = self.crew
        plan = shared_copy(step)
        if plan is None or crew.queued.count or self.not_now():
            return False
        lane = crew.lane
        shared = lane.shared_now()
        if shared is None:
            return False
        self.step, self.shared = step, shared
        self.is_slow = False  # a new publish: its own confirm may be late
        try:
            published = plan if self.trace is None else self.sending(plan)
            sent = crew.publisher.publish_now(
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
        if not sent:  # the task publishes it, in the span started here
            lane.release_now(shared, None)
            return False
        crew.confirms.sent(self)
        return True

    def settled(self, result: PublishOutcome | BaseException) -> None:
        """Read the confirm callback's result into the next step; ack, or go on in a task."""
        crew = self.crew
        crew.confirms.answered(self)
        try:
            crew.lane.release_now(self.shared, result)
            step = self.read(self.answer(result))
            action = step.action
            if isinstance(action, Ack):
                acked = self.consumer.try_ack(self.delivery.delivery_tag)
                if acked is not None:  # None: a cancel holds acks back, the task waits
                    self.acked(action, acked=acked)
                    crew.sink.finished(self.held)
                    return
        except Exception as e:  # noqa: BLE001 - a bug must not reach the frame handler
            self.go_on(None, error=e)
            return
        self.go_on(step)

    def go_on(self, step: Step | None, *, error: Exception | None = None) -> None:
        """Carry out the rest in a task of the route's, from ``step`` (or after ``error``)."""
        self.crew.tasks.start(
            self.run(step, error),
            name=f"settle:{self.crew.route}:{self.delivery.delivery_tag}",
        )

    # --- in the delivery's task ---

    async def run(self, step: Step | None, error: Exception | None = None) -> None:
        """Carry out the steps from ``step`` (its events seen) until the delivery is settled.

        ``error``: what stopped it in a frame handler, met here as in the task. A missing
        exchange or queue pauses the route; a lost channel leaves the delivery to the
        broker; a bug gives it back, logged with its traceback.
        """
        crew, consumer, delivery = self.crew, self.consumer, self.delivery
        # A body over max_body_bytes: its frames wait for the publish that takes them.
        if delivery.unread_body is not None:
            self.stream = consumer.passing_body(delivery.delivery_tag)
        try:
            # A frame handler's error is read as the task's own would be, not raised again.
            failure = None if error is None else _failure(error, crew.route)
            if error is None:
                try:
                    await self._carry_out(step)
                except Exception as e:  # noqa: BLE001 - each kind read by _failure
                    failure = _failure(e, crew.route)
            if failure is not None:
                await crew.sink.give_back(consumer, None, failure[0], bug=failure[1])
        finally:
            self.uncount()
            self.told(Lost(gone=True, error="its task ended"))  # a send span left open
            if (stream := self.stream) is not None:
                stream.discard()
            if (trace := self.trace) is not None:
                trace.end(None)  # left unsettled, unless its last action ended it
            crew.sink.finished(self.held)

    async def _carry_out(self, step: Step | None) -> None:
        """Carry out each action of the settle step, from ``step`` to the last one."""
        ticket: Ticket | None = None  # its place in the unblock line, once its turn came
        try:
            while step is not None:
                self.step = step
                action = step.action
                match action:
                    case Publish():
                        answer, ticket = await self.publish_once(action, ticket)
                        if not waits_unblock(answer):
                            self.uncount()  # answered: later copies may go from the handler
                        step = self.read(answer)
                    case Wait() | WaitUnblocked():
                        step, ticket = await self._wait(action, ticket)
                        if step is not None and step.events:  # None: the broker redelivers it
                            self.observe(step)
                    case IfReturnBudget(then=then, otherwise=otherwise):
                        step = then if self.crew.may_retry_return() else otherwise
                        if step.events:
                            self.observe(step)
                    case _:
                        await self._last(action)
                        return
        finally:
            if ticket is not None:  # it left without publishing
                self.crew.line.leave(ticket)

    async def publish_once(
        self, publish: Publish, ticket: Ticket | None
    ) -> tuple[Answer, Ticket | None]:
        """Publish the step's plan once, unless ``not_now``; return the answer and ticket.

        Copies waiting in the unblock line go first: one holding its ``ticket`` leaves the
        line as its publish starts.
        """
        crew = self.crew
        if (not_yet := self.not_now(ticket)) is not None:
            if ticket is not None and not waits_unblock(not_yet):
                crew.line.leave(ticket)
                ticket = None
            return not_yet, ticket  # nothing written: no send span
        if ticket is not None:
            crew.line.leave(ticket)
        # The frame handler's span when its publish could not go: one span for one copy.
        send = self.send
        plan = send.plan if send is not None else self.sending(publish.plan)
        self.is_slow = False  # a new publish: its own confirm may be late
        try:
            result = await crew.publisher.publish(
                crew.lane,
                self.delivery,
                plan,
                alone=publish.alone,
                on_slow=self.slow,
                stream=self.stream,
            )
        except Exception as e:  # noqa: BLE001 - every exception of a publish is read as an answer
            return self.answer(e), None
        return self.answer(result), None

    async def _wait(
        self, action: Wait | WaitUnblocked, ticket: Ticket | None
    ) -> tuple[Step | None, Ticket | None]:
        """Wait as the step says; return the step after it (None: let the delivery go).

        A ``Wait``: its backoff step's delay, drawn here within its bound; a
        ``WaitUnblocked``: in the unblock line, its ``ticket`` kept if blocked again. A stop
        ends either, and so does the close of the channel the delivery came on.
        """
        crew, consumer = self.crew, self.consumer
        if isinstance(action, Wait):
            delay_s = wait_s(action, crew.backoff)
            await first_of(sleep_unless(crew.stop, delay_s), consumer.wait_gone())
            let_go = crew.stop.is_set()
        else:
            ticket = await crew.line.wait(
                crew.connection, crew.stop.wait(), consumer.wait_gone(), ticket=ticket
            )
            let_go = ticket is None
        if let_go or not consumer.is_open:
            return None, ticket
        return action.then, ticket

    async def _last(self, action: Ack | DeadLetter | GiveBack | LetGo | Requeue) -> None:
        """Carry out the delivery's last action on the channel it came on.

        A dead-letter (a reject, requeue=false) is counted and logged at error; a give-back
        pauses the route and closes the channel; a requeue counts a round of a body passed
        through. A channel already gone rejects nothing: the broker redelivers it.
        """
        crew, consumer, delivery = self.crew, self.consumer, self.delivery
        tag = delivery.delivery_tag
        match action:
            case Ack():
                if self.stream is not None:
                    crew.rounds.forget(delivery)
                self.acked(action, acked=await consumer.ack(tag))
                return
            case DeadLetter(reason=reason):
                crew.rounds.forget(delivery)
                if await consumer.reject(tag, requeue=False):
                    crew.sink.dead_lettered(delivery, reason)
            case GiveBack(reason=reason):
                await crew.sink.give_back(consumer, None, reason)
            case LetGo():
                pass  # the broker redelivers it
            case Requeue(reason=reason):
                crew.rounds.again(delivery, started=self.started)
                if await consumer.reject(tag, requeue=True):
                    crew.sink.requeued(delivery, reason)
            case _:
                assert_never(action)
        if (trace := self.trace) is not None:
            trace.end(action)


def _failure(error: Exception, route: str) -> tuple[str, Exception | None] | None:
    """Return why a delivery's settling ended early, for the route's give-back; None: let go.

    A missing exchange or queue pauses the route (the passive checks of a reopen say when
    it exists again); a lost channel leaves the delivery to the broker; anything else is a
    bug, logged with its traceback as the route pauses.
    """
    if isinstance(error, MissingEntityError):
        return str(error), None
    if isinstance(error, ChannelLostError):
        log.debug("route %s: delivery left to the broker: %s", route, error)
        return None
    return BUG_REASON, error
