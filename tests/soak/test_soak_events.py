"""The transport conditions that happen to the flow, under a flow of 20,000.

A memory alarm mid-flow, then cleared; the broker's ``basic.cancel`` (a throwaway third
route's queue deleted, then declared again); the sidecar
stopped with SIGTERM again and again, while it starts and while it relays. Each test runs
the two routes of tests/soak/soak_flow.py (10,000 each) through the condition, then finds
every id where it belongs, counts the duplicates against a bound, and checks both routes
resumed by themselves.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import declare_flow, eventually, make_ids, publish_ids
from tests.e2e.test_process import stop_cleanly
from tests.faults.conftest import scrape, wait_recovered
from tests.faults.test_faults import left_in_staging, wait_progress
from tests.faults.test_refusals import Tally
from tests.soak.conftest import PER_LANE
from tests.soak.soak_flow import (
    GRACE_S,
    IN_FLIGHT_BOUND,
    PREFETCH,
    Moving,
    books,
    declare_soak_flow,
    held_still,
    memory_watermark,
    start,
    wait_settled,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import FaultRecord
    from tests.faults.private_node import PrivateNode
    from tests.soak.soak_flow import SoakFlow
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BLOCKED_FOR_S = 4.0
PROGRESS = 300
ALARM_WATERMARK = "0.0001"  # relative: 4.3 refuses an absolute 1 byte
SCRATCH = 5_000  # the throwaway route's backlog, most of it deleted with its queue
SCRATCH_AGAIN = 500
CANCELLED = "the broker cancelled the consumer"
# SIGTERMs: seconds after the spawn (while it starts), then after /readyz 200 (relaying).
WHILE_STARTING_S = (0.25, 0.4, 0.6, 0.9)
WHILE_RELAYING_S = (0.3, 1.0, 0.1, 1.5)


async def resumed_lanes(flow: SoakFlow, sidecar: Sidecar) -> list[float]:
    """Wait for a first, then PROGRESS more copies on each lane's target; return when each came."""
    marks = [await Moving(flow, lane).mark() for lane in flow.lanes]
    return [
        await mark.wait_moved(more, context=sidecar.output)
        for more in (1, PROGRESS)
        for mark in marks
    ]


async def test_item_4_a_memory_alarm_mid_flow_pauses_both_routes_until_it_clears(
    client: Broker, sidecar: Sidecar, node: PrivateNode, record: Callable[..., FaultRecord]
) -> None:
    """The alarm blocks the connection: /readyz and broker_blocked say why, nothing moves.

    Once it clears both routes resume without a reconnect, and every id is found.
    """
    flow = await declare_soak_flow(client, per_lane=PER_LANE)
    await flow.publish(PER_LANE)
    await start(flow, sidecar)
    await wait_progress(flow, sidecar, more=PROGRESS)
    watermark = await memory_watermark(node.ctl)
    await held_still(sidecar, node.ctl, "set_vm_memory_high_watermark", ALARM_WATERMARK)
    try:
        left = await left_in_staging(flow, fault="the memory alarm")
        await eventually(
            lambda: metric_is(sidecar, "acemq_sidecar_broker_blocked", 1),
            timeout_s=30,
            what="broker_blocked 1",
            context=sidecar.output,
        )
        status, body = await sidecar.get("/readyz")
        assert (status, '"broker": "blocked: low on memory"' in body) == (503, True), body
        before = await flow.downstream()
        await asyncio.sleep(BLOCKED_FOR_S)
        while_blocked = await flow.downstream() - before
    finally:
        await node.ctl.run("set_vm_memory_high_watermark", *watermark)
    cleared = time.monotonic()
    resumed = await wait_recovered(sidecar, flow, since=cleared)
    lanes_at = [at - cleared for at in await resumed_lanes(flow, sidecar)]
    metrics = await scrape(sidecar)
    assert metrics.value("acemq_sidecar_broker_blocked") == 0
    assert metrics.value("acemq_sidecar_reconnects_total") == 0, sidecar.output()
    await wait_settled(flow, sidecar)
    await stop_cleanly(sidecar)
    await flow.take_dead_letters()
    await books(
        flow,
        sidecar,
        record,
        bound=IN_FLIGHT_BOUND,
        faults=1,
        resumed_s=[resumed, *lanes_at],
        note=(
            f"{left} in staging at the alarm; {while_blocked} copies arrived in"
            f" {BLOCKED_FOR_S:g} s blocked ({body.strip()}); resumed is /readyz 200, then"
            f" a first and {PROGRESS} more copies on each route (orders, invoices) after the"
            " clear; reconnects 0"
        ),
    )


async def test_item_11_the_brokers_basic_cancel_mid_flow_and_a_route_that_resumes_by_itself(
    client: Broker, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """A third, throwaway route's staging queue is deleted mid-flow: the broker's basic.cancel.

    A single RabbitMQ 3.10 node cancels a consumer only when its queue goes (a crashed
    classic queue is restarted and its consumers kept; docs/reliability.md), so the
    throwaway route carries the cancel and what its queue held is gone with it, by the
    operator's hand. What it had taken was settled: its relayed ids are the queue's first
    ones, without a hole, and with the ready ones the delete counted make its whole backlog
    (so what was in flight at the cancel was relayed, not dropped). Re-declared, the queue
    is consumed again by itself and all of its new messages relayed; the two routes of
    20,000 flow on and lose nothing.
    """
    flow = await declare_soak_flow(client, per_lane=PER_LANE)
    scratch = await declare_flow(client, "scratch")
    before = make_ids("scratch", SCRATCH)
    await publish_ids(client, scratch.staging, before)
    await flow.publish(PER_LANE)
    route_map = flow.route_map(sidecar, prefetch=PREFETCH, shutdown_grace_s=GRACE_S)
    route_map["routes"].append(scratch.route())
    sidecar.write(route_map)
    await sidecar.start()
    marks = [await Moving(flow, lane).mark() for lane in flow.lanes]
    await eventually(
        lambda: depth_at_least(client, scratch.target, PROGRESS),
        timeout_s=30,
        what=f"{PROGRESS} scratch copies",
        context=sidecar.output,
    )
    deleted_with_queue = (await client.channel.queue_delete(scratch.staging)).message_count
    deleted = time.monotonic()
    assert deleted_with_queue, "the scratch queue was empty at the delete: nothing proven"
    left = await left_in_staging(flow, fault="the cancel")
    await eventually(
        lambda: sidecar_says(sidecar, CANCELLED) >= 1,
        timeout_s=30,
        what="the broker's basic.cancel logged",
        context=sidecar.output,
    )
    for mark in marks:
        await mark.wait_moved(PROGRESS, context=sidecar.output)  # the others flow on
    await client.queue("scratch.staging")  # the same name again
    again = time.monotonic()
    after = make_ids("scratch-again", SCRATCH_AGAIN)
    await publish_ids(client, scratch.staging, after)
    taken = Tally()
    await eventually(
        lambda: took_all(client, taken, scratch.target, after),
        timeout_s=60,
        what="every scratch message published after the re-declare",
        context=sidecar.output,
    )
    resumed = time.monotonic() - again
    await wait_settled(flow, sidecar)
    relayed_total = await sidecar.metric(
        "acemq_sidecar_messages_total", route="scratch", outcome="relayed"
    )
    await stop_cleanly(sidecar)
    await flow.take_dead_letters()
    await taken.take(client, scratch.target)
    copies = taken.copies()
    first = [id_ for id_ in before if id_ in copies]
    # delete-ok counts the ready messages: each one taken (in flight at the cancel too) was relayed
    assert len(first) + deleted_with_queue == SCRATCH, (len(first), deleted_with_queue)
    assert first == before[: len(first)], "a delivery taken before the cancel was skipped"
    scratch_duplicates = sum(copies.values()) - len(copies)
    assert scratch_duplicates <= PREFETCH, scratch_duplicates
    await books(
        flow,
        sidecar,
        record,
        bound=0,
        faults=1,
        resumed_s=[resumed],
        note=(
            f"{left} in staging at the cancel, {time.monotonic() - deleted:.0f} s in all;"
            f" scratch: {len(first)} of {SCRATCH} relayed before its queue went (the first"
            f" ones, no hole), {deleted_with_queue} deleted with it,"
            f" {sum(id_ in copies for id_ in after)} of {SCRATCH_AGAIN} after"
            f" the re-declare, {scratch_duplicates} duplicates (bound {PREFETCH}),"
            f" messages_total relayed {relayed_total:g}; resumed is the re-declare until all"
            f" {SCRATCH_AGAIN} new ones were relayed"
        ),
    )


async def metric_is(sidecar: Sidecar, name: str, value: float) -> bool:
    """Whether the sidecar's /metrics sample ``name`` has ``value``."""
    return await sidecar.metric(name) == value


async def depth_at_least(client: Broker, queue: str, depth: int) -> bool:
    """Whether ``queue`` holds ``depth`` messages or more."""
    return await client.depth(queue) >= depth


async def took_all(client: Broker, taken: Tally, queue: str, want: list[str]) -> bool:
    """Take the queue into ``taken``; whether every one of ``want`` came."""
    await taken.take(client, queue)
    return set(want) <= set(taken.ids)


def sidecar_says(sidecar: Sidecar, text: str) -> int:
    """How many lines of the sidecar's latest run's stderr contain ``text``."""
    return sum(text in line for line in sidecar.stderr().splitlines())


async def test_item_12_sigterm_again_and_again_while_starting_and_relaying(
    client: Broker, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """Eight SIGTERMs: four while the sidecar starts, four while it relays; each exits 0.

    Every restart resumes by itself, and the drains leave nothing to duplicate. The backlog
    is twice the others': on a quiet machine 20,000 were relayed before the eighth SIGTERM.
    """
    per_lane = 2 * PER_LANE
    flow = await declare_soak_flow(client, per_lane=per_lane)
    await flow.publish(per_lane)
    await start(flow, sidecar, wait_ready=False)
    ready_s: list[float] = []
    left: list[int] = []
    for run, delay in enumerate(WHILE_STARTING_S + WHILE_RELAYING_S):
        if run:
            spawned = time.monotonic()
            await sidecar.start(wait_ready=run >= len(WHILE_STARTING_S))
            if run >= len(WHILE_STARTING_S):
                ready_s.append(time.monotonic() - spawned)
        await asyncio.sleep(delay)
        left.append(await left_in_staging(flow, fault=f"SIGTERM {run + 1}"))
        await stop_cleanly(sidecar)
    spawned = time.monotonic()
    await sidecar.start()
    ready_s.append(time.monotonic() - spawned)
    await wait_settled(flow, sidecar)
    await stop_cleanly(sidecar)
    await flow.take_dead_letters()
    stops = len(WHILE_STARTING_S + WHILE_RELAYING_S)
    await books(
        flow,
        sidecar,
        record,
        bound=stops * IN_FLIGHT_BOUND,
        faults=stops,
        resumed_s=ready_s,
        note=(
            f"{stops} SIGTERMs, all exit 0: {len(WHILE_STARTING_S)} at"
            f" {', '.join(f'{s:g}' for s in WHILE_STARTING_S)} s after the spawn, then"
            f" {', '.join(f'{s:g}' for s in WHILE_RELAYING_S)} s after /readyz 200; left in"
            f" staging {left}; resumed is the spawn until /readyz 200"
        ),
    )
