"""Reloads in a storm: after any sequence of SIGHUPs, one consumer per route, current config.

A channel opened for a worker that a reload cancelled must be closed, never left consuming
with the old target. The broker's own count of a queue's consumers is the
judge: ``queue.declare`` (passive) returns it, as ``rabbitmqctl list_consumers`` lists them.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    declare_target,
    eventually,
    make_ids,
    publish_ids,
    take_ids,
    take_until,
)
from tests.support import Broker

DELIVERY_TIMEOUT_S = 30.0
STORM = 50  # SIGHUPs as fast as the test can send them
PAIRS = 20  # reload pairs a few milliseconds apart
PAIR_GAP_S = 0.008


async def consumers(broker: Broker, queue: str) -> int:
    """The broker's count of consumers on ``queue``."""
    declared = await broker.channel.queue_declare(queue, passive=True)
    return int(declared.consumer_count or 0)


async def settle_on_one_consumer(broker: Broker, sidecar: Sidecar, queue: str) -> None:
    """Wait until the reloads are done: ready, and one consumer left (or fail naming more)."""
    await sidecar.wait_ready()

    async def one() -> bool:
        return await consumers(broker, queue) == 1

    await eventually(
        one, timeout_s=30, what=f"exactly one consumer on {queue}", context=sidecar.output
    )
    await asyncio.sleep(1.0)  # a leaked channel would still be consuming now
    assert await consumers(broker, queue) == 1, sidecar.output()


@pytest.mark.e2e
async def test_a_storm_of_reloads_leaves_one_consumer_with_the_last_target(
    broker: Broker, sidecar: Sidecar
) -> None:
    """50 SIGHUPs alternating targets: one consumer, and every new message goes to the last."""
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "storm")
    other_target = await broker.queue("storm.other.target")
    other_exchange = broker.name("storm.other.exchange")
    await declare_target(broker, exchange=other_exchange, target=other_target)
    first = sidecar.route_map(quarantine=quarantine, flows=[flow])
    second = sidecar.route_map(quarantine=quarantine, flows=[flow])
    second["routes"][0]["to"]["exchange"] = other_exchange
    sidecar.write(first)
    sidecar.pad()
    await sidecar.start()
    await publish_ids(broker, flow.staging, make_ids("before", 200))

    for i in range(STORM):
        sidecar.write(second if i % 2 == 0 else first, keep_stamp=True)
        sidecar.send(signal.SIGHUP)
        await asyncio.sleep(0.02)
    last = second if STORM % 2 == 1 else first
    assert last is first
    sidecar.write(second, keep_stamp=True)  # the last word: the other target
    sidecar.send(signal.SIGHUP)
    await settle_on_one_consumer(broker, sidecar, flow.staging)

    await take_ids(broker, flow.target)  # whatever the storm relayed to the first target
    await take_ids(broker, other_target)
    after = make_ids("after", 500)
    await publish_ids(broker, flow.staging, after)
    await take_until(
        broker, other_target, after, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    await asyncio.sleep(0.5)
    leaked = [i for i in await take_ids(broker, flow.target) if i.startswith("after")]
    assert leaked == [], f"{len(leaked)} new messages went to the old target"
    assert sidecar.is_running(), sidecar.output()


@pytest.mark.e2e
async def test_reload_pairs_a_few_milliseconds_apart_leak_no_consumer(
    broker: Broker, sidecar: Sidecar
) -> None:
    """Two reloads 8 ms apart, twenty times: one consumer after each pair.

    Not at once: a replaced consumer's drain may wait half a second for its window before
    the cancel (``RouteConsumer.cancel``), beside its successor; a leaked one stays.
    """
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "pairs")
    first = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=64)
    second = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=65)
    sidecar.write(first)
    sidecar.pad()
    await sidecar.start()

    async def at_most_one() -> bool:
        return await consumers(broker, flow.staging) <= 1

    for _ in range(PAIRS):
        sidecar.write(second, keep_stamp=True)
        sidecar.send(signal.SIGHUP)
        await asyncio.sleep(PAIR_GAP_S)
        sidecar.write(first, keep_stamp=True)
        sidecar.send(signal.SIGHUP)
        await eventually(
            at_most_one, timeout_s=5, what="at most one consumer", context=sidecar.output
        )
    await settle_on_one_consumer(broker, sidecar, flow.staging)


@pytest.mark.e2e
async def test_a_reload_that_removes_the_route_after_a_storm_stops_consuming(
    broker: Broker, sidecar: Sidecar
) -> None:
    """After a storm, removing the route leaves no consumer and new messages in staging."""
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "gone")
    keeper = await declare_flow(broker, "keeper")
    both = sidecar.route_map(quarantine=quarantine, flows=[flow, keeper])
    restarted = sidecar.route_map(quarantine=quarantine, flows=[flow, keeper], prefetch=65)
    only_keeper = sidecar.route_map(quarantine=quarantine, flows=[keeper])
    sidecar.write(both)
    sidecar.pad()
    await sidecar.start()
    for i in range(STORM):
        sidecar.write(restarted if i % 2 == 0 else both, keep_stamp=True)
        sidecar.send(signal.SIGHUP)
        await asyncio.sleep(0.02)
    sidecar.write(only_keeper, keep_stamp=True)
    sidecar.send(signal.SIGHUP)
    await settle_on_one_consumer(broker, sidecar, keeper.staging)

    async def none() -> bool:
        return await consumers(broker, flow.staging) == 0

    await eventually(
        none, timeout_s=30, what="no consumer on the removed route", context=sidecar.output
    )
    await take_ids(broker, flow.target)
    waiting = make_ids("left", 200)
    await publish_ids(broker, flow.staging, waiting)
    await asyncio.sleep(1.0)
    assert await take_ids(broker, flow.target) == []
    assert await broker.depth(flow.staging) == len(waiting)
