"""One delivery's settlement as a pure step: the values, and the first step.

``begin`` plans a delivery that just arrived; ``sidecar.settle.table.after`` reads the
broker's answer to the plan's last publish. Each returns a ``Step``: the ``Action`` the
settler carries out next, the delivery's new ``Attempt`` and what was observed on the way
(``Event``), which the settler's one sink hands to metrics, the route log and the route's
state.

It must stay pure: no I/O, no clock, no randomness, no logging, no metrics. A wait names
the backoff's step and its bound (``Wait``); the relay draws the delay (``wait_s``), and
asks the route's budget when a step says so (``IfReturnBudget``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from sidecar.settle.events import Bug, Event, Violations
from sidecar.settle.holds import delivery_limit_reached
from sidecar.settle.settlement import (
    Copy,
    DeadLetter,
    Outcome,
    Quarantine,
    internal_error,
    plan_delivery,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.settle.settlement import Plan, Target
    from sidecar.wire import Delivery

__all__ = [
    "BUG_REASON",
    "Ack",
    "Action",
    "Attempt",
    "DeadLetter",
    "GiveBack",
    "IfReturnBudget",
    "LetGo",
    "Publish",
    "Requeue",
    "Step",
    "Wait",
    "WaitUnblocked",
    "begin",
    "shared_copy",
    "wait_s",
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
    """Keep holding the delivery, then take ``then`` (the same publish, or a requeue).

    For step ``backoff_step`` of the route's backoff, never longer than ``at_most_s``; for
    ``at_most_s`` when no step is named (``wait_s``). A stop, or the broker closing the
    channel the delivery came on, during the wait lets the delivery go instead: the broker
    redelivers it.
    """

    at_most_s: float
    then: Step
    backoff_step: int | None = None


def wait_s(wait: Wait, backoff: Callable[[int], float]) -> float:
    """Return how long ``wait`` lasts, ``backoff`` drawing its step's delay (the relay's)."""
    if wait.backoff_step is None:
        return wait.at_most_s
    return max(0.0, min(backoff(wait.backoff_step), wait.at_most_s))


@dataclass(frozen=True, slots=True)
class IfReturnBudget:
    """Take ``then`` (a returned copy published again) if the route's budget has one now.

    Else take ``otherwise`` (the original to quarantine, unroutable). The budget is the
    relay's (so many a second, ``sidecar.flow.RateBudget``), asked only here.
    """

    then: Step
    otherwise: Step


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


Action: TypeAlias = (
    Publish | Wait | WaitUnblocked | IfReturnBudget | Ack | DeadLetter | GiveBack | LetGo | Requeue
)


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


def shared_copy(step: Step) -> Copy | None:
    """Return the copy a step publishes on the route's shared channel; None for any other.

    Only such a copy may be published from the frame handler that read its delivery or
    its last answer, when nothing else stands in its way (a copy of the route's still
    waiting on a task, a closing channel, the broker's block, a channel to open).
    """
    action = step.action
    if isinstance(action, Publish) and not action.alone and isinstance(action.plan, Copy):
        return action.plan
    return None


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
