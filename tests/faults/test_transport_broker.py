"""The transport audit's client conditions against real RabbitMQ nodes of their own.

Each node is private (``tests/faults/private_node.py``), with the config the condition
needs: ``frame_max = 1048576`` (a 300 KB header table, published by a client that took
that frame size, costs the sidecar's connection nothing on a redelivery; and the memory
alarm, set and cleared with ``rabbitmqctl``), and ``auth_mechanisms.1 = AMQPLAIN`` (the
client logs in with AMQPLAIN; a client that sends PLAIN regardless gets a reset), and
``frame_max = 33554432`` (a 20 MiB header table, over the 16 MiB the client reads of one,
is passed over without a close, not met with 501 on every redelivery).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from sidecar.amqp import ClientOptions, ConnectFailedError, PublishOutcome, connect
from sidecar.broker import BrokerAddress
from tests.brokers import module_node
from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_ids,
)
from tests.faults.private_node import PrivateNode
from tests.support import Broker, open_broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from tests.faults.conftest import FaultRecord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HUGE_FRAME_MAX = 32 * 1024 * 1024
HUGE_HEADER_BYTES = 20 * 1024 * 1024
BROKER_FRAME_MAX = 1_048_576
BIG_HEADER_BYTES = 300_000
PER_ROUTE = 2_000
RELAY_TIMEOUT_S = 120.0
HEARTBEAT_S = 1
BLOCKED_FOR_S = 3.5  # more than two heartbeat intervals: either side would have given up
ERROR_HEADER = "x-acemq-error"

BARE = ClientOptions()  # the client alone: the transport is under test, not the relay


@pytest.fixture(scope="module")
def frames_node(broker_version: str) -> Iterator[PrivateNode]:
    """A node of the version whose frame size is 1 MiB, eight times RabbitMQ's default."""
    conf = f"frame_max = {BROKER_FRAME_MAX}\n"
    with module_node(broker_version, "frames", conf=conf) as started:
        yield started


@pytest.fixture(scope="module")
def huge_frames_node(broker_version: str) -> Iterator[PrivateNode]:
    """A node of the version whose frame size (32 MiB) is over the sidecar's 16 MiB header."""
    conf = f"frame_max = {HUGE_FRAME_MAX}\n"
    with module_node(broker_version, "hugeframes", conf=conf) as started:
        yield started


@pytest.fixture
async def node_broker(frames_node: PrivateNode) -> AsyncIterator[Broker]:
    """A test client (aiormq, which takes the broker's frame size) on the 1 MiB node."""
    async with open_broker(frames_node.url) as client:
        yield client


@pytest.fixture
async def node_sidecar(frames_node: PrivateNode, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar process on the 1 MiB node, killed at teardown whatever happened."""
    process = Sidecar(amqp_url=frames_node.url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


async def take_all(
    broker: Broker, queue: str, want: int, *, context: Callable[[], str]
) -> list[str]:
    """Take ids from a queue until ``want`` came (repeats counted); return them all."""
    taken: list[str] = []

    async def enough() -> bool:
        taken.extend(await take_ids(broker, queue))
        return len(taken) >= want

    await eventually(enough, timeout_s=RELAY_TIMEOUT_S, what=f"{want} on {queue}", context=context)
    return taken


@pytest.mark.parametrize(
    ("query", "big_goes_to"),
    [
        ("", "target"),  # the sidecar takes the broker's 1 MiB: it relays the message
        ("?frame_max=131072", "quarantine"),  # a client that reads less: quarantined
    ],
)
async def test_a_300_kb_header_table_costs_no_reconnect_and_no_other_route(
    node_broker: Broker,
    node_sidecar: Sidecar,
    record: Callable[..., FaultRecord],
    query: str,
    big_goes_to: str,
) -> None:
    """One large header on a 1 MiB broker: relayed or quarantined once, never a loop.

    A redelivery costs no reconnect and the other route relays all of its own (a client that
    dropped the connection on every redelivery reconnected 4 times in 10 s, the other route
    relayed 0 of 5, the message was never quarantined).
    """
    broker = node_broker
    quarantine, quarantined = await declare_quarantine(broker)
    big_route, other_route = (
        await declare_flow(broker, "big"),
        await declare_flow(broker, "other"),
    )
    big_ids, other_ids = make_ids("big", PER_ROUTE), make_ids("other", PER_ROUTE)
    half = PER_ROUTE // 2
    await publish_ids(broker, big_route.staging, big_ids[:half])
    headers = {"x-acemq-id": "the-big-one", "x-big": "b" * BIG_HEADER_BYTES}
    await broker.publish(big_route.staging, headers=headers, message_id="the-big-one")
    await publish_ids(broker, big_route.staging, big_ids[half:])
    await publish_ids(broker, other_route.staging, other_ids)

    node_sidecar.amqp_url = f"{node_sidecar.amqp_url.rstrip('/')}/{query}"
    route_map = node_sidecar.route_map(quarantine=quarantine, flows=[big_route, other_route])
    node_sidecar.write(route_map)
    started = time.monotonic()
    await node_sidecar.start()

    other = await take_all(broker, other_route.target, PER_ROUTE, context=node_sidecar.output)
    big_target = PER_ROUTE + (big_goes_to == "target")
    big = await take_all(broker, big_route.target, big_target, context=node_sidecar.output)
    elapsed = time.monotonic() - started
    assert sorted(other) == other_ids
    assert sorted(set(big) - {"the-big-one"}) == big_ids
    if big_goes_to == "target":
        assert big.count("the-big-one") == 1
    else:
        assert "the-big-one" not in big
        (copy,) = await broker.take(quarantined, 1, timeout_s=RELAY_TIMEOUT_S)
        assert copy.header.properties.message_id == "the-big-one"
        reason = str((copy.header.properties.headers or {})[ERROR_HEADER])
        assert "frame size of 131072" in reason, reason
        assert "could not be written" in reason, reason  # the reason-only fallback
    assert await broker.depth(big_route.staging) == 0
    assert await broker.depth(quarantined) == 0
    reconnects = await node_sidecar.metric("acemq_sidecar_reconnects_total")
    assert reconnects == 0, node_sidecar.output()
    assert node_sidecar.is_running()
    record(
        messages=2 * PER_ROUTE + 1,
        faults=1,
        duplicates=len(big) + len(other) - 2 * PER_ROUTE - (big_goes_to == "target"),
        duplicate_bound=0,
        recovery_s=(),
        note=(
            f"sidecar URL {query or '(no frame_max)'}: the 300 KB header went to {big_goes_to};"
            f" reconnects {reconnects:g}; all {2 * PER_ROUTE + 1} settled in {elapsed:.1f} s"
        ),
    )


async def test_a_20_mib_header_table_is_quarantined_and_the_other_route_keeps_flowing(
    huge_frames_node: PrivateNode, tmp_path: Path, record: Callable[..., FaultRecord]
) -> None:
    """Over the 16 MiB the sidecar reads: passed over, its body quarantined, no reconnect.

    A publisher that took the broker's 32 MiB frame size sends a 20 MiB header table;
    RabbitMQ does not split content headers, so it hands the sidecar a 20 MiB frame. The
    connection stays open: no close (501) on it, nor on a redelivery.
    """
    sidecar = Sidecar(amqp_url=huge_frames_node.url, workdir=tmp_path)
    try:
        async with open_broker(huge_frames_node.url) as broker:
            quarantine, quarantined = await declare_quarantine(broker)
            big_route, other_route = (
                await declare_flow(broker, "huge"),
                await declare_flow(broker, "beside"),
            )
            big_ids, other_ids = make_ids("huge", PER_ROUTE), make_ids("beside", PER_ROUTE)
            half = PER_ROUTE // 2
            await publish_ids(broker, big_route.staging, big_ids[:half])
            headers = {"x-acemq-id": "the-huge-one", "x-big": "b" * HUGE_HEADER_BYTES}
            await broker.publish(
                big_route.staging, body=b"huge-body", headers=headers, message_id="the-huge-one"
            )
            await publish_ids(broker, big_route.staging, big_ids[half:])
            await publish_ids(broker, other_route.staging, other_ids)
            sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[big_route, other_route]))
            started = time.monotonic()
            await sidecar.start()
            other = await take_all(broker, other_route.target, PER_ROUTE, context=sidecar.output)
            big = await take_all(broker, big_route.target, PER_ROUTE, context=sidecar.output)
            (copy,) = await broker.take(quarantined, 1, timeout_s=RELAY_TIMEOUT_S)
            elapsed = time.monotonic() - started
            assert sorted(other) == other_ids
            assert sorted(big) == big_ids
            assert copy.body == b"huge-body"
            copy_headers = copy.header.properties.headers or {}
            reason = str(copy_headers[ERROR_HEADER])
            assert "bytes, over the limit of 16777216" in reason, reason
            assert "its properties and headers could not be read" in reason, reason
            assert await broker.depth(big_route.staging) == 0
            reconnects = await sidecar.metric("acemq_sidecar_reconnects_total")
            assert reconnects == 0, sidecar.output()
            assert sidecar.is_running()
    finally:
        await sidecar.kill()
    record(
        messages=2 * PER_ROUTE + 1,
        faults=1,
        duplicates=len(big) + len(other) - 2 * PER_ROUTE,
        duplicate_bound=0,
        recovery_s=(),
        note=(
            f"a {HUGE_HEADER_BYTES:,}-byte header table on a 32 MiB node: quarantined"
            f" ({reason[:90]}); reconnects {reconnects:g};"
            f" all {2 * PER_ROUTE + 1} settled in {elapsed:.1f} s"
        ),
    )


async def test_blocked_is_reported_with_the_brokers_reason_and_heartbeats_keep_the_link(
    frames_node: PrivateNode, record: Callable[..., FaultRecord]
) -> None:
    """A memory alarm: blocked_reason says so, a publish waits, the link survives, unblocks.

    Heartbeats every second, blocked for 3.5 s: a side that stopped heartbeating (or took
    the unread socket for a dead broker) would drop the connection.
    """
    ctl = frames_node.ctl
    address = BrokerAddress.parse(f"{frames_node.url}?heartbeat={HEARTBEAT_S}")
    connection = await connect(address, heartbeat_s=HEARTBEAT_S, connect_timeout_s=10, options=BARE)
    try:
        channel = await connection.channel(prefetch=1)
        await ctl.run("set_vm_memory_high_watermark", "absolute", "1")
        alarmed = time.monotonic()
        try:
            # RabbitMQ blocks a connection when it publishes during the alarm.
            waiting = asyncio.create_task(
                channel.publish(
                    b"during the alarm",
                    exchange="amq.fanout",
                    routing_key="",
                    properties={"message_id": "blocked"},
                    headers=None,
                    slow_after_s=60,
                    on_slow=lambda: None,
                )
            )
            await eventually(
                lambda: connection.blocked_reason is not None,
                timeout_s=30,
                what="connection.blocked",
            )
            reason = connection.blocked_reason
            blocked_after = time.monotonic() - alarmed
            unblocked = asyncio.create_task(connection.wait_unblocked())
            await asyncio.sleep(BLOCKED_FOR_S)
            assert connection.is_open, await connection.wait_closed()
            assert not unblocked.done()
        finally:
            await ctl.run("set_vm_memory_high_watermark", "0.4")
        cleared = time.monotonic()
        async with asyncio.timeout(30):
            await unblocked
        unblocked_after = time.monotonic() - cleared
        assert connection.blocked_reason is None
        async with asyncio.timeout(30):
            assert await waiting in (PublishOutcome.CONFIRMED, PublishOutcome.RETURNED)
        assert connection.is_open
    finally:
        await connection.close()
    assert reason is not None
    assert "memory" in reason, reason
    record(
        messages=1,
        faults=1,
        duplicates=0,
        duplicate_bound=0,
        recovery_s=(unblocked_after,),
        note=(
            f"blocked {blocked_after:.2f} s after the alarm ({reason!r}); open through"
            f" {BLOCKED_FOR_S} s blocked at heartbeat {HEARTBEAT_S} s; recovery is the unblock"
            " after the alarm cleared"
        ),
    )


@pytest.fixture(scope="module")
def amqplain_node(broker_version: str) -> Iterator[PrivateNode]:
    """A node of the version that offers AMQPLAIN only."""
    conf = "auth_mechanisms.1 = AMQPLAIN\n"
    with module_node(broker_version, "amqplain", conf=conf) as started:
        yield started


async def test_an_amqplain_only_broker_is_logged_into_and_a_refusal_names_the_mechanism(
    amqplain_node: PrivateNode,
) -> None:
    """Logged in with AMQPLAIN, not PLAIN (which RabbitMQ resets: ConnectionResetError 104)."""
    address = BrokerAddress.parse(amqplain_node.url)
    connection = await connect(address, heartbeat_s=30, connect_timeout_s=10, options=BARE)
    try:
        await connection.check_exchange("amq.direct")
    finally:
        await connection.close()
    wrong = BrokerAddress.parse(amqplain_node.url.replace("guest:guest", "guest:wrong-one"))
    with pytest.raises(ConnectFailedError) as e:
        await connect(wrong, heartbeat_s=30, connect_timeout_s=10, options=BARE)
    assert "SASL mechanism AMQPLAIN as user 'guest'" in str(e.value)
    assert "ACCESS_REFUSED" in str(e.value)
    assert "wrong-one" not in str(e.value)
