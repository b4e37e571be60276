"""A route's deliveries settled from the frame handler, and what goes on in a task instead.

Against the fake broker: the route's shared publish channel is open and the connection's
gate warm (a first copy went through a task and was confirmed), as on a route that is
relaying. What a test sees is public: the copies the broker got, the acks and closes of
the consumer channel, the route's state and its tasks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from sidecar.errors import ChannelClosedError, MissingEntityError
from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.routemap import RouteLimits
from sidecar.settle import BUG_REASON
from sidecar.wire import Delivery, PublishOutcome
from tests.fakes import FakeBroker, FakeChannel, FakeConnection
from tests.fakes.route import CANONICAL, QUARANTINE, orders_route, settle_one

if TYPE_CHECKING:
    from sidecar.relay.state import RouteState


def delivery(tag: int) -> Delivery:
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": f"m-{tag}"}),
        headers=MappingProxyType({**CANONICAL, "x-acemq-id": f"m-{tag}"}),
        body=b"body",
    )


@dataclass
class HeldAcks(FakeChannel):
    """A consumer channel whose acks a cancel holds back until ``opened`` is set."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)

    def try_ack(self, delivery_tag: int) -> bool | None:  # type: ignore[override]
        """Ack now, unless acks are held back (None: nothing done)."""
        return super().try_ack(delivery_tag) if self.opened.is_set() else None

    async def ack(self, delivery_tag: int) -> bool:
        """Ack once acks go again."""
        await self.opened.wait()
        return super().try_ack(delivery_tag)


class Route:
    """A settler of route orders with its consumer channel, connection and lane."""

    def __init__(self, broker: FakeBroker, *, limits: RouteLimits | None = None) -> None:
        orders = self.orders = orders_route(monotonic=time.monotonic, limits=limits)
        self.stop = asyncio.Event()
        self.state: RouteState = orders.state
        self.settler = Settler(orders.context, state=orders.state, log=orders.log, stop=self.stop)
        self.broker = broker
        self.consumer: FakeChannel = broker.consumer()
        self.connection: FakeConnection = broker.connection()

    async def start(self) -> None:
        """Open the shared channel and warm the gate with one confirmed copy."""
        lane = PublishLane(self.connection, stop=self.stop)
        await lane.open()
        self.settler.attach(self.connection, lane)
        await settle_one(self.settler, self.state, self.consumer, delivery(1))
        assert await self.settler.tasks.wait(10)  # the first went in a task, which has ended
        assert self.consumer.acked == [1]

    def offer(self, tag: int) -> None:
        """Hand the settler delivery ``tag``, as the consumer does from its frame handler."""
        self.settler.offer(self.consumer, delivery(tag))

    def sent_ids(self) -> list[str]:
        """The x-acemq-id of every copy published, in order."""
        return [headers["x-acemq-id"] for headers in self.broker.headers]

    async def settled(self) -> None:
        """Wait until nothing is in flight and no task is left."""
        async with asyncio.timeout(10):
            await self.state.idle.wait()
        assert await self.settler.tasks.wait(10)
        assert self.state.in_flight == 0


async def test_a_copy_is_published_and_acked_without_a_task() -> None:
    route = Route(FakeBroker())
    await route.start()
    route.offer(2)
    assert len(route.settler.tasks) == 0
    await route.settled()
    assert route.consumer.acked == [1, 2]
    assert route.broker.exchanges == ["orders", "orders"]


async def test_a_nacked_copy_goes_on_in_a_task_and_is_published_again() -> None:
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, PublishOutcome.NACKED])
    route = Route(broker)
    await route.start()
    route.offer(2)
    assert len(route.settler.tasks) == 0  # published from the handler; the nack comes later
    await route.settled()
    assert route.consumer.acked == [1, 2]
    assert broker.exchanges == ["orders", "orders", "orders"]  # the nacked one, again


RETURNS_SOON = RouteLimits(return_max_attempts=2, return_delay_s=0.01)


def return_retries(route: Route, result: str) -> float | None:
    """The route's acemq_sidecar_return_retries_total of ``result``."""
    labels = {"route": "orders", "result": result}
    return route.orders.registry.get_sample_value("acemq_sidecar_return_retries_total", labels)


async def test_a_copy_returned_each_time_goes_to_quarantine_then_is_acked() -> None:
    """Published again twice (the route's return_retry), returned each time: unroutable."""
    returned = [PublishOutcome.RETURNED] * 3
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, *returned])
    route = Route(broker, limits=RETURNS_SOON)
    await route.start()
    route.offer(2)
    await route.settled()
    assert broker.exchanges == ["orders", "orders", "orders", "orders", QUARANTINE]
    assert route.consumer.acked == [1, 2]
    reason = str(broker.headers[4]["x-acemq-error"])
    assert reason.startswith("unroutable: "), reason
    assert reason.endswith("; returned on each of 2 retries"), reason
    assert (return_retries(route, "sent"), return_retries(route, "routed")) == (2, 0)


async def test_a_returned_copy_taken_when_published_again_is_relayed() -> None:
    """A binding unseen for a moment (Khepri): the copy's next publish is routed."""
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, PublishOutcome.RETURNED])
    route = Route(broker, limits=RETURNS_SOON)
    await route.start()
    route.offer(2)
    await route.settled()
    assert broker.exchanges == ["orders", "orders", "orders"]
    assert route.consumer.acked == [1, 2]
    assert (return_retries(route, "sent"), return_retries(route, "routed")) == (1, 1)
    relayed = {"route": "orders", "outcome": "relayed"}
    messages = route.orders.registry.get_sample_value("acemq_sidecar_messages_total", relayed)
    assert messages == 2


async def test_a_returned_copy_with_no_retries_goes_to_quarantine_at_once() -> None:
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, PublishOutcome.RETURNED])
    route = Route(broker, limits=RouteLimits(return_max_attempts=0))
    await route.start()
    route.offer(2)
    await route.settled()
    assert broker.exchanges == ["orders", "orders", QUARANTINE]
    assert route.consumer.acked == [1, 2]
    assert str(broker.headers[2]["x-acemq-error"]).startswith("unroutable: ")
    assert return_retries(route, "sent") == 0


async def test_a_refused_copy_is_tried_alone_then_quarantined_with_the_brokers_words() -> None:
    refused = ChannelClosedError(406, "PRECONDITION_FAILED - message size too large")
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, refused, refused])
    route = Route(broker)
    await route.start()
    route.offer(2)
    await route.settled()
    # Shared: it may have been another publish's refusal; alone, it is this one's.
    assert broker.exchanges == ["orders", "orders", "orders", QUARANTINE]
    assert route.consumer.acked == [1, 2]
    assert "406 PRECONDITION_FAILED" in str(broker.headers[3]["x-acemq-error"])


async def test_a_missing_exchange_pauses_the_route_and_gives_the_delivery_back() -> None:
    missing = MissingEntityError(kind="exchange", name="orders")
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, missing])
    route = Route(broker)
    await route.start()
    route.offer(2)
    await route.settled()
    assert route.consumer.acked == [1]
    assert not route.consumer.is_open  # closed: the broker redelivers it
    assert 'exchange "orders" does not exist' in (route.state.pause_reason or "")


async def test_a_bug_in_a_settle_gives_the_delivery_back_and_says_so() -> None:
    class Broken(FakeChannel):
        def try_ack(self, delivery_tag: int) -> bool:
            """Fail on delivery 2, as a bug would."""
            if delivery_tag == 2:
                raise RuntimeError("a bug")
            return super().try_ack(delivery_tag)

    broker = FakeBroker()
    route = Route(broker)
    route.consumer = Broken(broker, 0)
    await route.start()
    route.offer(2)
    await route.settled()
    assert route.consumer.acked == [1]
    assert not route.consumer.is_open
    assert route.state.pause_reason == BUG_REASON


async def test_an_ack_held_back_by_a_cancel_is_sent_once_acks_go_again() -> None:
    broker = FakeBroker()
    route = Route(broker)
    consumer = route.consumer = HeldAcks(broker, 0)
    consumer.opened.set()
    await route.start()
    consumer.opened.clear()  # a cancel is on its way: acks wait for it
    route.offer(2)
    await asyncio.sleep(0.05)
    assert consumer.acked == [1]
    assert len(route.settler.tasks) == 1  # confirmed; its ack waits in a task
    consumer.opened.set()
    await route.settled()
    assert consumer.acked == [1, 2]
    assert broker.exchanges == ["orders", "orders"]  # published once


async def test_a_copy_does_not_overtake_one_still_in_a_task() -> None:
    """X waits in a task (the broker blocks); Y, after the unblock, goes to a task behind it.

    Published from the frame handler, Y would go out before X's task could run; in a task
    both go through the unblock line and the connection's gate, which keep them in turn.
    """
    route = Route(FakeBroker())
    await route.start()
    route.connection.block("low on memory")
    route.offer(2)
    assert len(route.settler.tasks) == 1  # blocked: it waits for the unblock
    await asyncio.sleep(0)
    route.connection.unblock()
    route.offer(3)
    assert len(route.settler.tasks) == 2, "a later copy went past one still waiting"
    await route.settled()
    assert route.sent_ids() == ["m-1", "m-2", "m-3"]
    route.offer(4)
    assert len(route.settler.tasks) == 0  # from the frame handler again
    await route.settled()


async def test_a_copy_does_not_overtake_one_a_paused_channel_sent_to_a_task() -> None:
    """X meets the shared channel paused by the broker's channel.flow and goes to a task.

    The flow resumes before X's task runs; Y, arriving then, could go out at once from the
    frame handler, ahead of X: it goes to a task behind X instead.
    """
    broker = FakeBroker()
    route = Route(broker)
    await route.start()
    shared = broker.channels[-1]  # the route's shared publish channel
    shared.is_flowing = False
    route.offer(2)
    shared.is_flowing = True
    route.offer(3)
    assert len(route.settler.tasks) == 2, "a later copy went past one still in a task"
    await route.settled()
    assert route.sent_ids() == ["m-1", "m-2", "m-3"]


async def test_a_confirm_slower_than_the_limit_holds_the_delivery_until_it_comes() -> None:
    broker = FakeBroker()
    route = Route(broker)
    await route.start()
    confirms = route.settler.confirms
    confirms.limit_s, confirms.sweep_s = 0.05, 0.01
    broker.confirm_after_s = 0.3
    route.offer(2)
    await asyncio.sleep(0.15)
    assert route.state.held == 1
    assert "no confirm" in (route.state.pause_reason or "")
    await route.settled()
    assert route.state.held == 0
    assert route.consumer.acked == [1, 2]
