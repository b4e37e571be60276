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
import itertools
import random
import re
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import RelayChannel, RelayConnection, UndecodableTable
from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.relay.context import RouteContext
from sidecar.relay.worker import RouteWorker
from sidecar.routemap import Mode, Publishers, Route, RouteLimits
from sidecar.wire import Body, Delivery, Int32, Int64, PublishOutcome

KIB = 1024
Callback = Callable[[Delivery], Coroutine[Any, Any, None]]
BOUND_S = 10.0


@dataclass
class FakeConsumer:
    """One ``basic.consume`` on a fake channel."""

    prefetch: int
    callback: Callback
    on_body_size: Callable[[int], None] | None


@dataclass
class FakeBroker:
    """A staging queue of body sizes and every channel opened on the fake connection."""

    ready: deque[int]
    channels: list[FakeChannel] = field(default_factory=list)
    consuming: list[FakeChannel] = field(default_factory=list)  # those that consumed
    calls: list[tuple[str, object]] = field(default_factory=list)  # consumer channels only
    gates: dict[str, asyncio.Event] = field(default_factory=dict)  # op -> released
    reached: dict[str, asyncio.Event] = field(default_factory=dict)  # op -> it began
    seen: dict[str, int] = field(default_factory=dict)  # op -> times begun
    from_nth: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    requeued: int = 0
    returned: int = 0  # sent to a consumer cancelled before they arrived
    delivered: int = 0
    confirm_cancel: bool = True
    confirm_after_s: float = 0.0  # how long each publish waits for its confirm
    nacking: frozenset[str] = frozenset()  # exchanges whose every publish is nacked
    published: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    transit_s: float = 0.0005  # from the queue to the channel, give or take a half
    rng: random.Random = field(default_factory=lambda: random.Random(5))
    peak_in_flight: int = 0
    peak_bytes: int = 0
    peak_read_bytes: int = 0  # what the client held, read and unsettled
    peak_consumers: int = 0
    ids: itertools.count[int] = field(default_factory=itertools.count)
    all_acked: asyncio.Event = field(default_factory=asyncio.Event)
    total: int = 0

    def __post_init__(self) -> None:
        self.total = len(self.ready)

    async def gate(self, op: str) -> None:
        """Say that ``op`` began; wait while the test holds it (from its nth time on)."""
        self.seen[op] = seen = self.seen.get(op, 0) + 1
        if seen >= self.from_nth.get(op, 1):
            self.reached.setdefault(op, asyncio.Event()).set()
            if (gate := self.gates.get(op)) is not None:
                await gate.wait()
        await asyncio.sleep(0)

    def hold(self, op: str, *, nth: int = 1) -> asyncio.Event:
        """Hold ``op`` half-way, from its ``nth`` time on, until the event returned is set."""
        self.gates[op] = gate = asyncio.Event()
        self.from_nth[op] = nth
        return gate

    def live_consumers(self) -> int:
        """Consumers on open channels, as ``rabbitmqctl list_consumers`` would count them."""
        return sum(len(c.consumers) for c in self.channels if c.is_open)

    def dispatch(self) -> None:
        """Deliver to every consumer with room, as the broker does, then note the peaks."""
        for channel in self.channels:
            if channel.is_open:
                channel.dispatch()
        self.note_peaks()

    def note_peaks(self) -> None:
        """Keep the most deliveries, bytes and consumers seen at once."""
        in_flight = [size for c in self.channels if c.is_open for _, size in c.unacked.values()]
        self.peak_in_flight = max(self.peak_in_flight, len(in_flight))
        self.peak_bytes = max(self.peak_bytes, sum(in_flight))
        self.peak_consumers = max(self.peak_consumers, self.live_consumers())


@dataclass
class FakeChannel:
    """A confirm-mode channel: publishes are confirmed at once, consumers as the broker has."""

    broker: FakeBroker
    next_prefetch: int
    is_open: bool = True
    consumer_cancelled: bool = False
    consumers: dict[str, FakeConsumer] = field(default_factory=dict)
    unacked: dict[int, tuple[str, int]] = field(default_factory=dict)  # tag -> (consumer, size)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = "channel closed"
    tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    calls: list[tuple[str, object]] = field(default_factory=list)
    transit: dict[str, int] = field(default_factory=dict)  # consumer -> sent, not arrived
    live_at_close: int | None = None
    budgets: list[int | None] = field(default_factory=list)  # each consume's byte budget
    consuming: bool = False
    # Sent by the broker, in order, not read by the client (its budget is full).
    unread: deque[tuple[int, int, FakeConsumer]] = field(default_factory=deque)
    read_bytes: int = 0  # the bodies read and not yet settled

    def has_room(self) -> bool:
        """Whether the client reads the next delivery: what it read and holds is in budget."""
        budget = self.budgets[-1] if self.budgets else None
        return budget is None or self.read_bytes < budget

    def read(self) -> None:
        """The client reads what waits, in order, while it has room."""
        while self.unread and self.is_open and self.has_room():
            delivery_tag, size, consumer = self.unread.popleft()
            self.read_bytes += size
            self.broker.peak_read_bytes = max(self.broker.peak_read_bytes, self.read_bytes)
            if consumer.on_body_size is not None:
                consumer.on_body_size(size)
            message = next(self.broker.ids)
            task = asyncio.get_running_loop().create_task(
                consumer.callback(delivery(delivery_tag, message, size))
            )
            TASKS.add(task)
            task.add_done_callback(TASKS.discard)

    def record(self, op: str, arg: object) -> None:
        """Keep what the route asked of this channel, and of all the consumer channels."""
        self.calls.append((op, arg))
        self.broker.calls.append((op, arg))

    async def qos(self, prefetch_count: int) -> None:
        """Set the prefetch of later consumers."""
        self.record("qos", prefetch_count)
        await self.broker.gate("qos")
        self.next_prefetch = prefetch_count

    async def consume(
        self,
        queue: str,
        callback: Callback,
        *,
        consumer_tag: str,
        on_body_size: Callable[[int], None] | None = None,
        max_in_flight_bytes: int | None = None,
    ) -> None:
        """Start a consumer as the frame is sent; the test may hold back the consume-ok."""
        del queue
        self.budgets.append(max_in_flight_bytes)
        assert self.is_open
        assert consumer_tag not in self.consumers, f"tag {consumer_tag} reused on the channel"
        if not self.consuming:  # a consumer channel from now on: its open counts too
            self.consuming = True
            self.broker.consuming.append(self)
            self.broker.calls.append(self.calls[0])
        self.record("consume", consumer_tag)
        self.consumers[consumer_tag] = FakeConsumer(self.next_prefetch, callback, on_body_size)
        asyncio.get_running_loop().call_soon(self.broker.dispatch)
        await self.broker.gate("consume")

    async def cancel(self, consumer_tag: str, *, on_sent: Callable[[], None] | None = None) -> bool:
        """Cancel as the frame is sent; the cancel-ok comes after what waits unread.

        The test may hold back the cancel-ok.
        """
        if self.consumer_cancelled:
            return True
        self.record("cancel", consumer_tag)
        if on_sent is not None:
            on_sent()
        if not self.broker.confirm_cancel:
            await asyncio.sleep(0)
            return False
        self.consumers.pop(consumer_tag, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0  # the client's CLOSE_TIMEOUT_S
        while self.unread:
            if loop.time() > deadline or not self.is_open:
                return False
            await asyncio.sleep(0.001)
        await self.broker.gate("cancel")
        return True

    def dispatch(self) -> None:
        """Send to each consumer while it has credit: its prefetch less what it holds."""
        loop = asyncio.get_running_loop()
        for tag, consumer in self.consumers.items():
            while self.broker.ready and self.holds(tag) < consumer.prefetch:
                self.transit[tag] = self.transit.get(tag, 0) + 1
                size = self.broker.ready.popleft()
                transit_s = self.broker.transit_s * (0.5 + self.broker.rng.random())
                loop.call_later(transit_s, self.arrive, tag, size)

    def holds(self, tag: str) -> int:
        """What a consumer uses of its credit: deliveries on their way, and unacked."""
        unacked = sum(1 for owner, _ in self.unacked.values() if owner == tag)
        return unacked + self.transit.get(tag, 0)

    def arrive(self, tag: str, size: int) -> None:
        """A delivery reaches the channel ``transit_s`` after the queue sent it.

        For a tag cancelled meanwhile it goes back to the queue, as a quorum queue's
        channel returns it (a delivery attempt spent); on a closed channel, requeued.
        """
        self.transit[tag] -= 1
        consumer = self.consumers.get(tag)
        if consumer is None or not self.is_open:
            self.broker.ready.appendleft(size)
            if self.is_open:
                self.broker.returned += 1
            else:
                self.broker.requeued += 1
            return
        delivery_tag = next(self.tags)
        self.unacked[delivery_tag] = (tag, size)
        self.broker.delivered += 1
        self.broker.note_peaks()
        self.unread.append((delivery_tag, size, consumer))
        self.read()

    async def publish(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, Any],
        headers: Mapping[str, Any] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Confirm after a turn of the loop, or the broker's confirm delay; or nack."""
        del body, routing_key, properties, slow_after_s, on_slow, content_header
        table = {} if headers is None or isinstance(headers, UndecodableTable) else dict(headers)
        self.broker.published.append((exchange, table))
        await asyncio.sleep(self.broker.confirm_after_s)
        if exchange in self.broker.nacking:
            return PublishOutcome.NACKED
        return PublishOutcome.CONFIRMED

    async def ack(self, delivery_tag: int) -> bool:
        """Ack a delivery of any consumer of the channel, cancelled or not."""
        if not self.is_open:
            return False
        _, size = self.unacked.pop(delivery_tag)
        self.read_bytes -= size
        asyncio.get_running_loop().call_soon(self.read)
        self.broker.acked += 1
        if self.broker.acked == self.broker.total:
            self.broker.all_acked.set()
        asyncio.get_running_loop().call_soon(self.broker.dispatch)
        return True

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Unused here."""
        raise NotImplementedError

    async def wait_closed(self) -> str:
        """Return once closed, or once the broker cancelled the consumer."""
        await self.ended.wait()
        return self.reason

    def cancelled_by_broker(self) -> None:
        """The queue was deleted: every consumer of the channel is gone, the channel stays."""
        self.consumer_cancelled = True
        self.consumers.clear()
        self.reason = "the broker cancelled the consumer"
        self.ended.set()

    def closed_by_broker(self, reason: str) -> None:
        """The broker closes the channel (its channel.close): unacked deliveries go back."""
        self.reason = reason
        self.close_now()

    async def close(self) -> None:
        """Close: what is unacked goes back to the queue."""
        self.close_now()

    def close_now(self) -> None:
        """Close at once: what is unacked goes back to the queue."""
        if not self.is_open:
            return
        self.is_open = False
        self.live_at_close = len(self.consumers)
        self.broker.requeued += len(self.unacked)
        self.broker.ready.extendleft(size for _, size in reversed(self.unacked.values()))
        self.unacked.clear()
        self.unread.clear()
        self.read_bytes = 0
        self.consumers.clear()
        self.ended.set()
        asyncio.get_running_loop().call_soon(self.broker.dispatch)


TASKS: set[asyncio.Task[None]] = set()


@dataclass
class FakeConnection:
    """Every channel() is a new fake channel; the second of each route open consumes."""

    broker: FakeBroker
    is_open: bool = True
    blocked_reason: str | None = None
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_closed(self) -> BaseException | None:
        """Never, unless the test closes it."""
        await self.closed.wait()
        return None

    async def wait_unblocked(self) -> None:
        """Return once unblocked."""
        await self.unblocked.wait()

    async def check_queue(self, name: str) -> None:
        """Every queue exists."""

    async def check_exchange(self, name: str) -> None:
        """Every exchange exists."""

    async def channel(self, *, prefetch: int) -> FakeChannel:
        """A new channel with the prefetch its first consumer takes."""
        channel = FakeChannel(self.broker, prefetch)
        self.broker.channels.append(channel)
        channel.calls.append(("open", prefetch))
        return channel


CANONICAL: dict[str, Any] = {
    "x-acemq-type": "order.placed",
    "x-acemq-version": Int32(1),
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
}


def delivery(tag: int, message: int, size: int) -> Delivery:
    """A canonical delivery of ``size`` bytes."""
    headers = {**CANONICAL, "x-acemq-id": f"m-{message}", "x-acemq-correlation": f"m-{message}"}
    return Delivery(
        delivery_tag=tag,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": f"m-{message}"}),
        headers=MappingProxyType(headers),
        body=b"x" * size,
    )


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
    """Slow start: 1, 8, 64, 512; one consumer at a time, none requeued."""
    broker = FakeBroker(deque([KIB] * 2000), confirm_after_s=0.002)  # slower than the broker
    connection = FakeConnection(broker)
    await drain(worker(prefetch=512), broker, connection)
    qos = [n for op, n in broker.calls if op in ("open", "qos")]
    assert qos == [1, 8, 64, 512]
    tags = [tag for op, tag in broker.calls if op == "consume"]
    assert tags[0] == "acemq-sidecar.orders"
    assert tags[1:] == [f"acemq-sidecar.orders#{n}" for n in range(2, 5)]
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
    assert qos == [1, 8, 16, 4]
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
    assert [n for op, n in broker.calls if op in ("open", "qos")] == [1, 8, 16, 4]
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


async def test_a_stop_while_acks_wait_for_the_window_to_fill_lets_them_go() -> None:
    """Seven messages, a shrink wanted at the last: the window cannot fill, the stop acks all."""
    broker = FakeBroker(deque([KIB] * 6 + [64 * KIB]), confirm_after_s=0.2)
    connection = FakeConnection(broker)
    route = worker(prefetch=512, budget_bytes=128 * KIB)  # two of 64 KiB: shrink from 8
    running = asyncio.create_task(route.run(connection, grace_s=3), name="worker")
    await until(lambda: broker.delivered == 7)
    await asyncio.sleep(0.05)  # six held, more than half: acks wait for eight, never come
    started = asyncio.get_running_loop().time()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    assert broker.acked == 7
    assert broker.requeued == 0
    assert asyncio.get_running_loop().time() - started < 1  # not the grace period


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


async def test_no_re_consume_while_the_broker_blocks_the_connection() -> None:
    """A blocked broker reads nothing: the change waits for the unblock."""
    broker = FakeBroker(deque([KIB] * 50))
    connection = FakeConnection(broker, blocked_reason="low on memory")
    route = worker(prefetch=512)
    running = asyncio.create_task(route.run(connection, grace_s=2), name="worker")
    await until(lambda: bool(broker.consuming) and bool(broker.consuming[0].unacked))
    await asyncio.sleep(0.05)
    tag = "acemq-sidecar.orders"
    assert broker.calls == [("open", 1), ("consume", tag)]
    connection.blocked_reason = None
    connection.unblocked.set()
    async with asyncio.timeout(BOUND_S):
        await broker.all_acked.wait()
    route.request_stop()
    async with asyncio.timeout(BOUND_S):
        await running
    assert ("qos", 8) in broker.calls


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


async def test_a_route_replaced_while_the_broker_blocks_cancels_and_closes_its_channel() -> None:
    """A reload during an alarm: the cancel and close are sent, for the broker to read later.

    Left to the connection's close, the old consumer would go on consuming with the old
    config (and the old target) once the broker unblocks, beside its successor.
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
    tag = "acemq-sidecar.orders"
    assert ("cancel", tag) in channel.calls
    assert not channel.is_open
    assert channel.live_at_close == 0
    assert broker.acked == 0  # nothing was published while blocked: all went back
    assert broker.requeued >= 1
    assert broker.live_consumers() == 0


TIMED_OUT = (
    "channel closed by the broker: 406 PRECONDITION_FAILED - delivery acknowledgement on"
    " channel 1 timed out. Timeout value used: 5000 ms. This timeout value can be"
    " configured, see consumers doc guide to learn more"
)


async def test_after_the_broker_took_a_delivery_back_the_route_holds_one_half_as_long() -> None:
    """Its consumer_timeout is shorter than the map's: the next hold goes to quarantine in time.

    Held as long again, the delivery would be taken back again, and a quorum queue with
    a delivery limit would drop it.
    """
    broker = FakeBroker(deque([KIB]), nacking=frozenset({"orders"}))
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
    (quarantined,) = [h for exchange, h in broker.published if exchange == "acemq.quarantine"]
    reason = str(quarantined["x-acemq-error"])
    assert "nacked" in reason, reason
    # The timeout it holds by: what it had held the first one (1.5 s and more), at most
    # the broker's 5 s; the copy went to quarantine at half of it.
    timeout = re.search(r"consumer_timeout of ([0-9.]+)s", reason)
    assert timeout is not None, reason
    assert 1.5 <= float(timeout.group(1)) <= 5.0, reason
