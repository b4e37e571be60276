"""Publishing one plan and reading the answer, without a broker: the branches a loop hides.

The plan publisher and a delivery's reading of its result (``settle_task.publish_once``) are driven
directly with a scripted publish channel, so the cases the settle loop rarely reaches (a
shared channel lost under the publish, the last fallback of a quarantine copy, a reject on
a channel already gone) each get a test of their own; what the settle step makes of the
answer is checked beside it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import ChannelLostError
from sidecar.errors import WireError
from sidecar.relay.lane import PublishLane
from sidecar.relay.publisher import PlanPublisher
from sidecar.relay.settler import Settler
from sidecar.relay.settling import Settling
from sidecar.relay.state import HeldDelivery, RouteState
from sidecar.settle.answers import (
    Answer,
    Failed,
    Lost,
    Unwritable,
)
from sidecar.settle.events import Bug, Held, RetriedCopy
from sidecar.settle.holds import HoldLimits
from sidecar.settle.quarantine_format import reason_only
from sidecar.settle.rules import Rules
from sidecar.settle.settlement import DeadLetter, Plan, Quarantine
from sidecar.settle.step import Attempt, GiveBack, Publish, Step, Wait
from sidecar.settle.table import LOST_CHANNEL, after
from sidecar.wire import Delivery, PublishOutcome
from tests.fakes import Answer as Scripted
from tests.fakes import FakeBroker, FakeChannel, FakeConnection
from tests.fakes.route import QUARANTINE, orders_route


@dataclass
class Rig:
    """A plan publisher for route orders, its settler, lane, state and metrics."""

    publisher: PlanPublisher
    settler: Settler
    broker: FakeBroker
    connection: FakeConnection
    lane: PublishLane
    held: HeldDelivery
    state: RouteState
    registry: CollectorRegistry
    stop: asyncio.Event

    async def answer(self, plan: Plan, *, alone: bool = False) -> Answer:
        """Publish ``plan`` once for the delivery below; the delivery's reading of the result."""
        settling = self.settling(self.broker.consumer())
        publish = Publish(plan, alone=alone)
        settling.step = Step(publish, Attempt(plan=plan, alone=alone))
        answer, _ticket = await settling.publish_once(publish, None)
        return answer

    def settling(self, consumer: FakeChannel) -> Settling:
        """The delivery below being settled, consumed on ``consumer``."""
        assert self.settler.crew is not None
        return Settling(self.settler.crew, consumer, delivery(), self.held, started=0.0, trace=None)


LIMITS = HoldLimits(consumer_timeout_s=1800.0, nack_max_attempts=10, nack_max_s=300.0)


def step_after(plan: Plan, answer: Answer) -> Step:
    """What the settle step makes of ``answer`` to a first publish of ``plan``."""
    rules = Rules(
        limits=LIMITS,
        exchange="orders",
        quarantine_exchange=QUARANTINE,
        route="orders",
    )
    return after(Attempt(plan=plan), answer, rules, held_s=0.0)


def make_rig(answers: list[Scripted]) -> Rig:
    orders = orders_route()
    stop = asyncio.Event()
    broker = FakeBroker(answers=answers)
    connection = broker.connection()
    lane = PublishLane(connection, stop=stop)
    settler = Settler(orders.context, state=orders.state, log=orders.log, stop=stop)
    settler.attach(connection, lane)
    return Rig(
        publisher=settler.publisher,
        settler=settler,
        broker=broker,
        connection=connection,
        lane=lane,
        held=HeldDelivery(orders.state),
        state=orders.state,
        registry=orders.registry,
        stop=stop,
    )


def delivery() -> Delivery:
    return Delivery(
        delivery_tag=7,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": "m-1"}),
        headers=MappingProxyType({"x-acemq-tenant": "acme"}),
        body=b"body",
    )


async def test_a_shared_channel_lost_under_the_publish_is_a_hold_that_may_duplicate() -> None:
    """Another publish's refusal closed it: this copy may have been routed, or not."""
    rig = make_rig([ChannelLostError("channel 2 closed")])
    plan = Quarantine("a reason")
    answer = await rig.answer(plan)
    assert answer == Lost(gone=False, error="channel 2 closed")
    step = step_after(plan, answer)
    assert step.events == (Held(LOST_CHANNEL),)
    assert isinstance(step.action, Wait)
    assert step.action.then.action == Publish(plan, alone=False)
    assert step.action.then.events == (RetriedCopy(),)


@pytest.mark.parametrize("why", ["stopping", "connection lost"])
async def test_a_lost_channel_is_gone_when_stopping_or_disconnected(why: str) -> None:
    """Nothing left to publish on: the delivery is left to the broker, not held."""
    rig = make_rig([ChannelLostError("channel 2 closed")])
    if why == "stopping":
        rig.stop.set()
    else:
        rig.connection.is_open = False
    assert await rig.answer(Quarantine("a reason")) == Lost(gone=True, error="channel 2 closed")


async def test_a_quarantine_copy_too_big_even_for_the_reason_goes_with_a_short_one() -> None:
    """At the broker's smallest frame size the body still goes to quarantine, not nowhere."""
    too_big = WireError("the headers outgrow the frame")
    rig = make_rig([too_big, WireError("still too big"), PublishOutcome.CONFIRMED])
    published = await rig.publisher.publish(
        rig.lane, delivery(), Quarantine("x" * 10_000), alone=False, on_slow=lambda: None
    )
    assert published is PublishOutcome.CONFIRMED
    assert rig.broker.exchanges == [QUARANTINE] * 3
    assert rig.broker.headers[2] == reason_only("x" * 10_000, too_big, "staging.orders", short=True)
    assert len(str(rig.broker.headers[2])) < len(str(rig.broker.headers[1]))


async def test_a_quarantine_copy_that_cannot_be_written_at_all_is_dead_lettered() -> None:
    """Nowhere left to send it, and a redelivery would meet the same copy: reject it."""
    rig = make_rig([WireError("no"), WireError("no"), WireError("no")])
    plan = Quarantine("a reason")
    answer = await rig.answer(plan)
    assert answer == Unwritable("no")
    assert step_after(plan, answer).action == DeadLetter(
        "a reason; and the quarantine copy cannot be written: no"
    )


async def test_a_bug_on_the_quarantine_path_gives_the_delivery_back() -> None:
    """Not a copy that cannot be written: the route pauses, the broker redelivers it."""
    boom = RuntimeError("boom")
    rig = make_rig([boom])
    plan = Quarantine("a reason")
    answer = await rig.answer(plan)
    assert answer == Failed(boom)
    step = step_after(plan, answer)
    assert step.action == GiveBack("internal error; see the log")
    assert step.events == (Bug("a delivery could not be settled", boom),)


async def test_a_dead_letter_is_counted_and_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never silent: an operator sees why a message left through the dead-letter exchange."""
    rig = make_rig([])
    consumer = rig.broker.consumer()
    with caplog.at_level(logging.ERROR, logger="sidecar.relay"):
        await rig.settling(consumer).run(
            Step(DeadLetter("held too long"), Attempt(plan=Quarantine("x")))
        )
    assert consumer.rejected == [(7, False)]
    sample = {"route": "orders"}
    assert rig.registry.get_sample_value("acemq_sidecar_dead_lettered_total", sample) == 1
    assert "dead-letter exchange of queue staging.orders" in caplog.text
    assert "held too long" in caplog.text


async def test_a_dead_letter_on_a_channel_already_gone_is_neither_counted_nor_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker took the delivery back with its channel: it is redelivered, not dropped."""
    rig = make_rig([])
    consumer = rig.broker.consumer(is_open=False)
    with caplog.at_level(logging.ERROR, logger="sidecar.relay"):
        await rig.settling(consumer).run(
            Step(DeadLetter("held too long"), Attempt(plan=Quarantine("x")))
        )
    sample = {"route": "orders"}
    assert rig.registry.get_sample_value("acemq_sidecar_dead_lettered_total", sample) == 0
    assert caplog.text == ""
