"""What each broker answer to each plan makes of a delivery: the settle step's table.

``TABLE`` maps the answer's kind and the plan's kind (the copy for the target, or the
original for quarantine) to the transition that makes the next ``Step``, as h11 keeps its
state machine: the lookup is the transition, every pair has one entry, and ``after``
applies it with nothing left to decide. The reasons and bounds a transition needs are
``settlement``'s, ``holds``'s and ``returns``'s. Pure: no I/O, no clock, no randomness (a
wait names the backoff's step; the relay draws it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar, assert_never

from sidecar.settle import holds as settlement_holds
from sidecar.settle.answers import (
    Answer,
    Blocked,
    Confirmed,
    Failed,
    Lost,
    Nacked,
    Refused,
    Returned,
    Unwritable,
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
)
from sidecar.settle.holds import after_hold, after_refusal, blocked, no_return_left
from sidecar.settle.returns import return_retry_delay, unroutable_after
from sidecar.settle.rules import Rules
from sidecar.settle.settlement import (
    Alone,
    Copy,
    DeadLetter,
    Hold,
    Outcome,
    Quarantine,
    bounded,
    internal_error,
    nacked,
    unencodable,
    unroutable,
    untaken,
    unwritable_quarantine,
)
from sidecar.settle.step import (
    BUG_REASON,
    Ack,
    Attempt,
    GiveBack,
    IfReturnBudget,
    LetGo,
    Publish,
    Requeue,
    Step,
    Wait,
    WaitUnblocked,
)
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from sidecar.settle.settlement import Plan

__all__ = [
    "ANSWER_KINDS",
    "LOST_CHANNEL",
    "PASSED_AGAIN",
    "PLAN_KINDS",
    "TABLE",
    "Timing",
    "Transition",
    "after",
    "answer_kind",
    "plan_kind",
]

LOST_CHANNEL = "the publish channel closed; retrying on a new one"
PASSED_AGAIN = (
    "its body passed through and is not held: the delivery goes back to its queue, to be"
    " passed through again when the broker redelivers it"
)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the delivery has been held, and the backoff's step for its next wait."""

    held_s: float
    backoff_step: int


Transition: TypeAlias = Callable[[Attempt, Answer, Rules, Timing], Step]

_ACKS: Final = MappingProxyType({outcome: Ack(outcome) for outcome in Outcome})
_LET_GO: Final = LetGo()
_RETRIED: Final = (RetriedCopy(),)
_RETURN_RETRIED: Final = (ReturnRetried(),)
_ROUTED_ON_RETRY: Final = (RoutedOnRetry(),)
_A = TypeVar("_A")


def _as(answer: Answer, kind: type[_A]) -> _A:
    """Return the answer as the kind its table entry says it is (a wrong entry raises)."""
    if not isinstance(answer, kind):
        raise TypeError(f"{answer!r} is not {kind.__name__}: the table's entry is wrong")
    return answer


def _copy(attempt: Attempt) -> Copy:
    plan = attempt.plan
    if not isinstance(plan, Copy):
        raise TypeError(f"{plan!r} is not a copy: the table's entry is wrong")
    return plan


def _quarantine(attempt: Attempt) -> Quarantine:
    plan = attempt.plan
    if not isinstance(plan, Quarantine):
        raise TypeError(f"{plan!r} is not a quarantine copy: the table's entry is wrong")
    return plan


# --- the transitions, one per entry of the table --------------------------------------------


def _relayed(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Ack: the target took the copy (counted as the copy's outcome)."""
    _as(answer, Confirmed)
    events = _ROUTED_ON_RETRY if attempt.returns else ()
    return Step(_ACKS[_copy(attempt).outcome], attempt, events)


def _quarantined(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Ack: quarantine took the original (counted as quarantined)."""
    _as(answer, Confirmed)
    quarantine = _quarantine(attempt)
    return Step(_ACKS[Outcome.QUARANTINED], attempt, (Quarantined(quarantine.reason),))


def _unroutable(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Publish a copy nothing routed again, or the original to quarantine (unroutable).

    Again while the route's rules and budget allow (``settle.returns``).
    """
    _as(answer, Returned)
    copy, returns = _copy(attempt), attempt.returns + 1
    quarantine = unroutable_after(unroutable(rules.exchange, copy.routing_key), returns)
    otherwise = _to_quarantine(attempt, quarantine, ())
    if (wait_s := return_retry_delay(returns, rules)) is None:
        return otherwise
    returned = Attempt(copy, attempt.alone, attempt.holds, returns, attempt.last)
    again = Step(Publish(copy, alone=returned.alone), returned)
    retry = Step(Wait(wait_s, again), returned, _RETURN_RETRIED)
    return Step(IfReturnBudget(retry, otherwise), attempt)


def _nacked(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Hold a copy the target refused for now, to publish it again (it may duplicate)."""
    _as(answer, Nacked)
    _copy(attempt)
    return _decided(nacked(rules.exchange), attempt, rules, timing)


def _untaken(published: PublishOutcome) -> Transition:
    """Return the hold of a quarantine copy returned or nacked (``published``)."""

    def untaken_(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
        if PUBLISHED_AS[type(answer)] is not published:
            raise TypeError(f"{answer!r} is not {published.value}: the table's entry is wrong")
        hold = untaken(
            published,
            exchange=rules.quarantine_exchange,
            route=rules.route,
            passing=_quarantine(attempt).passing,
        )
        return _decided(hold, attempt, rules, timing)

    return untaken_


def _refused(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Read the broker's close of the channel: its code, and whether the publish was alone."""
    refused = _as(answer, Refused)
    where = rules.exchange_of(attempt.plan)
    decision = after_refusal(
        refused.code, refused.text, attempt.plan, alone=attempt.alone, exchange=where
    )
    return _decided(decision, attempt, rules, timing)


def _let_go(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Let go: a stop or the connection took the channel, the broker has the delivery back."""
    return Step(_LET_GO, attempt, (Left(_as(answer, Lost).error),))


def _lost(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Hold: another publish's refusal took the shared channel (it may have been routed)."""
    _as(answer, Lost)
    return _decided(Hold(LOST_CHANNEL, may_duplicate=True), attempt, rules, timing)


def _unencodable(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Quarantine the original: the copy cannot be written."""
    quarantine = unencodable(_as(answer, Unwritable).error)
    return _decided(quarantine, attempt, rules, timing)


def _unwritable(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Dead-letter: the quarantine copy cannot be written either."""
    error = _as(answer, Unwritable).error
    dead = unwritable_quarantine(_quarantine(attempt).reason, error)
    return _decided(dead, attempt, rules, timing)


def _bug(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Quarantine the original after a bug while publishing the copy (the bug logged)."""
    error = _as(answer, Failed).error
    _copy(attempt)
    bug = Bug("unexpected error while publishing", error)
    return _to_quarantine(attempt, internal_error(error), (bug,))


def _bug_in_quarantine(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Give the delivery back after a bug publishing its quarantine copy: never spin.

    One that may not go back (``Attempt.last``) is dead-lettered instead: the give-back's
    channel close would spend the last return its queue allows.
    """
    error = _as(answer, Failed).error
    _quarantine(attempt)
    bug = (Bug("a delivery could not be settled", error),)
    if attempt.last is not None:
        dead = DeadLetter(f"internal error: {error!r}; {bounded(attempt.last)}")
        return Step(dead, attempt, bug)
    return Step(GiveBack(BUG_REASON), attempt, bug)


def _blocked(attempt: Attempt, answer: Answer, rules: Rules, timing: Timing) -> Step:
    """Wait, publishing nothing, until the broker unblocks the connection."""
    reason = _as(answer, Blocked).reason
    again = Step(Publish(attempt.plan, alone=attempt.alone), attempt)
    return Step(WaitUnblocked(again), attempt, (Held(blocked(reason)),))


PUBLISHED_AS: Final[Mapping[type, PublishOutcome | None]] = MappingProxyType(
    {
        Confirmed: PublishOutcome.CONFIRMED,
        Returned: PublishOutcome.RETURNED,
        Nacked: PublishOutcome.NACKED,
        Refused: None,
        Lost: None,
        Unwritable: None,
        Failed: None,
        Blocked: None,
    }
)

ANSWER_KINDS: Final = (
    "confirmed",
    "returned",
    "nacked",
    "refused",
    "lost, gone",
    "lost",
    "unwritable",
    "failed",
    "blocked",
)
PLAN_KINDS: Final = ("copy", "quarantine")

TABLE: Final[Mapping[tuple[str, str], Transition]] = MappingProxyType(
    {
        ("confirmed", "copy"): _relayed,
        ("confirmed", "quarantine"): _quarantined,
        ("returned", "copy"): _unroutable,
        ("returned", "quarantine"): _untaken(PublishOutcome.RETURNED),
        ("nacked", "copy"): _nacked,
        ("nacked", "quarantine"): _untaken(PublishOutcome.NACKED),
        ("refused", "copy"): _refused,
        ("refused", "quarantine"): _refused,
        ("lost, gone", "copy"): _let_go,
        ("lost, gone", "quarantine"): _let_go,
        ("lost", "copy"): _lost,
        ("lost", "quarantine"): _lost,
        ("unwritable", "copy"): _unencodable,
        ("unwritable", "quarantine"): _unwritable,
        ("failed", "copy"): _bug,
        ("failed", "quarantine"): _bug_in_quarantine,
        ("blocked", "copy"): _blocked,
        ("blocked", "quarantine"): _blocked,
    }
)

_KINDS: Final[Mapping[type, str]] = MappingProxyType(
    {
        Confirmed: "confirmed",
        Returned: "returned",
        Nacked: "nacked",
        Refused: "refused",
        Lost: "lost",
        Unwritable: "unwritable",
        Failed: "failed",
        Blocked: "blocked",
    }
)


def answer_kind(answer: Answer) -> str:
    """Return the answer's kind in the table: a lost channel that went with a stop apart."""
    if isinstance(answer, Lost) and answer.gone:
        return "lost, gone"
    return _KINDS[type(answer)]


def plan_kind(plan: Plan) -> str:
    """Return the plan's kind in the table."""
    return "quarantine" if isinstance(plan, Quarantine) else "copy"


def after(
    attempt: Attempt,
    answer: Answer,
    rules: Rules,
    *,
    held_s: float,
    backoff_step: int | None = None,
) -> Step:
    """Return the step after the broker's ``answer`` to the publish of ``attempt``'s plan.

    ``held_s``: since the delivery arrived. ``rules``: the route's. A wait is at step
    ``backoff_step`` of the backoff (the attempt's holds unless given: a body passed
    through counts its rounds across redeliveries).
    """
    step = attempt.holds if backoff_step is None else backoff_step
    transition = TABLE[answer_kind(answer), plan_kind(attempt.plan)]
    return transition(attempt, answer, rules, Timing(held_s, step))


# --- what the transitions share -------------------------------------------------------------

Decision: TypeAlias = Quarantine | Hold | Alone | DeadLetter


def _decided(decision: Decision, attempt: Attempt, rules: Rules, timing: Timing) -> Step:
    """Turn what the broker's words decided into the next step.

    A body passed through was published once: a retry of it is a requeue instead.
    """
    step = _next(decision, attempt, rules, timing)
    plan = attempt.plan
    if isinstance(plan, Quarantine) and plan.passing:
        return _published_once(step, plan, timing)
    return step


def _next(decision: Decision, attempt: Attempt, rules: Rules, timing: Timing) -> Step:
    match decision:
        case Quarantine():
            return _to_quarantine(attempt, decision, ())
        case Alone(may_duplicate=may_duplicate):
            alone = Attempt(attempt.plan, True, attempt.holds, attempt.returns, attempt.last)
            return Step(Publish(alone.plan, alone=True), alone, _RETRIED if may_duplicate else ())
        case Hold():
            return _hold(decision, attempt, rules, timing)
        case DeadLetter():
            return Step(decision, attempt)
        case _:
            assert_never(decision)


def _hold(hold: Hold, attempt: Attempt, rules: Rules, timing: Timing) -> Step:
    """Hold the delivery: wait and publish the same plan again, or say where it goes now."""
    plan = attempt.plan
    held = Attempt(plan, attempt.alone, attempt.holds + 1, attempt.returns, attempt.last)
    events: tuple[Event, ...] = (Held(hold.reason),)
    then = after_hold(hold, plan, attempts=held.holds, held_s=timing.held_s, limits=rules.limits)
    match then:
        case settlement_holds.Wait(at_most_s=at_most_s):
            again = Step(
                Publish(plan, alone=held.alone), held, _RETRIED if hold.may_duplicate else ()
            )
            return Step(Wait(at_most_s, again, timing.backoff_step), held, events)
        case Quarantine():
            return _to_quarantine(held, then, events)
        case DeadLetter():
            return Step(then, held, events)
        case _:
            assert_never(then)


def _published_once(step: Step, plan: Quarantine, timing: Timing) -> Step:
    """Turn a retry of a body passed through into a wait, then the delivery given back.

    One that may not go back (``Attempt.last``: its queue would drop it) is dead-lettered
    at once instead. Nothing else changes: a dead-letter stays as it is.
    """
    action, attempt = step.action, step.attempt
    if attempt.last is not None and isinstance(action, Wait | Publish):
        why = next((e.reason for e in step.events if isinstance(e, Held)), "refused")
        return Step(no_return_left(plan.reason, why, attempt.last), attempt, step.events)
    requeue = Step(Requeue(PASSED_AGAIN), attempt)
    match action:
        case Wait(at_most_s=at_most_s, backoff_step=backoff_step):
            return Step(Wait(at_most_s, requeue, backoff_step), attempt, step.events)
        case Publish():
            held = (*step.events, Held(PASSED_AGAIN))
            return Step(Wait(math.inf, requeue, timing.backoff_step), attempt, held)
        case _:
            return step


def _to_quarantine(attempt: Attempt, quarantine: Quarantine, events: tuple[Event, ...]) -> Step:
    """Publish the original to quarantine instead, counted afresh, on the same kind of channel."""
    moved = Attempt(plan=quarantine, alone=attempt.alone, last=attempt.last)
    return Step(Publish(quarantine, alone=moved.alone), moved, events)
