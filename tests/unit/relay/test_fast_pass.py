"""The fast pass against the fake broker: what it settles without a task, and what it hands on.

The route's shared publish channel is open and the connection's gate warm (a first copy
went through the task path and was confirmed), as on a route that is relaying.
"""

from __future__ import annotations

import asyncio
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.wire import Delivery, PublishOutcome
from tests.fakes import FakeBroker, FakeChannel, FakeConnection
from tests.fakes.route import CANONICAL, orders_route, settle_one

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


class Route:
    """A settler of route orders with its consumer channel, connection and lane."""

    def __init__(self, broker: FakeBroker) -> None:
        orders = orders_route(monotonic=time.monotonic)
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
        assert self.consumer.acked == [1]

    def sent_ids(self) -> list[str]:
        """The x-acemq-id of every copy published, in order."""
        return [headers["x-acemq-id"] for headers in self.broker.headers]

    async def settled(self) -> None:
        """Wait until nothing is in flight."""
        async with asyncio.timeout(10):
            await self.state.idle.wait()
        assert self.state.in_flight == 0


async def test_a_copy_is_published_and_acked_without_a_task() -> None:
    route = Route(FakeBroker())
    await route.start()
    assert route.settler.offer(route.consumer, delivery(2)) is None
    await route.settled()
    assert route.consumer.acked == [1, 2]
    assert route.broker.exchanges == ["orders", "orders"]


async def test_a_nacked_copy_goes_on_as_a_task_and_is_published_again() -> None:
    broker = FakeBroker(answers=[PublishOutcome.CONFIRMED, PublishOutcome.NACKED])
    route = Route(broker)
    await route.start()
    assert route.settler.offer(route.consumer, delivery(2)) is None
    await route.settled()
    assert route.consumer.acked == [1, 2]
    assert broker.exchanges == ["orders", "orders", "orders"]  # the nacked one, again


async def test_a_copy_does_not_overtake_one_still_on_the_task_path() -> None:
    """X waits on the task path (the broker blocks); Y, after the unblock, joins it there.

    Published from the frame handler, Y would go out before X's task could run; on the
    task path both go through the connection's gate, which keeps them in turn.
    """
    route = Route(FakeBroker())
    await route.start()
    route.connection.block("low on memory")
    first: Any = route.settler.offer(route.consumer, delivery(2))
    assert first is not None  # blocked: the task path waits for the unblock
    task = asyncio.create_task(first)
    await asyncio.sleep(0)
    route.connection.unblock()
    second: Any = route.settler.offer(route.consumer, delivery(3))
    assert second is not None, "a later copy took the fast pass past one still waiting"
    await asyncio.gather(task, second)
    await route.settled()
    assert sorted(route.sent_ids()) == ["m-1", "m-2", "m-3"]
    assert route.settler.offer(route.consumer, delivery(4)) is None  # the fast pass again
    await route.settled()


async def test_a_confirm_slower_than_the_limit_holds_the_delivery_until_it_comes() -> None:
    broker = FakeBroker()
    route = Route(broker)
    await route.start()
    fast = route.settler._fast
    fast.limit_s, fast._sweep_s = 0.05, 0.01
    broker.confirm_after_s = 0.3
    assert route.settler.offer(route.consumer, delivery(2)) is None
    await asyncio.sleep(0.15)
    assert route.state.held == 1
    assert "no confirm" in (route.state.pause_reason or "")
    await route.settled()
    assert route.state.held == 0
    assert route.consumer.acked == [1, 2]
