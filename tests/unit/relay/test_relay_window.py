"""The route's consumer window changed while it runs: RouteWorker on a fake broker (no socket).

The fake keeps what RabbitMQ keeps and the re-consume relies on: a per-consumer prefetch
taken at ``basic.consume`` from the channel's last ``basic.qos``, delivery tags per channel,
the deliveries of a cancelled consumer unacked on the channel until acked (a close
requeues them), and, as a quorum queue does, a delivery that was on its way when its
consumer was cancelled goes back to the queue (``returned``: a delivery attempt spent).
As the client does, a channel reads no delivery while those read and unsettled hold its
byte budget: the broker's later ones wait unread, in order, the cancel-ok behind them.
Its operations can be held half-way (``gates``), so a stop can land at every point of a
re-consume. The real broker's side of it is in tests/integration.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import deque
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import RelayChannel, RelayConnection
from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.relay.context import RouteContext
from sidecar.relay.worker import RouteWorker
from sidecar.routemap import Mode, Publishers, Route, RouteLimits
from sidecar.wire import PublishOutcome
from tests.fakes import FakeBroker, FakeChannel, FakeConnection

KIB = 1024
BOUND_S = 10.0


def worker(
    *,
    prefetch: int,
    budget_bytes: int = 64 * 2**20,
    single_active_consumer: bool = False,
    limits: RouteLimits | None = None,
) -> RouteWorker:
    """A worker for route orders with its own registry."""
    route = Route(
        name="orders",
        queue="staging.orders",
        exchange="orders",
        routing_key=None,
        publishers=Publishers.ACEMQ,
        origin=None,
        mode=Mode.ENFORCE,
        prefetch=prefetch,
        limits=limits or RouteLimits(max_in_flight_bytes=budget_bytes),
        single_active_consumer=single_active_consumer,
    )
    metrics = Metrics(CollectorRegistry(), version="test", contract="1.1")
    return RouteWorker(
        RouteContext(
            route=route,
            quarantine_exchange="acemq.quarantine",
            login="sidecar",
            metrics=metrics,
            clock=Clock.system(),
            new_id=lambda: "00000000-0000-4000-8000-000000000000",
            rng=random.Random(1),
        )
    )


async def until(check: Callable[[], bool]) -> None:
    """Wait until ``check`` holds, polling; fail after BOUND_S."""
    deadline = asyncio.get_running_loop().time() + BOUND_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not within {BOUND_S}s"
        await asyncio.sleep(0.001)


async def drain(route: RouteWorker, broker: FakeBroker, connection: FakeConnection) -> None:
    """Run the worker until every message is acked, then stop it (the SIGTERM path)."""
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    async with asyncio.timeout(BOUND_S):
        await broker.all_acked.wait()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running


def test_the_fakes_are_what_the_relay_types_against() -> None:
    """The fakes satisfy the client's Protocols, so the tests exercise the typed face."""
    broker = FakeBroker(deque())
    assert isinstance(FakeChannel(broker, 1), RelayChannel)
    assert isinstance(FakeConnection(broker), RelayConnection)


async def test_small_messages_grow_the_window_from_one_to_the_prefetch() -> None:
    """Slow start: 1, 64, 512; one consumer at a time, none requeued."""
    broker = FakeBroker(deque([KIB] * 2000), confirm_after_s=0.002)  # slower than the broker
    connection = FakeConnection(broker)
    await drain(worker(prefetch=512), broker, connection)
    qos = [n for op, n in broker.calls if op in ("open", "qos")]
    assert qos == [1, 64, 512]
    tags = [tag for op, tag in broker.calls if op == "consume"]
    assert tags[0] == "acemq-sidecar.orders"
    assert tags[1:] == [f"acemq-sidecar.orders#{n}" for n in range(2, 4)]
    assert broker.peak_consumers == 1
    assert broker.peak_in_flight <= 512
    assert broker.requeued == 0
    assert broker.returned == 0
    assert broker.live_consumers() == 0


async def test_a_single_active_consumer_route_consumes_once_at_its_whole_window() -> None:
    """No slow start and no re-consume: a cancel would pass the active role to another replica."""
    broker = FakeBroker(deque([KIB] * 300 + [64 * KIB] * 20), confirm_after_s=0.002)
    connection = FakeConnection(broker)
    await drain(
        worker(prefetch=64, budget_bytes=256 * KIB, single_active_consumer=True),
        broker,
        connection,
    )
    assert [n for op, n in broker.calls if op in ("open", "qos")] == [64]
    assert [tag for op, tag in broker.calls if op == "consume"] == ["acemq-sidecar.orders"]
    assert not [op for op, _ in broker.calls if op == "cancel"][:-1]  # only the drain's
    assert broker.requeued == 0
    assert broker.returned == 0


async def test_a_larger_body_shrinks_the_window_and_the_overshoot_is_the_old_window() -> None:
    """64 KiB after 1 KiB ones: at most the old window x 64 KiB, then within the budget."""
    budget = 256 * KIB  # four of 64 KiB
    broker = FakeBroker(deque([KIB] * 300 + [64 * KIB] * 200), confirm_after_s=0.002)
    connection = FakeConnection(broker)
    route = worker(prefetch=16, budget_bytes=budget)
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    await until(lambda: broker.acked >= 300 + 50)
    overshoot = broker.peak_bytes
    broker.peak_bytes = 0
    async with asyncio.timeout(BOUND_S):
        await broker.all_acked.wait()
    route.request_stop()
    await running
    assert overshoot <= 16 * 64 * KIB  # the old window of the new size (the client bounds it)
    assert broker.peak_bytes <= budget  # once the old window's deliveries were settled
    assert {b for channel in broker.consuming for b in channel.budgets} == {budget}
    qos = [n for op, n in broker.calls if op in ("open", "qos")]
    assert qos == [1, 16, 4]
    assert broker.peak_in_flight <= 16
    assert broker.peak_consumers == 1
    assert broker.requeued == 0
    assert broker.returned == 0


async def test_a_consumer_is_cancelled_only_with_nothing_on_its_way() -> None:
    """Deliveries reach a fast route 2 ms after they leave: none may meet a cancelled tag."""
    budget = 256 * KIB
    broker = FakeBroker(deque(([KIB] * 40 + [64 * KIB] * 10) * 6), transit_s=0.002)
    connection = FakeConnection(broker)
    await drain(worker(prefetch=16, budget_bytes=budget), broker, connection)
    assert broker.returned == 0
    assert broker.requeued == 0
    assert broker.peak_in_flight <= 16


async def test_a_shrink_re_consumes_when_the_budget_stops_reading_before_the_window_fills() -> None:
    """A fast route: 64 KiB bodies fill the old window of 16 past what the budget lets be read.

    The client reads no delivery past 256 KiB, so the old consumer never holds its window
    while acks wait; it is cancelled all the same once nothing more comes, and the
    cancel-ok, behind deliveries that wait unread, is read as acks make room.
    """
    budget = 256 * KIB
    broker = FakeBroker(deque([KIB] * 300 + [64 * KIB] * 200), transit_s=0.002)
    connection = FakeConnection(broker)
    await drain(worker(prefetch=16, budget_bytes=budget), broker, connection)
    assert [n for op, n in broker.calls if op in ("open", "qos")] == [1, 16, 4]
    assert broker.peak_read_bytes <= budget + 64 * KIB  # the budget and one message
    assert broker.peak_in_flight <= 16
    assert broker.peak_consumers == 1
    assert broker.returned == 0
    assert broker.requeued == 0


async def test_in_flight_never_exceeds_the_larger_window_during_a_change() -> None:
    """The last growth step waits for the old deliveries: never prefetch + half of it."""
    broker = FakeBroker(deque([KIB] * 600), confirm_after_s=0.002)
    connection = FakeConnection(broker)
    await drain(worker(prefetch=8), broker, connection)
    assert [n for op, n in broker.calls if op in ("open", "qos")] == [1, 8]
    assert broker.peak_in_flight <= 8
    assert broker.returned == 0


# Where a stop can land in a re-consume: (operation, its nth time on the consumer channel).
STEPS = [("cancel", 1), ("qos", 1), ("consume", 2)]


@pytest.mark.parametrize(("step", "nth"), STEPS)
async def test_a_stop_in_the_middle_of_a_re_consume_leaves_no_consumer(step: str, nth: int) -> None:
    """Wherever the stop lands, the drain cancels the consumer the broker has, then closes."""
    broker = FakeBroker(deque([KIB] * 50))
    connection = FakeConnection(broker)
    route = worker(prefetch=512)
    release = broker.hold(step, nth=nth)
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    async with asyncio.timeout(BOUND_S):
        await broker.reached.setdefault(step, asyncio.Event()).wait()
    route.request_stop()
    await asyncio.sleep(0.01)
    release.set()
    async with asyncio.timeout(BOUND_S):
        await running
    (channel,) = broker.consuming
    assert not channel.is_open
    # No consumer delivered during the drain: the last cancel was for the live one.
    assert channel.live_at_close == 0, channel.calls
    assert channel.calls[-1][0] == "cancel", channel.calls
    assert broker.peak_consumers == 1
    assert broker.live_consumers() == 0


GRACE_S = 10  # a stop that waited for the grace would take all of it


async def test_a_stop_while_acks_wait_for_the_window_to_fill_lets_them_go() -> None:
    """Seven messages, a shrink wanted at the last: the window cannot fill, the stop acks all."""
    broker = FakeBroker(deque([KIB] * 6 + [64 * KIB]), confirm_after_s=0.2)
    connection = FakeConnection(broker)
    route = worker(prefetch=512, budget_bytes=128 * KIB)  # two of 64 KiB: shrink from 8
    running = asyncio.create_task(route.run(connection, grace_s=GRACE_S), name="worker")
    await until(lambda: broker.delivered == 7)
    await asyncio.sleep(0.05)  # six held, more than half: acks wait for eight, never come
    started = asyncio.get_running_loop().time()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    assert broker.acked == 7
    assert broker.requeued == 0
    assert asyncio.get_running_loop().time() - started < GRACE_S  # not the grace period


async def test_a_cancel_the_broker_does_not_confirm_closes_the_channel_and_reopens() -> None:
    """Unknown whether the old consumer is gone: no second consume on that channel."""
    broker = FakeBroker(deque([KIB] * 50))
    broker.confirm_cancel = False
    connection = FakeConnection(broker)
    route = worker(prefetch=512)
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    await until(lambda: len(broker.consuming) >= 2)  # reopened, consuming again
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    first, second = broker.consuming[:2]
    assert not first.is_open
    tag = "acemq-sidecar.orders"
    assert first.calls == [("open", 1), ("consume", tag), ("cancel", tag)]
    assert second.calls[:2] == [("open", 1), ("consume", tag)]


async def test_the_brokers_cancel_during_a_re_consume_starts_no_new_consumer() -> None:
    """The queue went: the route's channel ends, as for any broker cancel."""
    broker = FakeBroker(deque([KIB] * 50))
    connection = FakeConnection(broker)
    route = worker(prefetch=512)
    release = broker.hold("cancel")
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    async with asyncio.timeout(BOUND_S):
        await broker.reached.setdefault("cancel", asyncio.Event()).wait()
    (first,) = broker.consuming
    first.cancelled_by_broker()
    release.set()
    await until(lambda: not first.is_open)  # closed by the route, reopened with backoff
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    tag = "acemq-sidecar.orders"
    assert first.calls == [("open", 1), ("consume", tag), ("cancel", tag)]
    assert broker.live_consumers() == 0


@pytest.mark.parametrize("apart", [False, True])
async def test_no_re_consume_while_the_broker_blocks_the_connection(*, apart: bool) -> None:
    """A blocked broker reads nothing, and acks nothing it blocks: the change waits.

    ``apart``: the route consumes on a connection of its own, which the broker never
    blocks; only the publishing one is.
    """
    broker = FakeBroker(deque([KIB] * 50))
    blocked = FakeConnection(broker, blocked_reason="low on memory")
    consuming = FakeConnection(broker) if apart else blocked
    route = worker(prefetch=512)
    running = asyncio.create_task(
        route.run(consuming, grace_s=2, publishing=blocked), name="worker"
    )
    await until(lambda: bool(broker.consuming) and bool(broker.consuming[0].unacked))
    await asyncio.sleep(0.3)
    tag = "acemq-sidecar.orders"
    assert broker.calls == [("open", 1), ("consume", tag)]
    blocked.unblock()
    async with asyncio.timeout(BOUND_S):
        await broker.all_acked.wait()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    assert ("qos", 64) in broker.calls


async def test_the_brokers_cancel_settles_what_the_channel_holds_before_closing_it() -> None:
    """After the broker's basic.cancel the copies in flight are confirmed and acked.

    Closing the channel at once would send them back to be redelivered (duplicates).
    """
    broker = FakeBroker(deque([KIB] * 8), confirm_after_s=0.2)
    connection = FakeConnection(broker)
    route = worker(prefetch=8)
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    await until(lambda: bool(broker.consuming) and broker.delivered >= 1)
    (first,) = broker.consuming
    held = len(first.unacked)
    assert held >= 1
    first.cancelled_by_broker()
    await until(lambda: route.pause_reason is not None)
    assert first.is_open  # paused (/readyz says why) while what it holds is settled
    await until(lambda: not first.is_open)
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    assert broker.requeued == 0
    assert broker.acked >= held


@pytest.mark.parametrize("stop", ["sigterm", "reload"])
async def test_a_drain_cancels_the_consumer_only_with_nothing_on_its_way(stop: str) -> None:
    """Mid-flow, a stop holds acks until the window is full: none meets the cancelled tag.

    A quorum queue spends a delivery attempt on each delivery that reaches a cancelled tag.
    """
    broker = FakeBroker(deque([KIB] * 3000), transit_s=0.005)
    connection = FakeConnection(broker)
    route = worker(prefetch=64)
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    await until(lambda: broker.acked >= 500 and sum(broker.consuming[-1].transit.values()) > 4)
    route.request_stop(replaced=stop == "reload")
    async with asyncio.timeout(BOUND_S):
        await running
    assert broker.returned == 0
    assert broker.requeued == 0
    assert broker.live_consumers() == 0


async def test_a_drain_while_the_budget_stops_the_reading_settles_what_waits_unread() -> None:
    """A fixed window of 16 and 64 KiB bodies: the client reads four at a time, the rest wait.

    The drain's cancel-ok is behind what waits unread: its acks go once the cancel is
    written, so all of it is read and settled within the grace period, none requeued.
    """
    broker = FakeBroker(deque([KIB] * 100 + [64 * KIB] * 200), confirm_after_s=0.002)
    connection = FakeConnection(broker)
    route = worker(prefetch=16, budget_bytes=256 * KIB, single_active_consumer=True)
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    await until(lambda: broker.acked >= 150 and bool(broker.consuming[0].unread))
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    (channel,) = broker.consuming
    assert channel.calls[-1] == ("cancel", "acemq-sidecar.orders")
    assert broker.acked == broker.delivered
    assert broker.requeued == 0
    assert broker.returned == 0
    assert broker.peak_read_bytes <= 256 * KIB + 64 * KIB


async def test_a_route_replaced_while_the_broker_blocks_closes_its_channel_uncancelled() -> None:
    """A reload during an alarm: the close is sent, for the broker to read later.

    Left to the connection's close, the old consumer would go on consuming with the old
    config (and the old target) once the broker unblocks, beside its successor. No cancel
    goes first: the close gives the held deliveries back as the consumer goes.
    """
    broker = FakeBroker(deque([KIB] * 50))
    connection = FakeConnection(broker, blocked_reason="low on memory")
    route = worker(prefetch=512)
    running = asyncio.create_task(route.run(connection, grace_s=5), name="worker")
    await until(lambda: bool(broker.consuming) and bool(broker.consuming[0].unacked))
    route.request_stop(replaced=True)
    async with asyncio.timeout(BOUND_S):
        await running
    (channel,) = broker.consuming
    assert [op for op, _ in channel.calls if op == "cancel"] == []
    assert not channel.is_open
    assert broker.acked == 0  # nothing was published while blocked: all went back
    assert broker.requeued >= 1
    assert broker.live_consumers() == 0


@pytest.mark.parametrize("stop", ["sigterm", "reload"])
async def test_a_stop_while_the_publishing_connection_is_blocked_cancels_no_consumer(
    stop: str,
) -> None:
    """RabbitMQ blocks the connection that publishes, never the one that only consumes.

    A single active consumer's cancel while its copies wait for the unblock would make
    another replica active, and the held deliveries would come back behind what it took.
    """
    broker = FakeBroker(deque([KIB] * 20))
    consuming = FakeConnection(broker)
    publishing = FakeConnection(broker, blocked_reason="low on memory")
    route = worker(prefetch=8, single_active_consumer=True)
    running = asyncio.create_task(
        route.run(consuming, grace_s=2, publishing=publishing), name="worker"
    )
    await until(lambda: bool(broker.consuming) and len(broker.consuming[0].unacked) == 8)
    await until(lambda: route.state.in_flight == 8)
    route.request_stop(replaced=stop == "reload")
    async with asyncio.timeout(BOUND_S):
        await running
    (channel,) = broker.consuming
    assert [op for op, _ in channel.calls if op == "cancel"] == []
    assert broker.acked == 0
    assert broker.published == []  # nothing was written while blocked
    # Closed, which gives them back (by a nack first, free on 4.3): not left to the
    # connection's close.
    assert not channel.is_open
    assert broker.requeued == 8


TIMED_OUT = (
    "channel closed by the broker: 406 PRECONDITION_FAILED - delivery acknowledgement on"
    " channel 1 timed out. Timeout value used: 5000 ms. This timeout value can be"
    " configured, see consumers doc guide to learn more"
)


async def test_a_reopened_channel_counts_the_bodies_its_closed_ones_deliveries_hold() -> None:
    """The broker takes a channel's deliveries back while their copies wait for confirms.

    Their bodies stay held until those confirms come; the reopened channel reads only
    what the budget leaves beside them, and reads on as they are released: the route's
    bodies in flight never pass the budget plus one message.
    """
    budget = 4 * KIB
    broker = FakeBroker(deque([KIB] * 12), confirm_after_s=1.0)
    connection = FakeConnection(broker)
    route = worker(prefetch=8, budget_bytes=budget, single_active_consumer=True)
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, route.state.body_bytes)
            await asyncio.sleep(0.001)

    sampling = asyncio.create_task(sample())
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    await until(lambda: route.state.body_bytes == budget)  # four read, their copies waiting
    broker.consuming[0].closed_by_broker(TIMED_OUT)
    await until(lambda: len(broker.consuming) == 2)
    async with asyncio.timeout(BOUND_S):
        await broker.all_acked.wait()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    sampling.cancel()
    assert peak <= budget + KIB, peak
    assert broker.peak_read_bytes <= budget + KIB


async def test_after_the_broker_took_a_delivery_back_the_route_holds_one_half_as_long() -> None:
    """Its consumer_timeout is shorter than the map's: the next hold goes to quarantine in time.

    Held as long again, the delivery would be taken back again, and a quorum queue with
    a delivery limit would drop it.
    """
    broker = FakeBroker(deque([KIB]), by_exchange={"orders": PublishOutcome.NACKED})
    connection = FakeConnection(broker)
    limits = RouteLimits(nack_max_attempts=1000, nack_max_s=3600)  # the timeout decides
    route = worker(prefetch=8, limits=limits)
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    await until(lambda: route.state.held == 1)
    await asyncio.sleep(1.5)  # held this long when the broker's timer takes it back
    broker.consuming[0].closed_by_broker(TIMED_OUT)
    await until(lambda: broker.acked == 1)
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    (quarantined,) = [
        h for e, h in zip(broker.exchanges, broker.headers, strict=True) if e == "acemq.quarantine"
    ]
    reason = str(quarantined["x-acemq-error"])
    assert "nacked" in reason, reason
    # The timeout it holds by: what it had held the first one (1.5 s and more), at most
    # the broker's 5 s; the copy went to quarantine at half of it.
    timeout = re.search(r"consumer_timeout of ([0-9.]+)s", reason)
    assert timeout is not None, reason
    assert 1.5 <= float(timeout.group(1)) <= 5.0, reason
