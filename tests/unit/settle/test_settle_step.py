"""The settle step, pure: each answer to each plan, and whole sequences of broker answers.

The table tests read one answer to a first publish of each kind of plan. The properties
walk a delivery from ``begin`` through answers that hypothesis picks, carrying out each
action as the settler would (a wait advances the time held, a blocked connection unblocks),
and check what must hold of every such walk.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis import target as aim_for

from sidecar.contract import Policy, Publishers
from sidecar.flow.backoff import Backoff
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
from sidecar.settle.events import Bug, Held, Left, Quarantined, RetriedCopy, Violations
from sidecar.settle.holds import (
    DEAD_LETTER_SHARE,
    DEADLINE_SLACK_S,
    REPEATED_REFUSALS,
    HoldLimits,
    blocked,
)
from sidecar.settle.rules import Rules
from sidecar.settle.settlement import DELIVERY_COUNT, Copy, Outcome, Plan, Quarantine, Target
from sidecar.settle.step import (
    Ack,
    Attempt,
    DeadLetter,
    GiveBack,
    IfReturnBudget,
    LetGo,
    Publish,
    Requeue,
    Step,
    Wait,
    WaitUnblocked,
    begin,
    wait_s,
)
from sidecar.settle.table import LOST_CHANNEL, after
from sidecar.wire import Delivery, Int32, Int64, UnreadBody

COPY = Copy(properties={}, headers={}, routing_key="k.1", outcome=Outcome.RELAYED)
TO_QUARANTINE = Quarantine("unroutable: no binding")
LIMITS = HoldLimits(consumer_timeout_s=100.0, nack_max_attempts=3, nack_max_s=30.0)
QUARANTINE_EXCHANGE = "acemq.quarantine"
BOOM = RuntimeError("boom")
# The least delay the settler's backoff gives (the first step, jitter 0): what a wait lasts
# at least, unless it is cut to its deadline.
SHORTEST_DELAY_S = Backoff().base_s / 2
CANONICAL: dict[str, Any] = {
    "x-acemq-id": "m-1",
    "x-acemq-type": "order.placed",
    "x-acemq-version": Int32(1),
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
}


def step_after(
    attempt: Attempt,
    answer: Answer,
    *,
    held_s: float = 0.0,
    limits: HoldLimits = LIMITS,
) -> Step:
    rules = Rules(
        limits=limits,
        exchange="orders",
        quarantine_exchange=QUARANTINE_EXCHANGE,
        route="orders",
    )
    return after(attempt, answer, rules, held_s=held_s)


def delivery(
    headers: dict[str, Any] | None = None,
    *,
    properties: dict[str, Any] | None = None,
    redelivered: bool = False,
) -> Delivery:
    return Delivery(
        delivery_tag=7,
        exchange="",
        routing_key="order.placed",
        redelivered=redelivered,
        properties=MappingProxyType({"message_id": "m-1"} if properties is None else properties),
        headers=MappingProxyType(dict(CANONICAL) if headers is None else headers),
        body=b"body",
    )


def target(*, publishers: Publishers = Publishers.ACEMQ) -> Target:
    policy = Policy(publishers=publishers, origin=None, login="sidecar")
    return Target(
        queue="staging.orders", exchange="orders", routing_key=None, audit=False, policy=policy
    )


def new_id() -> str:
    return "00000000-0000-4000-8000-000000000000"


# --- begin ---------------------------------------------------------------------------------


def test_a_canonical_delivery_begins_with_its_copy_on_the_shared_channel() -> None:
    step = begin(delivery(), target(), now_ms=1_790_000_000_000, new_id=new_id)
    assert isinstance(step.action, Publish)
    assert isinstance(step.action.plan, Copy)
    assert not step.action.alone
    assert step.attempt == Attempt(plan=step.action.plan)
    assert step.events == ()


@pytest.mark.parametrize(
    ("spent", "quarantined"), [(0, False), (18, False), (19, True), (20, True)]
)
def test_a_delivery_one_return_from_its_last_begins_with_quarantine_naming_the_limit(
    spent: int, *, quarantined: bool
) -> None:
    """At 19 of the default 20 spent, one more return would leave only the last delivery."""
    message = delivery({**CANONICAL, DELIVERY_COUNT: Int64(spent)}, redelivered=True)
    step = begin(message, target(), now_ms=1_790_000_000_000, new_id=new_id)
    assert isinstance(step.action, Publish)
    plan = step.action.plan
    if quarantined:
        assert isinstance(plan, Quarantine)
        assert plan.reason.startswith("delivery limit: ")
        assert f"back {spent} times" in plan.reason
        assert "x-delivery-limit 20" in plan.reason
        assert step.events == ()
    else:
        assert isinstance(plan, Copy)


def test_violations_are_an_event_of_the_first_step() -> None:
    step = begin(delivery({"x-acemq-id": "m-1"}), target(), now_ms=0, new_id=new_id)
    assert isinstance(step.action, Publish)
    assert len(step.events) == 1
    assert isinstance(step.events[0], Violations)
    assert step.events[0].verdict.violations


def test_a_rejected_delivery_begins_with_its_quarantine_copy() -> None:
    step = begin(
        delivery({"x-acemq-tenant": "acme"}),
        target(publishers=Publishers.APPS),
        now_ms=0,
        new_id=new_id,
    )
    assert isinstance(step.action, Publish)
    assert isinstance(step.action.plan, Quarantine)


def test_a_bug_while_planning_quarantines_and_is_reported() -> None:
    """A redelivery would meet the same bug: the message goes to quarantine instead."""

    def broken() -> str:  # the id source fails: planning raises from inside the contract
        raise BOOM

    no_id = {name: value for name, value in CANONICAL.items() if name != "x-acemq-id"}
    step = begin(delivery(no_id, properties={}), target(), now_ms=0, new_id=broken)
    assert step.action == Publish(Quarantine("internal error: RuntimeError('boom')"), alone=False)
    assert step.events == (Bug("unexpected error while normalising", BOOM),)


# --- each answer to each plan --------------------------------------------------------------


def summary(step: Step) -> tuple[object, ...]:
    """The step as the table below writes it: the action's kind and what sets it apart."""
    events = tuple(type(event).__name__ for event in step.events)
    match step.action:
        case Publish(plan=plan, alone=alone):
            kind = "copy" if isinstance(plan, Copy) else "quarantine"
            return ("publish", kind, "alone" if alone else "shared", events)
        case Wait(then=then):
            assert then.action == Publish(step.attempt.plan, alone=step.attempt.alone)
            retried = "retried" if then.events == (RetriedCopy(),) else "not counted"
            return ("wait", retried, events)
        case WaitUnblocked(then=then):
            assert then.action == Publish(step.attempt.plan, alone=step.attempt.alone)
            return ("unblocked", events)
        case Ack(outcome=outcome):
            return ("ack", outcome, events)
        case DeadLetter() | GiveBack() | LetGo() | Requeue() | IfReturnBudget():
            return (type(step.action).__name__, events)


SHARED_ONLY = "shared"  # a case that only holds on the shared channel
ALONE_ONLY = "alone"
BOTH = "both"
# (answer, plan, channels, what the step does: alone or shared as the attempt was unless said)
TABLE: list[tuple[Answer, Plan, str, tuple[object, ...]]] = [
    (Confirmed(), COPY, BOTH, ("ack", Outcome.RELAYED, ())),
    (Confirmed(), TO_QUARANTINE, BOTH, ("ack", Outcome.QUARANTINED, ("Quarantined",))),
    (Returned(), COPY, BOTH, ("publish", "quarantine", "same", ())),
    (Returned(), TO_QUARANTINE, BOTH, ("wait", "not counted", ("Held",))),
    (Nacked(), COPY, BOTH, ("wait", "retried", ("Held",))),
    (Nacked(), TO_QUARANTINE, BOTH, ("wait", "retried", ("Held",))),
    (Refused(403, "denied"), COPY, SHARED_ONLY, ("publish", "copy", "alone", ("RetriedCopy",))),
    (Refused(403, "denied"), COPY, ALONE_ONLY, ("publish", "quarantine", "alone", ())),
    (
        Refused(406, "too big"),
        TO_QUARANTINE,
        SHARED_ONLY,
        ("publish", "quarantine", "alone", ("RetriedCopy",)),
    ),
    (Refused(406, "too big"), TO_QUARANTINE, ALONE_ONLY, ("DeadLetter", ())),
    (Refused(541, "internal"), COPY, BOTH, ("wait", "retried", ("Held",))),
    (Refused(541, "internal"), TO_QUARANTINE, BOTH, ("wait", "retried", ("Held",))),
    (Lost(gone=True), COPY, BOTH, ("LetGo", ("Left",))),
    (Lost(gone=True), TO_QUARANTINE, BOTH, ("LetGo", ("Left",))),
    (Lost(gone=False), COPY, BOTH, ("wait", "retried", ("Held",))),
    (Lost(gone=False), TO_QUARANTINE, BOTH, ("wait", "retried", ("Held",))),
    (Unwritable("too big"), COPY, BOTH, ("publish", "quarantine", "same", ())),
    (Unwritable("too big"), TO_QUARANTINE, BOTH, ("DeadLetter", ())),
    (Failed(BOOM), COPY, BOTH, ("publish", "quarantine", "same", ("Bug",))),
    (Failed(BOOM), TO_QUARANTINE, BOTH, ("GiveBack", ("Bug",))),
    (Blocked("low on memory"), COPY, BOTH, ("unblocked", ("Held",))),
    (Blocked("low on memory"), TO_QUARANTINE, BOTH, ("unblocked", ("Held",))),
]
CASES = [
    pytest.param(answer, plan, alone, expected, id=f"{answer}-{type(plan).__name__}-{alone}")
    for answer, plan, channels, expected in TABLE
    for alone in (False, True)
    if channels == BOTH or (channels == ALONE_ONLY) is alone
]


@pytest.mark.parametrize(("answer", "plan", "alone", "expected"), CASES)
def test_what_each_answer_to_each_plan_does(
    answer: Answer,
    plan: Plan,
    alone: bool,  # noqa: FBT001 - a parametrised case
    expected: tuple[object, ...],
) -> None:
    """A first publish of the plan, shared or alone, and the broker's one answer."""
    step = step_after(Attempt(plan=plan, alone=alone), answer)
    same = "alone" if alone else "shared"
    assert summary(step) == tuple(same if part == "same" else part for part in expected)


def test_the_table_covers_every_answer_and_plan_on_both_channels() -> None:
    kinds = {
        (type(answer), type(plan), alone) for answer, plan, alone, _ in (c.values for c in CASES)
    }
    answers = {Confirmed, Returned, Nacked, Refused, Lost, Unwritable, Failed, Blocked}
    assert kinds == {
        (a, p, alone) for a in answers for p in (Copy, Quarantine) for alone in (False, True)
    }


def test_a_held_copy_says_why_and_counts_the_hold() -> None:
    step = step_after(Attempt(plan=COPY, holds=1), Lost(gone=False))
    assert step.events == (Held(LOST_CHANNEL),)
    assert step.attempt == Attempt(plan=COPY, holds=2)
    assert isinstance(step.action, Wait)
    assert step.action.backoff_step == 1  # the holds before this one: the relay draws it
    assert wait_s(step.action, lambda n: 2.0 * n) == 2.0


def test_a_quarantine_copy_starts_counting_afresh_on_the_same_channel() -> None:
    step = step_after(Attempt(plan=COPY, alone=True, holds=2), Returned())
    assert isinstance(step.action, Publish)
    assert step.attempt == Attempt(plan=step.action.plan, alone=True, holds=0)


def test_the_last_hold_of_a_copy_sends_it_to_quarantine() -> None:
    """nack_max_attempts 3: the third nack is not waited on."""
    step = step_after(Attempt(plan=COPY, holds=2), Nacked())
    assert isinstance(step.action, Publish)
    assert isinstance(step.action.plan, Quarantine)
    assert "3 attempts" in step.action.plan.reason
    assert [type(event) for event in step.events] == [Held]


def test_a_quarantine_copy_held_to_its_deadline_is_dead_lettered() -> None:
    step = step_after(Attempt(plan=TO_QUARANTINE, holds=40), Returned(), held_s=75.0)
    assert isinstance(step.action, DeadLetter)
    assert step.action.reason.startswith("unroutable: no binding; and for 75.0s:")


def test_a_blocked_connection_is_held_with_the_brokers_reason() -> None:
    """Not a hold of the plan: the count of holds stays, the same publish follows."""
    attempt = Attempt(plan=COPY, alone=True, holds=1)
    step = step_after(attempt, Blocked("low on memory"))
    assert step.events == (Held(blocked("low on memory")),)
    assert step.action == WaitUnblocked(Step(Publish(COPY, alone=True), attempt))
    assert step.attempt == attempt


def test_a_confirmed_quarantine_copy_is_logged_with_its_reason() -> None:
    step = step_after(Attempt(plan=TO_QUARANTINE), Confirmed())
    assert step.action == Ack(Outcome.QUARANTINED)
    assert step.events == (Quarantined(TO_QUARANTINE.reason),)


def test_a_lost_connection_lets_go_with_the_error() -> None:
    step = step_after(Attempt(plan=COPY), Lost(gone=True, error="connection reset"))
    assert step.action == LetGo()
    assert step.events == (Left("connection reset"),)


# --- whole sequences -----------------------------------------------------------------------


def publish_bound(limits: HoldLimits) -> int:
    """The most publishes of one delivery while the broker keeps answering.

    The retry bound: ``nack_max_attempts`` held publishes of the copy (the last of them
    sends it to quarantine), and ``ceil(0.75 x consumer_timeout_s / SHORTEST_DELAY_S)``
    held publishes of the quarantine copy (each wait lasts the backoff's shortest delay at
    least, or reaches the deadline); plus two publishes: the one retry alone on a channel
    of its own that an ambiguous refusal earns, and the last publish of the quarantine copy
    (confirmed, refused, unwritable, or held past its deadline).
    """
    deadline_s = DEAD_LETTER_SHARE * limits.consumer_timeout_s
    return limits.nack_max_attempts + math.ceil(deadline_s / SHORTEST_DELAY_S) + 2


REFUSED_AGAIN: list[Answer] = [Refused(403, "ACCESS_REFUSED"), Refused(406, "PRECONDITION_FAILED")]
# Answers after which the broker is asked again (or the copy moves to quarantine).
HOLDING_ANSWERS: list[Answer] = [
    Returned(),
    Nacked(),
    *REFUSED_AGAIN,
    Refused(320, "CONNECTION_FORCED"),
    Refused(541, "INTERNAL_ERROR"),
    Lost(gone=False, error="channel 2 closed"),
    Unwritable("too big"),
    Blocked("low on memory"),
]
HOLDING: st.SearchStrategy[Answer] = st.sampled_from(HOLDING_ANSWERS)
# Every answer, the refusals a delivery must be seen alone for drawn more often: two of
# them in a row reach the deepest state, a refusal alone.
ANY_ANSWERS: list[Answer] = [
    Confirmed(),
    Returned(),
    Nacked(),
    *REFUSED_AGAIN * 3,
    Refused(541, "INTERNAL_ERROR"),
    Lost(gone=True, error="connection reset"),
    Lost(gone=False, error="channel 2 closed"),
    Unwritable("too big"),
    Failed(BOOM),
    Blocked("low on memory"),
]
ANY_ANSWER: st.SearchStrategy[Answer] = st.sampled_from(ANY_ANSWERS)
# What ``begin`` is given: a canonical delivery (its copy first) or a rejected one (its
# quarantine copy first).
ARRIVALS = st.sampled_from(
    [
        (delivery(), target()),
        (delivery({"x-acemq-tenant": "acme"}), target(publishers=Publishers.APPS)),
    ]
)
LIMITS_DRAWN = st.builds(
    HoldLimits,
    consumer_timeout_s=st.floats(1.0, 30.0),
    nack_max_attempts=st.integers(1, 12),
    nack_max_s=st.floats(0.5, 60.0),
)


@dataclass
class Walk:
    """One delivery's steps, carried out as the settler would, and what each answer was."""

    limits: HoldLimits
    held_s: float = 0.0
    publishes: int = 0
    # (the attempt that was published, its answer, the time held then, the step after)
    answered: list[tuple[Attempt, Answer, float, Step]] = field(default_factory=list)
    last: Step | None = None


def walk(
    data: st.DataObject,
    arrival: tuple[Delivery, Target],
    limits: HoldLimits,
    answers: st.SearchStrategy[Answer],
) -> Walk:
    """Walk from ``begin`` until the step says the delivery is done, or past the bound."""
    record = Walk(limits)
    arrived, where = arrival
    step = begin(arrived, where, now_ms=1_790_000_000_000, new_id=new_id)
    while record.publishes <= publish_bound(limits):  # past it, the bound test fails
        match step.action:
            case Publish(plan=plan, alone=alone):
                assert (plan, alone) == (step.attempt.plan, step.attempt.alone)
                answer = data.draw(answers)
                if not isinstance(answer, Blocked):
                    record.publishes += 1
                    record.held_s += data.draw(st.floats(0.0, 2.0))  # the confirm's wait
                then = step_after(step.attempt, answer, held_s=record.held_s, limits=limits)
                record.answered.append((step.attempt, answer, record.held_s, then))
                step = then
            case Wait(then=then) as wait:
                # The backoff's delay as the relay draws it, cut to the wait's bound.
                delay_s = wait_s(wait, lambda _n: data.draw(st.floats(SHORTEST_DELAY_S, 30.0)))
                assert delay_s >= 0
                record.held_s += delay_s
                step = then
            case WaitUnblocked(then=then):
                step = then
            case _:
                record.last = step
                return record
    return record


@given(data=st.data(), arrival=ARRIVALS, limits=LIMITS_DRAWN)
def test_nothing_is_acked_before_the_current_plan_is_confirmed(
    data: st.DataObject, arrival: tuple[Delivery, Target], limits: HoldLimits
) -> None:
    """An Ack comes only as the step after a Confirmed answer to the plan it counts."""
    record = walk(data, arrival, limits, ANY_ANSWER)
    for attempt, answer, _, then in record.answered:
        if isinstance(then.action, Ack):
            assert isinstance(answer, Confirmed)
            plan = attempt.plan
            expected = plan.outcome if isinstance(plan, Copy) else Outcome.QUARANTINED
            assert then.action.outcome is expected


@given(data=st.data(), arrival=ARRIVALS, limits=LIMITS_DRAWN)
def test_every_walk_ends_within_the_retry_bound_plus_two_publishes(
    data: st.DataObject, arrival: tuple[Delivery, Target], limits: HoldLimits
) -> None:
    """Whatever the broker keeps answering, see ``publish_bound``.

    The copy's own share of it holds too: at most ``nack_max_attempts`` publishes of it,
    and the one retry alone.
    """
    record = walk(data, arrival, limits, HOLDING)
    aim_for(record.publishes / publish_bound(limits), label="share of the bound used")
    assert record.last is not None
    assert isinstance(record.last.action, Ack | DeadLetter | GiveBack | LetGo)
    assert record.publishes <= publish_bound(limits)
    copies = [
        answer
        for attempt, answer, _, _ in record.answered
        if isinstance(attempt.plan, Copy) and not isinstance(answer, Blocked)
    ]
    aim_for(len(copies) / (limits.nack_max_attempts + 1), label="share of the copy's bound")
    assert len(copies) <= limits.nack_max_attempts + 1


@given(data=st.data(), arrival=ARRIVALS, limits=LIMITS_DRAWN)
def test_only_a_failed_quarantine_copy_is_dead_lettered(
    data: st.DataObject, arrival: tuple[Delivery, Target], limits: HoldLimits
) -> None:
    """Refused alone, unwritable, or held (returned, nacked, ...) past its deadline."""
    deadline_s = DEAD_LETTER_SHARE * limits.consumer_timeout_s - DEADLINE_SLACK_S
    record = walk(data, arrival, limits, ANY_ANSWER)
    for attempt, answer, held_s, then in record.answered:
        if not isinstance(then.action, DeadLetter):
            continue
        assert isinstance(attempt.plan, Quarantine)
        match answer:
            case Refused(code=code) if code in REPEATED_REFUSALS:
                assert attempt.alone
            case Unwritable():
                pass
            case Returned() | Nacked() | Refused() | Lost(gone=False):
                assert held_s >= deadline_s
            case _:
                pytest.fail(f"dead-lettered after {answer}")


def test_the_publish_bound_is_reached() -> None:
    """One alone retry, the copy's one allowed hold, the quarantine copy held to its deadline.

    consumer_timeout 1 s: the quarantine copy is dead-lettered at 0.75 s, three shortest
    waits, so the bound is 1 + 3 + 2 = 6 publishes, and this walk makes all six.
    """
    limits = HoldLimits(consumer_timeout_s=1.0, nack_max_attempts=1, nack_max_s=60.0)
    step = Step(Publish(COPY, alone=False), Attempt(plan=COPY))
    held_s, publishes = 0.0, 0
    answers: Iterator[Answer] = iter([Refused(403, "denied"), *[Nacked()] * 5])
    while isinstance(step.action, Publish | Wait):
        if isinstance(step.action, Wait):
            held_s += wait_s(step.action, lambda _n: SHORTEST_DELAY_S)
            step = step.action.then
            continue
        publishes += 1
        step = step_after(step.attempt, next(answers), held_s=held_s, limits=limits)
    assert isinstance(step.action, DeadLetter)
    assert publishes == publish_bound(limits) == 6


# --- a body passing through ----------------------------------------------------------------


def passing_delivery(spent: int | None = None) -> Delivery:
    """A delivery whose body was over max_body_bytes: it passes through, not held.

    ``spent``: the broker's x-delivery-count of a redelivery.
    """
    headers = dict(CANONICAL) if spent is None else {**CANONICAL, DELIVERY_COUNT: Int64(spent)}
    return Delivery(
        delivery_tag=8,
        exchange="",
        routing_key="order.placed",
        redelivered=spent is not None,
        properties=MappingProxyType({"message_id": "m-2"}),
        headers=MappingProxyType(headers),
        body=b"",
        unread_body=UnreadBody(size=300_000_000, limit=128 * 2**20),
    )


def test_a_body_over_the_limit_begins_with_its_quarantine_copy_alone() -> None:
    """Nothing may go between its frames on the channel: a channel of its own."""
    step = begin(passing_delivery(), target(), now_ms=0, new_id=new_id)
    assert isinstance(step.action, Publish)
    plan = step.action.plan
    assert isinstance(plan, Quarantine)
    assert plan.passing
    assert step.action.alone
    assert step.attempt == Attempt(plan=plan, alone=True)
    assert "300000000 bytes" in plan.reason
    assert "max_body_bytes of 134217728" in plan.reason


@given(data=st.data(), limits=LIMITS_DRAWN)
def test_a_body_passed_through_is_published_once_and_else_given_back_after_a_wait(
    data: st.DataObject, limits: HoldLimits
) -> None:
    """Its body is gone once published: a retry is a requeue (after the backoff's wait).

    Only a blocked connection, which published nothing, publishes it again.
    """
    record = walk(data, (passing_delivery(), target()), limits, ANY_ANSWER)
    assert record.publishes <= 1
    assert record.last is not None
    last = record.last.action
    assert isinstance(last, Ack | DeadLetter | GiveBack | LetGo | Requeue)
    attempt, answer, held_s, then = record.answered[-1]
    assert attempt.alone
    if isinstance(last, Ack):
        assert isinstance(answer, Confirmed)
        assert last.outcome is Outcome.QUARANTINED
    if isinstance(last, Requeue):
        assert isinstance(then.action, Wait)
        # At least the backoff's shortest delay, unless cut to the hold's deadline.
        drawn = wait_s(then.action, lambda _n: SHORTEST_DELAY_S)
        deadline_s = DEAD_LETTER_SHARE * limits.consumer_timeout_s
        assert drawn >= SHORTEST_DELAY_S or held_s + drawn == pytest.approx(deadline_s)
        assert isinstance(then.action.then.action, Requeue)


@pytest.mark.parametrize(
    "answer",
    [Returned(), Nacked(), Refused(541, "INTERNAL_ERROR"), Lost(gone=False, error="x")],
)
def test_a_held_body_passed_through_waits_then_goes_back_to_its_queue(answer: Answer) -> None:
    first = begin(passing_delivery(), target(), now_ms=0, new_id=new_id)
    then = step_after(first.attempt, answer)
    assert isinstance(then.action, Wait)
    assert isinstance(then.action.then.action, Requeue)
    assert any(isinstance(event, Held) for event in then.events)


@pytest.mark.parametrize(
    "answer",
    [Returned(), Nacked(), Refused(541, "INTERNAL_ERROR"), Lost(gone=False, error="x")],
)
def test_a_body_passed_through_one_return_from_its_limit_is_dead_lettered_not_requeued(
    answer: Answer,
) -> None:
    """A requeue would spend the last return its quorum queue allows, which drops it.

    Before 4.3 the requeue's ``basic.nack`` counts; with the backoff the 20 attempts are
    spent long before the hold's own dead-letter at 0.75 of the consumer timeout.
    """
    first = begin(passing_delivery(spent=19), target(), now_ms=0, new_id=new_id)
    assert isinstance(first.action, Publish)
    assert isinstance(first.action.plan, Quarantine)
    assert first.action.plan.passing
    then = step_after(first.attempt, answer)
    assert isinstance(then.action, DeadLetter), then.action
    assert "300000000 bytes" in then.action.reason
    assert "delivery limit: the broker has given this message back 19 times" in then.action.reason
    assert "cannot go back to its queue" in then.action.reason


@given(data=st.data(), limits=LIMITS_DRAWN, spent=st.integers(min_value=0, max_value=25))
def test_the_attempt_before_the_last_is_never_a_requeue(
    data: st.DataObject, limits: HoldLimits, spent: int
) -> None:
    """Whatever the broker answers, a delivery one return from its limit never requeues."""
    record = walk(data, (passing_delivery(spent=spent), target()), limits, ANY_ANSWER)
    assert record.last is not None
    actions = [record.last.action, *(then.action for *_, then in record.answered)]
    nested = [a.then.action for a in actions if isinstance(a, Wait)]
    if spent >= 19:  # of the default limit of 20
        assert not any(isinstance(a, Requeue) for a in (*actions, *nested))


def test_a_bug_on_the_quarantine_path_at_the_limit_dead_letters_rather_than_gives_back() -> None:
    """A give-back closes the channel, which spends the return the queue has left."""
    message = delivery({**CANONICAL, DELIVERY_COUNT: Int64(19)}, redelivered=True)
    first = begin(message, target(), now_ms=0, new_id=new_id)
    then = step_after(first.attempt, Failed(BOOM))
    assert isinstance(then.action, DeadLetter), then.action
    assert "internal error: RuntimeError('boom')" in then.action.reason
    assert "delivery limit: " in then.action.reason
    assert then.events == (Bug("a delivery could not be settled", BOOM),)
    below = begin(delivery(), target(), now_ms=0, new_id=new_id)
    quarantined = step_after(Attempt(plan=TO_QUARANTINE, alone=below.attempt.alone), Failed(BOOM))
    assert isinstance(quarantined.action, GiveBack)
