"""One delivery's settlement as a pure step: broker answers in, actions out.

``begin`` plans a delivery that just arrived; ``after`` reads the broker's answer to the
plan's last publish. Each returns a ``Step``: the ``Action`` the settler carries out next,
the delivery's new ``Attempt`` and what was observed on the way (``Event``), which the
settler's one sink hands to metrics, the route log and the route's state. What each answer
means is ``sidecar.settle.settlement``'s and ``sidecar.settle.holds``'s; this module strings
them into the sequence one delivery goes through, and decides a broker's block.

It must stay pure: no I/O, no clock, no randomness, no logging, no metrics. The time a
delivery has been held and the backoff's next delay come in as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias, assert_never

from sidecar.settle import holds as settlement_holds
from sidecar.settle.answers import (
    Answer,
    Blocked,
    Confirmed,
    Failed,
    Lost,
)
from sidecar.settle.events import (
    Bug,
    Event,
    Held,
    Left,
    Quarantined,
    RetriedCopy,
    ReturnRetried,
    RoutedOnRetry,
    Violations,
)
from sidecar.settle.holds import after_hold, blocked, delivery_limit_reached, no_return_left
from sidecar.settle.readings import (
    LOST_CHANNEL,
    READINGS,
    Reading,
    answer_kind,
    decision_for,
    plan_kind,
)
from sidecar.settle.returns import return_retry_delay, unroutable_after
from sidecar.settle.settlement import (
    Alone,
    DeadLetter,
    Done,
    Hold,
    Outcome,
    Quarantine,
    bounded,
    internal_error,
    plan_delivery,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.settle.holds import HoldLimits
    from sidecar.settle.rules import Rules
    from sidecar.settle.settlement import Decision, Plan, Target
    from sidecar.wire import Delivery

__all__ = [
    "BUG_REASON",
    "LOST_CHANNEL",
    "Ack",
    "Action",
    "Attempt",
    "DeadLetter",
    "GiveBack",
    "LetGo",
    "Publish",
    "Requeue",
    "Step",
    "Wait",
    "WaitUnblocked",
    "after",
    "begin",
]

BUG_REASON = "internal error; see the log"  # what the route says after a bug gave a delivery back


# --- the actions the settler carries out ---------------------------------------------------


# Publish, Attempt and Step are made for every delivery: their ``__init__`` is written
# out, which the compiled build compiles (docs/decisions/0063-values-made-per-message.md).


@dataclass(frozen=True, slots=True, init=False)
class Publish:
    """Publish ``plan`` once; ``alone``: on a channel of its own, not the shared one."""

    plan: Plan
    alone: bool

    def __init__(self, plan: Plan, alone: bool) -> None:  # noqa: FBT001 - as the field
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "alone", alone)


@dataclass(frozen=True, slots=True)
class Wait:
    """Keep holding the delivery for ``delay_s``, then take ``then`` (the same publish).

    A stop, or the broker closing the channel the delivery came on, during the wait lets
    the delivery go instead: the broker redelivers it.
    """

    delay_s: float
    then: Step


@dataclass(frozen=True, slots=True)
class WaitUnblocked:
    """Publish nothing until the broker unblocks the connection, then take ``then``.

    A stop first lets the delivery go: a copy written while blocked would sit in the socket
    and might reach the broker after the delivery was given back.
    """

    then: Step


@dataclass(frozen=True, slots=True)
class Ack:
    """The broker confirmed the plan's copy: ack the delivery and count ``outcome``."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Close the channel the delivery came on, so that the broker redelivers it.

    The route pauses with ``reason`` meanwhile. For a bug on the quarantine path: the
    delivery has nowhere left to go in this process, and must not spin.
    """

    reason: str


@dataclass(frozen=True, slots=True)
class LetGo:
    """Leave the delivery unacked to the broker: a stop, or its channel is gone."""


@dataclass(frozen=True, slots=True)
class Requeue:
    """Give the delivery back to its queue (``basic.reject``, requeue), for ``reason``.

    Its body passed through and is not held: its copy can be published again only from
    the broker's redelivery.
    """

    reason: str


Action: TypeAlias = Publish | Wait | WaitUnblocked | Ack | DeadLetter | GiveBack | LetGo | Requeue


# --- the state and the step ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class Attempt:
    """Where one delivery stands: its plan, on which channel, how often the plan was held."""

    plan: Plan
    alone: bool  # publish on a channel of its own (once a refusal was ambiguous)
    holds: int  # publishes of this plan the broker held back
    returns: int  # publishes of this plan the broker returned (settle.returns)
    # Why the delivery may not go back to its queue (its delivery limit), None while it may.
    last: str | None

    def __init__(
        self,
        plan: Plan,
        alone: bool = False,  # noqa: FBT001, FBT002
        holds: int = 0,
        returns: int = 0,
        last: str | None = None,
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "alone", alone)
        object.__setattr__(self, "holds", holds)
        object.__setattr__(self, "returns", returns)
        object.__setattr__(self, "last", last)


@dataclass(frozen=True, slots=True, init=False)
class Step:
    """What to do next, the state to come back with, and what was seen on the way."""

    action: Action
    attempt: Attempt
    events: tuple[Event, ...]

    def __init__(self, action: Action, attempt: Attempt, events: tuple[Event, ...] = ()) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "events", events)


_ACKS: Final = MappingProxyType({outcome: Ack(outcome) for outcome in Outcome})
_LET_GO: Final = LetGo()
_RETRIED: Final = (RetriedCopy(),)
_RETURN_RETRIED: Final = (ReturnRetried(),)
_ROUTED_ON_RETRY: Final = (RoutedOnRetry(),)


def begin(delivery: Delivery, target: Target, *, now_ms: int, new_id: Callable[[], str]) -> Step:
    """Plan a delivery that just arrived: the first step, a ``Publish``.

    A bug in planning quarantines the delivery: a redelivery would meet the same bug. A
    delivery one return from its queue's limit goes to quarantine, while a return still
    leaves it one; a body passed through goes there anyway, and may not go back either.
    """
    spent = delivery_limit_reached(
        delivery.headers, target.delivery_limit, redelivered=delivery.redelivered
    )
    if spent is not None and delivery.unread_body is None:
        quarantine = Quarantine(spent)
        return Step(Publish(quarantine, alone=False), Attempt(plan=quarantine, last=spent), ())
    try:
        plan, verdict = plan_delivery(delivery, target, now_ms=now_ms, new_id=new_id)
    except Exception as e:  # noqa: BLE001 - a bug quarantines the message; Bug carries it to the log
        quarantine = internal_error(e)
        return Step(
            Publish(quarantine, alone=False),
            Attempt(plan=quarantine),
            (Bug("unexpected error while normalising", e),),
        )
    events: tuple[Event, ...] = ()
    if verdict is not None and verdict.violations:
        events = (Violations(verdict),)
    # A body passing through takes a channel of its own: nothing else may go between its
    # frames.
    alone = isinstance(plan, Quarantine) and plan.passing
    return Step(Publish(plan, alone=alone), Attempt(plan=plan, alone=alone, last=spent), events)


def after(
    attempt: Attempt,
    answer: Answer,
    rules: Rules,
    *,
    held_s: float,
    backoff_step: int | None = None,
) -> Step:
    """Read the broker's ``answer`` to the publish of ``attempt``'s plan into the next step.

    ``held_s``: since the delivery arrived. ``rules``: the route's, whose backoff is drawn
    once for any answer but a confirm, at ``backoff_step`` (the attempt's holds unless
    given: a body passed through counts its rounds across redeliveries).
    """
    delay_s = _delay_s(answer, rules, attempt.holds if backoff_step is None else backoff_step)
    plan = attempt.plan
    reading = READINGS[answer_kind(answer), plan_kind(plan)]
    match reading:
        case Reading.LET_GO:
            return Step(_LET_GO, attempt, (Left(_words(answer)),))
        case Reading.BUG_IN_QUARANTINE:
            return _bug_in_quarantine(attempt, _error(answer))
        case Reading.BUG:
            error = _error(answer)
            bug = Bug("unexpected error while publishing", error)
            return _to_quarantine(attempt, internal_error(error), (bug,))
        case Reading.BLOCKED:
            again = Step(Publish(plan, alone=attempt.alone), attempt)
            return Step(WaitUnblocked(again), attempt, (Held(blocked(_words(answer))),))
        case Reading.UNROUTABLE:
            returns = attempt.returns + 1
            if (wait_s := return_retry_delay(returns, rules)) is not None:
                returned = Attempt(plan, attempt.alone, attempt.holds, returns, attempt.last)
                again = Step(Publish(plan, alone=returned.alone), returned)
                return Step(Wait(wait_s, again), returned, _RETURN_RETRIED)
            decision = decision_for(reading, answer, plan, rules, alone=attempt.alone)
            if isinstance(decision, Quarantine):
                decision = unroutable_after(decision, returns)
        case _:
            decision = decision_for(reading, answer, plan, rules, alone=attempt.alone)
    limits = rules.limits
    return _decided(decision, attempt, held_s=held_s, delay_s=delay_s, limits=limits)


def _bug_in_quarantine(attempt: Attempt, error: Exception) -> Step:
    """Give the delivery back: nowhere is left for it in this process, and it must not spin.

    One that may not go back (``Attempt.last``) is dead-lettered instead: the give-back's
    channel close would spend the last return its queue allows.
    """
    bug = (Bug("a delivery could not be settled", error),)
    if attempt.last is not None:
        dead = DeadLetter(f"internal error: {error!r}; {bounded(attempt.last)}")
        return Step(dead, attempt, bug)
    return Step(GiveBack(BUG_REASON), attempt, bug)


def _words(answer: Answer) -> str:
    """Return the words of a lost channel's error or of the broker's block."""
    if isinstance(answer, Lost):
        return answer.error
    if isinstance(answer, Blocked):
        return answer.reason
    raise TypeError(f"{answer!r} has no words")


def _error(answer: Answer) -> Exception:
    """Return the exception a failed publish kept."""
    if isinstance(answer, Failed):
        return answer.error
    raise TypeError(f"{answer!r} kept no exception")


def _delay_s(answer: Answer, rules: Rules, backoff_step: int) -> float:
    """Return the backoff's next delay, drawn for any answer that may hold the delivery."""
    return 0.0 if isinstance(answer, Confirmed) else rules.backoff(backoff_step)


PASSED_AGAIN = (
    "its body passed through and is not held: the delivery goes back to its queue, to be"
    " passed through again when the broker redelivers it"
)


def _published_once(step: Step, plan: Quarantine, *, delay_s: float) -> Step:
    """Turn a retry of a body passed through into a wait, then the delivery given back.

    One that may not go back (``Attempt.last``: its queue would drop it) is dead-lettered
    at once instead. Nothing else changes: an ack, a dead-letter, a give-back or a let-go
    stay as they are. A ``Blocked`` answer never comes here: nothing was published, the
    body still waits.
    """
    action, attempt = step.action, step.attempt
    if attempt.last is not None and isinstance(action, Wait | Publish):
        why = next((e.reason for e in step.events if isinstance(e, Held)), "refused")
        return Step(no_return_left(plan.reason, why, attempt.last), attempt, step.events)
    match action:
        case Wait(delay_s=wait_s):
            return Step(Wait(wait_s, Step(Requeue(PASSED_AGAIN), attempt)), attempt, step.events)
        case Publish():
            held = (*step.events, Held(PASSED_AGAIN))
            return Step(Wait(delay_s, Step(Requeue(PASSED_AGAIN), attempt)), attempt, held)
        case _:
            return step


def _decided(
    decision: Decision, attempt: Attempt, *, held_s: float, delay_s: float, limits: HoldLimits
) -> Step:
    """Turn what settlement decided about the answer into the next step.

    A body passed through was published once: a retry of it is a requeue instead.
    """
    step = _next(decision, attempt, held_s=held_s, delay_s=delay_s, limits=limits)
    plan = attempt.plan
    if isinstance(plan, Quarantine) and plan.passing:
        return _published_once(step, plan, delay_s=delay_s)
    return step


def _next(
    decision: Decision, attempt: Attempt, *, held_s: float, delay_s: float, limits: HoldLimits
) -> Step:
    match decision:
        case Done(outcome=outcome):
            plan = attempt.plan
            events: tuple[Event, ...] = ()
            if isinstance(plan, Quarantine):
                events = (Quarantined(plan.reason),)
            elif attempt.returns:
                events = _ROUTED_ON_RETRY
            return Step(_ACKS[outcome], attempt, events)
        case Quarantine():
            return _to_quarantine(attempt, decision, ())
        case Alone(may_duplicate=may_duplicate):
            alone = Attempt(attempt.plan, True, attempt.holds, attempt.returns, attempt.last)
            return Step(Publish(alone.plan, alone=True), alone, _RETRIED if may_duplicate else ())
        case Hold():
            return _hold(decision, attempt, held_s=held_s, delay_s=delay_s, limits=limits)
        case DeadLetter():
            return Step(decision, attempt)
        case _:
            assert_never(decision)


def _hold(
    hold: Hold, attempt: Attempt, *, held_s: float, delay_s: float, limits: HoldLimits
) -> Step:
    """Hold the delivery: wait and publish the same plan again, or say where it goes now."""
    plan = attempt.plan
    held = Attempt(plan, attempt.alone, attempt.holds + 1, attempt.returns, attempt.last)
    events: tuple[Event, ...] = (Held(hold.reason),)
    then = after_hold(
        hold, plan, attempts=held.holds, held_s=held_s, delay_s=delay_s, limits=limits
    )
    match then:
        case settlement_holds.Wait(delay_s=wait_s):
            again = Step(
                Publish(plan, alone=held.alone), held, _RETRIED if hold.may_duplicate else ()
            )
            return Step(Wait(wait_s, again), held, events)
        case Quarantine():
            return _to_quarantine(held, then, events)
        case DeadLetter():
            return Step(then, held, events)
        case _:
            assert_never(then)


def _to_quarantine(attempt: Attempt, quarantine: Quarantine, events: tuple[Event, ...]) -> Step:
    """Publish the original to quarantine instead, counted afresh, on the same kind of channel."""
    moved = Attempt(plan=quarantine, alone=attempt.alone, last=attempt.last)
    return Step(Publish(quarantine, alone=moved.alone), moved, events)
