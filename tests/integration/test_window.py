"""A route's window changed while it runs, on the real broker: classic and quorum staging.

The re-consume relies on what RabbitMQ does, so it is checked there: a per-consumer
``basic.qos`` does not reach a running consumer; a consumer cancelled with deliveries
unacked leaves them on the channel, acked by delivery tag after a new consumer started;
none is requeued (a quorum staging queue with ``x-delivery-limit`` 0 dead-letters any
requeue at once, a classic one would show it in its depth); a cancel for a tag the
channel does not have is answered. Then the route itself: slow start to the prefetch,
and a window that shrinks mid-flow, its bodies in flight counted byte by byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from sidecar.amqp import Channel, Connection, Delivery, connect
from sidecar.broker import BrokerAddress
from sidecar.dialer import OPTIONS
from sidecar.relay import settler
from sidecar.relay.settling import Settling
from sidecar.relay.sink import RouteSink
from sidecar.relay.state import HeldDelivery
from tests.compiled import is_compiled
from tests.integration.conftest import route_map_yaml, wait_for
from tests.integration.test_relay import envelope, headers_of
from tests.support import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KIB = 1024
QUEUE_TYPES = ["classic", "quorum"]


@dataclass(frozen=True, slots=True)
class Staging:
    """A staging queue whose every requeue would be seen: in its depth, or dead-lettered."""

    queue: str
    dead_letters: str


async def staging_queue(broker: Broker, queue_type: str, suffix: str) -> Staging:
    """Declare it; a quorum one dead-letters a message at its first requeue (limit 0)."""
    dead_letters = await broker.queue(f"dl.{suffix}")
    arguments: dict[str, Any] = {
        "x-queue-type": queue_type,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead_letters,
    }
    if queue_type == "quorum":
        arguments["x-delivery-limit"] = 0
    return Staging(await broker.queue(f"staging.{suffix}", **arguments), dead_letters)


async def quiet(got: asyncio.Queue[Delivery], seconds: float) -> None:
    """Fail if a delivery arrives within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            extra = await got.get()
            pytest.fail(f"an unexpected delivery: {extra.properties}")


async def take(got: asyncio.Queue[Delivery], count: int) -> list[Delivery]:
    """The next ``count`` deliveries, within a bound."""
    async with asyncio.timeout(15):
        return [await got.get() for _ in range(count)]


async def wait_until_consumers(connection: Connection, queue: str, count: int) -> None:
    """Wait (bounded) until the broker counts ``count`` consumers on the queue."""
    for _ in range(1000):
        if (await connection.declare_passive(queue)).consumers == count:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not {count} consumers on {queue} within 10 s")


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_re_consume_leaves_the_old_consumers_deliveries_to_be_acked(
    broker: Broker, queue_type: str
) -> None:
    """qos, cancel, consume on one channel: the first four are acked, not requeued."""
    staging = await staging_queue(broker, queue_type, queue_type)
    for i in range(12):
        await broker.publish(staging.queue, message_id=f"m-{i}")
    connection = await connect(  # as the relay's (the dialer's options)
        BrokerAddress.parse(broker.url), heartbeat_s=30, connect_timeout_s=10, options=OPTIONS
    )
    try:
        channel = await connection.channel(prefetch=4)
        got: asyncio.Queue[Delivery] = asyncio.Queue()
        sizes: list[int] = []

        collect = Collecting(got, sizes)
        await channel.consume(staging.queue, collect, consumer_tag="w.1")
        first = await take(got, 4)
        await quiet(got, 0.3)  # its window is full
        await channel.qos(8)
        await quiet(got, 0.3)  # a per-consumer qos does not reach a running consumer
        assert await channel.cancel("w.1")
        await channel.consume(staging.queue, collect, consumer_tag="w.2")
        second = await take(got, 8)
        counts = await connection.declare_passive(staging.queue)
        # A quorum queue keeps the cancelled consumer, delivering nothing to it, until
        # what it holds is settled.
        assert (counts.messages, counts.consumers) == (0, 2 if queue_type == "quorum" else 1)
        deliveries = first + second
        assert [d.delivery_tag for d in deliveries] == list(range(1, 13))
        assert len({d.properties["message_id"] for d in deliveries}) == 12
        assert not any(d.redelivered for d in deliveries)
        assert sizes == [2] * 12  # each b"{}" body told before it arrived
        for delivery in reversed(deliveries):  # the old consumer's last
            assert await channel.ack(delivery.delivery_tag)
        await wait_until_consumers(connection, staging.queue, 1)
        assert await channel.cancel("w.2")
        assert await channel.cancel("never-started")  # answered: nothing to cancel
        assert channel.is_open
        await channel.close()
    finally:
        await connection.close()
    assert await broker.depth(staging.queue) == 0
    assert await broker.depth(staging.dead_letters) == 0


@dataclass
class InFlight:
    """The bodies a route holds, counted as the settler takes and finishes deliveries."""

    count: int = 0
    bytes: int = 0
    peak_count: int = 0
    peak_bytes: int = 0
    redelivered: int = 0
    settled_large: int = 0
    tail_from: int | None = None  # after this many large ones settled, a peak of its own
    tail_peak_bytes: int = 0


@dataclass
class Collecting:
    """A consumer that queues each delivery and notes each body size."""

    got: asyncio.Queue[Delivery]
    sizes: list[int]

    def deliver(self, delivery: Delivery) -> None:
        """Queue it."""
        self.got.put_nowait(delivery)

    def body_size(self, size: int) -> None:
        """Note it."""
        self.sizes.append(size)


@contextlib.contextmanager
def counting_in_flight(
    monkeypatch: pytest.MonkeyPatch, *, large_bytes: int, slow_s: float = 0.0
) -> Any:
    """Count every delivery in flight (from the route's sink's begin to its finished).

    ``slow_s`` holds each delivery that long before its publish (counted in flight by the
    route as by this): a route slower than its broker, whose window fills (the case where
    the window is what bounds it).
    """
    seen = InFlight()
    begin, finished, carry_out = RouteSink.begin, RouteSink.finished, Settling._carry_out

    async def slowed(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(slow_s)
        return await carry_out(*args, **kwargs)

    def counted(self: RouteSink, delivery: Delivery) -> HeldDelivery:
        size = len(delivery.body)
        seen.count += 1
        seen.bytes += size
        seen.redelivered += delivery.redelivered
        seen.peak_count = max(seen.peak_count, seen.count)
        seen.peak_bytes = max(seen.peak_bytes, seen.bytes)
        if seen.tail_from is not None and seen.settled_large >= seen.tail_from:
            seen.tail_peak_bytes = max(seen.tail_peak_bytes, seen.bytes)
        return begin(self, delivery)

    def uncounted(self: RouteSink, held: HeldDelivery) -> None:
        assert held.delivery is not None
        size = len(held.delivery.body)
        seen.count -= 1
        seen.bytes -= size
        seen.settled_large += size >= large_bytes
        finished(self, held)

    monkeypatch.setattr(RouteSink, "begin", counted)
    monkeypatch.setattr(RouteSink, "finished", uncounted)
    if slow_s:  # every delivery through a settle task, which waits before publishing
        monkeypatch.setattr(Settling, "publish_now", lambda *_args, **_kwargs: False)
        monkeypatch.setattr(Settling, "_carry_out", slowed)
    yield seen


def most_consumers(queue_type: str) -> int:
    """The most consumers the broker may count for one route during a re-consume.

    One on a classic queue; on a quorum queue the cancelled one too, until what it
    delivered is settled (a few milliseconds; it receives nothing meanwhile).
    """
    return 2 if queue_type == "quorum" else 1


def recording_windows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each window a re-consume asks for (Channel.qos above 1: not a channel's first)."""
    windows: list[int] = []
    qos = Channel.qos

    async def recording(self: Channel, prefetch_count: int) -> None:
        if prefetch_count > 1:  # the first consumer's 1, and the publish channels', pass
            windows.append(prefetch_count)
        await qos(self, prefetch_count)

    monkeypatch.setattr(Channel, "qos", recording)
    return windows


@contextlib.asynccontextmanager
async def sampling_consumers(broker: Broker, queue: str) -> AsyncIterator[list[int]]:
    """Sample the broker's count of the queue's consumers every few milliseconds."""
    counts: list[int] = []

    async def sample() -> None:
        channel = await broker.connection.channel()
        try:
            while True:
                ok = await channel.queue_declare(queue, passive=True)
                counts.append(int(ok.consumer_count or 0))
                await asyncio.sleep(0.005)
        finally:
            await channel.close()

    task = asyncio.create_task(sample(), name="consumer-sampler")
    try:
        yield counts
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(frozen=True, slots=True)
class RouteTopology:
    """Staging, a target exchange bound to a queue, and a quarantine exchange."""

    staging: Staging
    exchange: str
    target: str
    quarantine: str


async def route_topology(broker: Broker, queue_type: str, suffix: str) -> RouteTopology:
    """Declare a route's topology with a staging queue of ``queue_type``."""
    staging = await staging_queue(broker, queue_type, suffix)
    exchange = await broker.exchange(f"target.{suffix}")
    target = await broker.queue(f"out.{suffix}")
    await broker.bind(target, exchange)
    quarantine = await broker.exchange(f"quarantine.{suffix}", "fanout")
    return RouteTopology(staging, exchange, target, quarantine)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_small_messages_grow_the_window_from_one_to_the_prefetch(
    broker: Broker,
    run_sidecar: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    queue_type: str,
) -> None:
    """Slow start on the real broker: qos 8, 64, 512, one consumer, none requeued."""
    windows = recording_windows(monkeypatch)
    suffix = f"grow.{queue_type}"
    topo = await route_topology(broker, queue_type, suffix)
    staging, target = topo.staging, topo.target
    ids = [f"g-{i}" for i in range(1500)]
    for id_ in ids:
        await broker.publish(staging.queue, headers=envelope(id_), message_id=id_)
    text = route_map_yaml(
        broker.url,
        topo.quarantine,
        [{"name": "grow", "from": staging.queue, "exchange": topo.exchange}],
        prefetch=512,
    )
    with counting_in_flight(monkeypatch, large_bytes=2**62, slow_s=0.002) as seen:
        async with sampling_consumers(broker, staging.queue) as consumers, run_sidecar(text):
            relayed = await broker.take(target, len(ids), timeout_s=90)
    assert windows == [64, 512]
    assert sorted(headers_of(m)["x-acemq-id"] for m in relayed) == sorted(ids)
    assert 1 <= max(consumers) <= most_consumers(queue_type), consumers
    assert seen.peak_count <= 512
    assert seen.redelivered == 0
    assert await broker.depth(staging.queue) == 0
    assert await broker.depth(staging.dead_letters) == 0


@pytest.mark.skipif(
    is_compiled(settler),
    reason="replaces methods, which compiled classes do not let be replaced; plain runs it",
)
@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_larger_body_mid_flow_shrinks_the_window_and_bounds_the_overshoot(
    broker: Broker,
    run_sidecar: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    queue_type: str,
) -> None:
    """1 KiB then 64 KiB bodies, prefetch 16, budget 256 KiB: old window x 64 KiB, then 256 KiB.

    The broker sent up to the old window (16) before the first 64 KiB header said how big
    they are; those are settled, and from then on four of 64 KiB are in flight at most.
    """
    large, budget, prefetch = 64 * KIB, 256 * KIB, 16
    windows = recording_windows(monkeypatch)
    suffix = f"shrink.{queue_type}"
    topo = await route_topology(broker, queue_type, suffix)
    staging, target = topo.staging, topo.target
    ids = [f"s-{i}" for i in range(400)] + [f"l-{i}" for i in range(80)]
    for id_ in ids:
        body = b"x" * (large if id_.startswith("l-") else KIB)
        await broker.publish(staging.queue, headers=envelope(id_), message_id=id_, body=body)
    text = route_map_yaml(
        broker.url,
        topo.quarantine,
        [{"name": "shrink", "from": staging.queue, "exchange": topo.exchange}],
        prefetch=prefetch,
        max_in_flight_bytes=budget,
    )
    with counting_in_flight(monkeypatch, large_bytes=large, slow_s=0.005) as seen:
        seen.tail_from = 2 * prefetch  # by then the old window's deliveries were settled
        async with sampling_consumers(broker, staging.queue) as consumers, run_sidecar(text):
            relayed = await broker.take(target, len(ids), timeout_s=90)
            await wait_for(lambda: seen.count == 0, what="all settled")
    print(  # noqa: T201
        f"\nwindow shrink ({queue_type}): peak {seen.peak_bytes} bytes in flight"
        f" (bound {prefetch * large}), {seen.tail_peak_bytes} after the first"
        f" {2 * prefetch} large ones (budget {budget})"
    )
    assert sorted(headers_of(m)["x-acemq-id"] for m in relayed) == sorted(ids)
    assert windows == [16, 4]  # grown on the small ones, shrunk at the first large one
    assert seen.peak_bytes <= prefetch * large  # the old window x the new size
    assert 0 < seen.tail_peak_bytes <= budget
    assert seen.peak_count <= prefetch
    assert max(consumers) <= most_consumers(queue_type), consumers
    assert seen.redelivered == 0
    assert await broker.depth(staging.dead_letters) == 0
