"""The settle step's table of answers and plans, walked as data (``settle.readings``).

Every pair of an answer's kind and a plan's kind has one reading; for each entry of the
table, ``after`` on such an answer to such a plan takes the next step the reading names.
"""

from __future__ import annotations

import itertools
import typing
from collections.abc import Callable

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
from sidecar.settle.events import Bug
from sidecar.settle.holds import HoldLimits
from sidecar.settle.readings import (
    ANSWER_KINDS,
    PLAN_KINDS,
    READINGS,
    Reading,
    answer_kind,
    plan_kind,
)
from sidecar.settle.settlement import Copy, DeadLetter, Outcome, Plan, Quarantine
from sidecar.settle.step import (
    Ack,
    Attempt,
    GiveBack,
    LetGo,
    Publish,
    Step,
    Wait,
    WaitUnblocked,
    after,
)

COPY = Copy(properties={}, headers={}, routing_key="k.1", outcome=Outcome.RELAYED)
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
    backoff=lambda _holds: 1.0,
)


def to_quarantine(step: Step) -> bool:
    return isinstance(step.action, Publish) and isinstance(step.action.plan, Quarantine)


def held(step: Step) -> bool:
    return isinstance(step.action, Wait) and isinstance(step.action.then.action, Publish)


# What each reading's next step is, whatever the plan.
TAKES: dict[Reading, Callable[[Step], bool]] = {
    Reading.DONE: lambda step: isinstance(step.action, Ack),
    Reading.UNROUTABLE: to_quarantine,
    Reading.NACKED: held,
    Reading.UNTAKEN: held,
    # Shared, a refusal the broker repeats may be another's: the same plan, alone.
    Reading.REFUSED: lambda step: isinstance(step.action, Publish) and step.action.alone,
    Reading.LET_GO: lambda step: isinstance(step.action, LetGo),
    Reading.LOST: held,
    Reading.UNENCODABLE: to_quarantine,
    Reading.UNWRITABLE: lambda step: isinstance(step.action, DeadLetter),
    Reading.BUG: lambda step: to_quarantine(step) and isinstance(step.events[-1], Bug),
    Reading.BUG_IN_QUARANTINE: lambda step: isinstance(step.action, GiveBack),
    Reading.BLOCKED: lambda step: isinstance(step.action, WaitUnblocked),
}


def test_every_answer_and_plan_has_one_reading() -> None:
    assert set(READINGS) == set(itertools.product(ANSWER_KINDS, PLAN_KINDS))
    assert set(READINGS.values()) == set(Reading)  # and no reading is unreachable


def test_every_answer_class_has_a_kind_in_the_table() -> None:
    classes = set(typing.get_args(Answer))
    assert {type(answer) for answer in ANSWERS.values()} == classes
    assert {answer_kind(answer) for answer in ANSWERS.values()} == set(ANSWER_KINDS)
    assert {plan_kind(plan) for plan in PLANS.values()} == set(PLAN_KINDS)


@pytest.mark.parametrize(("pair", "reading"), sorted(READINGS.items(), key=str))
def test_each_entry_is_the_step_after_takes(pair: tuple[str, str], reading: Reading) -> None:
    answer_name, plan_name = pair
    answer, plan = ANSWERS[answer_name], PLANS[plan_name]
    assert (answer_kind(answer), plan_kind(plan)) == pair
    step = after(Attempt(plan=plan), answer, RULES, held_s=0.0)
    assert TAKES[reading](step), f"{pair}: {reading.name} but {step.action!r}"
