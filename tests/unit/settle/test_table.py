"""The settle step's table of answers and plans, walked as data (``settle.table``).

Every pair of an answer's kind and a plan's kind has one transition, and ``after`` applies
it. ``EXPECTED`` says, independently of the table, what each pair must make of a first
publish: the next action, the plan it publishes (if any), on which channel, and what was
seen. Putting any other of the table's transitions in an entry's place fails that
entry's test (checked here for every entry and every other transition).
"""

from __future__ import annotations

import itertools
import typing

import pytest

from sidecar.settle import Rules
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
from sidecar.settle.holds import HoldLimits
from sidecar.settle.settlement import Copy, Outcome, Plan, Quarantine
from sidecar.settle.step import Attempt, Publish, Step, Wait, WaitUnblocked, shared_copy
from sidecar.settle.table import (
    ANSWER_KINDS,
    PLAN_KINDS,
    TABLE,
    Timing,
    Transition,
    after,
    answer_kind,
    plan_kind,
)

COPY = Copy(properties={}, headers={}, routing_key="k.1", outcome=Outcome.AUDITED)
PLANS: dict[str, Plan] = {"copy": COPY, "quarantine": Quarantine("a reason")}
ANSWERS: dict[str, Answer] = {
    "confirmed": Confirmed(),
    "returned": Returned(),
    "nacked": Nacked(),
    "refused": Refused(406, "PRECONDITION_FAILED"),
    "lost, gone": Lost(gone=True, error="stopping"),
    "lost": Lost(gone=False, error="channel 2 closed"),
    "unwritable": Unwritable("a header too large"),
    "failed": Failed(RuntimeError("boom")),
    "blocked": Blocked("low on memory"),
}
RULES = Rules(
    limits=HoldLimits(consumer_timeout_s=1800.0, nack_max_attempts=10, nack_max_s=300.0),
    exchange="orders",
    quarantine_exchange="acemq.quarantine",
    route="orders",
    returns_retried=1,
)


def shape(step: Step) -> tuple[object, ...]:
    """What a step does, in words a test can state: the action, its plan, and the events.

    A wait names what follows it; a publish, whether it is the copy or the quarantine copy,
    and whether alone; an ack, its outcome.
    """
    action = step.action
    events = tuple(type(event).__name__ for event in step.events)
    match action:
        case Publish(plan=plan, alone=alone):
            return ("Publish", plan_kind(plan), alone, events)
        case Wait(then=then) | WaitUnblocked(then=then):
            return (type(action).__name__, shape(then), events)
        case _:
            return (type(action).__name__, getattr(action, "outcome", None), events)


HELD = ("Held",)
AGAIN_COPY = ("Publish", "copy", False, ("RetriedCopy",))
AGAIN_QUARANTINE = ("Publish", "quarantine", False, ("RetriedCopy",))
EXPECTED: dict[tuple[str, str], tuple[object, ...]] = {
    ("confirmed", "copy"): ("Ack", Outcome.AUDITED, ()),
    ("confirmed", "quarantine"): ("Ack", Outcome.QUARANTINED, ("Quarantined",)),
    # Returned once with a retry left: published again if the route's budget has one.
    ("returned", "copy"): ("IfReturnBudget", None, ()),
    ("returned", "quarantine"): ("Wait", ("Publish", "quarantine", False, ()), HELD),
    ("nacked", "copy"): ("Wait", AGAIN_COPY, HELD),
    ("nacked", "quarantine"): ("Wait", AGAIN_QUARANTINE, HELD),
    # Shared, a refusal the broker repeats may be another's: the same plan, alone.
    ("refused", "copy"): ("Publish", "copy", True, ("RetriedCopy",)),
    ("refused", "quarantine"): ("Publish", "quarantine", True, ("RetriedCopy",)),
    ("lost, gone", "copy"): ("LetGo", None, ("Left",)),
    ("lost, gone", "quarantine"): ("LetGo", None, ("Left",)),
    ("lost", "copy"): ("Wait", AGAIN_COPY, HELD),
    ("lost", "quarantine"): ("Wait", AGAIN_QUARANTINE, HELD),
    ("unwritable", "copy"): ("Publish", "quarantine", False, ()),
    ("unwritable", "quarantine"): ("DeadLetter", None, ()),
    ("failed", "copy"): ("Publish", "quarantine", False, ("Bug",)),
    ("failed", "quarantine"): ("GiveBack", None, ("Bug",)),
    ("blocked", "copy"): ("WaitUnblocked", ("Publish", "copy", False, ()), HELD),
    ("blocked", "quarantine"): ("WaitUnblocked", ("Publish", "quarantine", False, ()), HELD),
}


def test_every_answer_and_plan_has_one_transition() -> None:
    assert set(TABLE) == set(itertools.product(ANSWER_KINDS, PLAN_KINDS)) == set(EXPECTED)


def test_every_answer_class_has_a_kind_in_the_table() -> None:
    classes = set(typing.get_args(Answer))
    assert {type(answer) for answer in ANSWERS.values()} == classes
    assert {answer_kind(answer) for answer in ANSWERS.values()} == set(ANSWER_KINDS)
    assert {plan_kind(plan) for plan in PLANS.values()} == set(PLAN_KINDS)


@pytest.mark.parametrize("pair", sorted(EXPECTED), ids=" x ".join)
def test_each_entry_makes_the_step_expected(pair: tuple[str, str]) -> None:
    answer_name, plan_name = pair
    step = after(Attempt(plan=PLANS[plan_name]), ANSWERS[answer_name], RULES, held_s=0.0)
    assert shape(step) == EXPECTED[pair]


def _made(transition: Transition, pair: tuple[str, str]) -> tuple[object, ...] | None:
    """The shape ``transition`` makes of the pair's inputs; None when it refuses them."""
    answer_name, plan_name = pair
    attempt = Attempt(plan=PLANS[plan_name])
    try:
        return shape(transition(attempt, ANSWERS[answer_name], RULES, Timing(0.0, 0)))
    except TypeError:  # a transition given an answer or a plan not its own
        return None


@pytest.mark.parametrize("pair", sorted(TABLE), ids=" x ".join)
def test_any_other_transition_in_an_entrys_place_fails_its_test(pair: tuple[str, str]) -> None:
    """The table's tests see every entry: no other transition passes for this one."""
    others = {transition for transition in TABLE.values() if transition is not TABLE[pair]}
    passing = [t.__name__ for t in others if _made(t, pair) == EXPECTED[pair]]
    assert passing == []


def test_only_a_copy_on_the_shared_channel_may_go_from_the_frame_handler() -> None:
    assert shared_copy(Step(Publish(COPY, alone=False), Attempt(plan=COPY))) == COPY
    assert shared_copy(Step(Publish(COPY, alone=True), Attempt(plan=COPY, alone=True))) is None
    quarantine = PLANS["quarantine"]
    assert shared_copy(Step(Publish(quarantine, alone=False), Attempt(plan=quarantine))) is None
    waiting = Step(Wait(1.0, Step(Publish(COPY, alone=False), Attempt(plan=COPY))), Attempt(COPY))
    assert shared_copy(waiting) is None


def test_a_plan_is_published_to_the_routes_exchange_or_quarantines() -> None:
    assert RULES.exchange_of(COPY) == "orders"
    assert RULES.exchange_of(PLANS["quarantine"]) == "acemq.quarantine"
