"""A returned copy published again before it counts as unroutable (``settle.returns``).

The step is pure: it says when the route's budget is to be asked (``IfReturnBudget``), and
``decide`` here asks it as the relay does, so each test says what the budget answers and
counts how often it was asked.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.settle import Rules
from sidecar.settle.answers import Answer, Confirmed, Nacked, Returned
from sidecar.settle.events import Held, RetriedCopy, ReturnRetried, RoutedOnRetry
from sidecar.settle.holds import HoldLimits
from sidecar.settle.settlement import Copy, Outcome, Quarantine
from sidecar.settle.step import Ack, Attempt, IfReturnBudget, Publish, Step, Wait
from sidecar.settle.table import after

COPY = Copy(properties={}, headers={}, routing_key="k.1", outcome=Outcome.RELAYED)
LIMITS = HoldLimits(consumer_timeout_s=100.0, nack_max_attempts=3, nack_max_s=30.0)
UNROUTABLE = 'unroutable: exchange "orders" has no binding for routing key "k.1"'


class Budget:
    """The route's budget: says ``yes`` so many times, then no; counts the asks."""

    def __init__(self, yes: int = 1_000) -> None:
        self.yes = yes
        self.asked = 0

    def __call__(self) -> bool:
        """Answer one ask."""
        self.asked += 1
        if self.yes <= 0:
            return False
        self.yes -= 1
        return True


def rules(*, retried: int = 2, delay_s: float = 0.2) -> Rules:
    return Rules(
        limits=LIMITS,
        exchange="orders",
        quarantine_exchange="acemq.quarantine",
        route="orders",
        returns_retried=retried,
        return_delay_s=delay_s,
    )


def decide(step: Step, budget: Budget) -> Step:
    """Take the step the budget's answer leads to, as the relay does; any other step as is."""
    if isinstance(step.action, IfReturnBudget):
        return step.action.then if budget() else step.action.otherwise
    return step


def waited(step: Step) -> Step:
    """The step a ``Wait`` leads to."""
    assert isinstance(step.action, Wait), step.action
    return step.action.then


def test_a_returned_copy_waits_and_goes_out_again_as_it_was() -> None:
    step = decide(after(Attempt(COPY), Returned(), rules(), held_s=0.0), Budget())
    assert isinstance(step.action, Wait)
    assert step.action.at_most_s == 0.2
    assert step.events == (ReturnRetried(),)
    assert step.attempt == Attempt(COPY, returns=1)
    again = waited(step)
    assert again.action == Publish(COPY, alone=False)
    assert again.attempt == Attempt(COPY, returns=1)


def test_each_retry_waits_twice_as_long_and_the_last_return_quarantines() -> None:
    budget = Budget()
    first = decide(after(Attempt(COPY), Returned(), rules(), held_s=0.0), budget)
    second = decide(after(first.attempt, Returned(), rules(), held_s=0.2), budget)
    assert isinstance(second.action, Wait)
    assert second.action.at_most_s == 0.4
    assert second.attempt.returns == 2
    last = decide(after(second.attempt, Returned(), rules(), held_s=0.6), budget)
    assert isinstance(last.action, Publish)
    assert last.action.plan == Quarantine(f"{UNROUTABLE}; returned on each of 2 retries")
    assert last.events == ()
    assert budget.asked == 2  # not asked for a retry the count already refuses


def test_one_retry_says_once_more() -> None:
    budget = Budget()
    first = decide(after(Attempt(COPY), Returned(), rules(retried=1), held_s=0.0), budget)
    last = decide(after(first.attempt, Returned(), rules(retried=1), held_s=0.2), budget)
    assert isinstance(last.action, Publish)
    assert last.action.plan == Quarantine(f"{UNROUTABLE}; returned once more")


def test_with_the_budget_spent_a_return_quarantines_at_once() -> None:
    budget = Budget(yes=0)
    step = decide(after(Attempt(COPY), Returned(), rules(), held_s=0.0), budget)
    assert isinstance(step.action, Publish)
    assert step.action.plan == Quarantine(UNROUTABLE)
    assert budget.asked == 1


def test_no_retries_quarantines_at_once_without_asking_the_budget() -> None:
    budget = Budget()
    step = decide(after(Attempt(COPY), Returned(), rules(retried=0), held_s=0.0), budget)
    assert isinstance(step.action, Publish)
    assert step.action.plan == Quarantine(UNROUTABLE)
    assert budget.asked == 0


def test_a_retry_taken_is_relayed_and_says_so() -> None:
    step = decide(after(Attempt(COPY, returns=1), Confirmed(), rules(), held_s=0.2), Budget())
    assert step.action == Ack(Outcome.RELAYED)
    assert step.events == (RoutedOnRetry(),)


def test_a_copy_never_returned_is_relayed_without_a_word() -> None:
    step = decide(after(Attempt(COPY), Confirmed(), rules(), held_s=0.0), Budget())
    assert step.events == ()


def test_a_hold_keeps_the_returns_counted() -> None:
    step = decide(after(Attempt(COPY, returns=1), Nacked(), rules(), held_s=0.2), Budget())
    assert [type(event) for event in step.events] == [Held]
    again = waited(step)
    assert again.attempt == Attempt(COPY, holds=1, returns=1)
    assert again.events == (RetriedCopy(),)


@given(
    answers=st.lists(st.sampled_from([Returned(), Confirmed()]), min_size=1, max_size=8),
    retried=st.integers(0, 4),
    yes=st.integers(0, 6),
)
def test_a_copy_goes_out_at_most_retried_plus_one_times_and_ends_in_one_place(
    answers: list[Answer], retried: int, yes: int
) -> None:
    """Published at most 1 + ``retried`` times, the budget asked once a retry at most.

    However the broker answers, the delivery ends relayed or quarantined as unroutable.
    """
    budget = Budget(yes)
    step = decide(after(Attempt(COPY), answers[0], rules(retried=retried), held_s=0.0), budget)
    publishes = 1
    for answer in answers[1:]:
        if not isinstance(step.action, Wait):
            break
        step = waited(step)
        publishes += 1
        step = decide(after(step.attempt, answer, rules(retried=retried), held_s=0.0), budget)
    assert publishes <= 1 + retried
    assert publishes - 1 <= budget.asked <= publishes
    match step.action:
        case Ack(outcome=outcome):
            assert outcome is Outcome.RELAYED
        case Publish(plan=Quarantine(reason=reason)):
            assert reason.startswith(UNROUTABLE)
        case Wait():  # the answers ran out with a retry granted: one more publish allowed
            assert publishes + 1 <= 1 + retried
        case other:
            raise AssertionError(other)
