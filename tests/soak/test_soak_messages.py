"""The transport conditions carried by messages, under a flow of 20,000.

Each test runs the sidecar on the two routes of tests/soak/soak_flow.py (10,000 each) with
the condition in the flow: large header tables spread through it, deliveries the target
keeps refusing on quorum staging under a 5 s ``consumer_timeout``, one of a fanout's two
queues full (``reject-publish``) for a share of the flow, ``max_message_size`` lowered
below messages already queued and put back. Every id is then found where it belongs
(target, quarantine, or, where the test allows it, the dead-letter queue), duplicates are
counted against a bound, and both routes have flowed or resumed by themselves.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING

import pytest

from tests.brokers import CONSUMER_TIMED_OUT, differs_on
from tests.e2e.conftest import eventually, make_ids
from tests.e2e.test_process import stop_cleanly
from tests.faults.conftest import Fate, scrape, wait_recovered
from tests.faults.test_faults import left_in_staging, wait_progress
from tests.soak.conftest import PER_LANE
from tests.soak.soak_flow import (
    PREFETCH,
    Moving,
    books,
    declare_soak_flow,
    held_still,
    node_log_lines,
    start,
    wait_settled,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import FaultRecord
    from tests.faults.private_node import PrivateNode
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BIG_HEADER_BYTES = 300_000
LARGE = 8  # large header tables, one after each eighth of the orders backlog
HELD = 16  # messages the target refuses every time
CONSUMER_TIMEOUT_MS = 5000
NACK_ATTEMPTS = 3
NACKED_WANTED = 200  # copies retried while the fanout's queue is full, before it clears
BIG_BODY = 100_000
BIG = 16  # bodies over the lowered max_message_size
LOWERED_MAX = 65_536
DEAD_WANTED = 2  # big ones dead-lettered before the limit is put back
POLICY = "acemq-soak-full"
TIMED_OUT = CONSUMER_TIMED_OUT  # the broker's log line, on every version


async def test_item_1_large_header_tables_are_relayed_with_no_reconnect(
    client: Broker, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """8 messages with a 300 KB header table in 20,000, frame_max 1 MiB: relayed once each.

    No reconnect: neither a redelivery of one such message nor the other route's flow
    costs the connection.
    """
    flow = await declare_soak_flow(client, per_lane=PER_LANE)
    orders = flow.lane("orders")
    large = make_ids("orders-large", LARGE)
    header = {"x-big": "b" * BIG_HEADER_BYTES}
    await flow.publish_spread(
        orders, large, routing_key="ok.large", fate=Fate.TARGET, headers=header
    )
    started = time.monotonic()
    await start(flow, sidecar)
    settled = await wait_settled(flow, sidecar)
    reconnects = (await scrape(sidecar)).value("acemq_sidecar_reconnects_total")
    assert reconnects == 0, sidecar.output()
    await stop_cleanly(sidecar)
    await flow.take_dead_letters()
    await books(
        flow,
        sidecar,
        record,
        bound=0,
        faults=LARGE,
        note=(
            f"{LARGE} messages with a {BIG_HEADER_BYTES:,}-byte header relayed"
            f" {sum(flow.target_copies(large).values())} times; reconnects {reconnects:g};"
            f" all settled {settled - started:.1f} s after the start"
        ),
    )


async def test_item_2_held_deliveries_are_quarantined_before_the_consumer_timeout(
    client: Broker, sidecar: Sidecar, node: PrivateNode, record: Callable[..., FaultRecord]
) -> None:
    """16 messages the target refuses every time, quorum staging, x-delivery-limit 1.

    The node's consumer_timeout is 5 s for this test; the sidecar, told so, quarantines
    each held copy at 2.5 s. The broker's timer must never fire (its log says so when it
    does): a channel it closed would requeue the window, and the delivery limit drop it.
    """
    flow = await declare_soak_flow(
        client, per_lane=PER_LANE, staging={"x-queue-type": "quorum", "x-delivery-limit": 1}
    )
    orders = flow.lane("orders")
    full = await client.queue("orders.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await client.bind(full, orders.exchange, "held.#")
    held = make_ids("orders-held", HELD)
    await flow.publish_spread(orders, held, routing_key="held.refused", fate=Fate.QUARANTINE)
    timeouts_before = len(node_log_lines(node, TIMED_OUT))
    async with node.ctl.rabbit_env_set("consumer_timeout", str(CONSUMER_TIMEOUT_MS)):
        started = time.monotonic()
        await start(
            flow,
            sidecar,
            consumer_timeout_s=CONSUMER_TIMEOUT_MS / 1000,
            nack_retry={"max_attempts": 1000, "max_s": 3600},  # the timeout decides
        )
        settled = await wait_settled(flow, sidecar)
        await stop_cleanly(sidecar)
    timeouts = node_log_lines(node, TIMED_OUT)[timeouts_before:]
    assert not timeouts, timeouts
    await flow.take_dead_letters()  # none: the delivery limit dropped nothing
    await books(
        flow,
        sidecar,
        record,
        bound=0,
        faults=HELD,
        note=(
            f"{HELD} held copies quarantined, the broker's consumer timer fired 0 times;"
            f" all settled {settled - started:.1f} s after the start"
        ),
    )
    for id_ in held:
        assert "consumer_timeout of 5s" in flow.reasons[id_], flow.reasons[id_]


async def test_item_3_a_fanout_queue_full_for_a_share_of_the_flow_bounds_the_copies(
    client: Broker, sidecar: Sidecar, node: PrivateNode, record: Callable[..., FaultRecord]
) -> None:
    """invoices' target is a fanout to two queues; a policy makes one full mid-flow, then goes.

    Each nacked copy is retried at most 3 times (each retry one more copy in the other
    queue), then quarantined; after the policy is cleared the route relays as before. The
    copies stay bounded (a client that retried without bound made 7 of one message in 30 s).
    """
    flow = await declare_soak_flow(client, per_lane=PER_LANE, fanout="invoices")
    orders, invoices = flow.lanes
    mirror = await client.queue("invoices.mirror")
    await client.bind(mirror, invoices.exchange, routing_key="")
    await flow.publish(PER_LANE)
    await start(flow, sidecar, nack_retry={"max_attempts": NACK_ATTEMPTS, "max_s": 60})
    await wait_progress(flow, sidecar)
    full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    policy = ("set_policy", POLICY, f"^{re.escape(mirror)}$", full, "--apply-to", "queues")
    await held_still(sidecar, node.ctl, *policy)
    try:
        left = await left_in_staging(flow, fault="the full queue")
        other = await Moving(flow, orders).mark()

        async def retried() -> bool:
            value = await sidecar.metric("acemq_sidecar_retried_copies_total", route="invoices")
            return value >= NACKED_WANTED

        await eventually(retried, timeout_s=60, what="retried copies", context=sidecar.output)
    finally:
        await node.ctl.run("clear_policy", POLICY)
    cleared = time.monotonic()
    other_moved = await other.moved()
    assert other_moved > 0 or await client.depth(orders.staging) == 0, "orders stopped"
    resumed = await wait_recovered(sidecar, flow, since=cleared)
    await wait_settled(flow, sidecar)
    retries = await sidecar.metric("acemq_sidecar_retried_copies_total", route="invoices")
    await stop_cleanly(sidecar)
    await flow.take_dead_letters()
    copies = flow.target_copies(flow.ids_of(invoices))
    most = max(copies.values())
    assert most <= NACK_ATTEMPTS, f"{most} copies of one message in the target"
    nacked = flow.replan_quarantined(flow.ids_of(invoices), reason="nacked")
    assert nacked, "no copy was nacked: the full queue proved nothing"
    left_in_target = sum(copies[id_] for id_ in nacked)
    await books(
        flow,
        sidecar,
        record,
        bound=int(retries),  # a retry that was confirmed may have left one more copy
        faults=1,
        resumed_s=[resumed],
        note=(
            f"{left} in staging at the fault; {len(nacked)} nacked {NACK_ATTEMPTS} times and"
            f" quarantined, leaving {left_in_target} copies in the other queue (bound"
            f" {NACK_ATTEMPTS} each); retried_copies_total {retries:g}; orders relayed"
            f" {other_moved} while the queue was full"
        ),
    )


async def test_item_5_max_message_size_lowered_below_queued_messages_then_restored(
    client: Broker,
    sidecar: Sidecar,
    node: PrivateNode,
    record: Callable[..., FaultRecord],
    request: pytest.FixtureRequest,
) -> None:
    """16 bodies of 100 KB in the flow, max_message_size 64 KiB at the start, put back later.

    RabbitMQ reads the limit when a channel opens: the sidecar starts under it, and each
    channel it reopens after a refusal reads it again. No channel takes a big one while it
    holds: dead-lettered (target and quarantine refuse it). Once put back they relay. The
    route never sticks in a loop of 406 and channel reopen.

    4.0.5 and 4.3.6 read ``max_message_size`` once, at boot: a node's limit lowered at run
    time takes no new channel's publish (a 100 KB body was confirmed under 64 KiB).
    """
    differs_on(
        request,
        ("4.0", "4.3"),
        "4.x reads max_message_size at boot only: nothing is dead-lettered in the wait",
        raises=pytest.fail.Exception,  # eventually's "not within 60s: dead-lettered"
    )
    flow = await declare_soak_flow(client, per_lane=PER_LANE)
    orders, invoices = flow.lanes
    big = make_ids("orders-big", BIG)
    await flow.publish_spread(
        orders, big, routing_key="ok.big", fate=Fate.TARGET, body=b"B" * BIG_BODY
    )
    async with node.ctl.rabbit_env_set("max_message_size", str(LOWERED_MAX)):
        await start(flow, sidecar)
        other = await Moving(flow, invoices).mark()

        async def dead() -> bool:
            return await client.depth(flow.dead_letter_queue) >= DEAD_WANTED

        await eventually(dead, timeout_s=60, what="dead-lettered", context=sidecar.output)
        left = await left_in_staging(flow, fault="the limit's restore")
    cleared = time.monotonic()
    other_moved = await other.moved()
    assert other_moved > 0 or await client.depth(invoices.staging) == 0, "invoices stopped"
    resumed = await wait_recovered(sidecar, flow, since=cleared)
    await wait_settled(flow, sidecar)
    await stop_cleanly(sidecar)
    dead_lettered = await flow.take_dead_letters(allowed=big)
    quarantined = flow.replan_quarantined(big, reason="406")
    relayed = len(flow.target_copies(big))
    assert relayed, "no big one was relayed once the limit was put back"
    await books(
        flow,
        sidecar,
        record,
        bound=PREFETCH * BIG,  # each refusal closes a publish channel: its window again
        faults=BIG,
        resumed_s=[resumed],
        note=(
            f"{left} in staging at the restore; of {BIG} big: {dead_lettered} dead-lettered,"
            f" {len(quarantined)} quarantined, {relayed} relayed; invoices relayed"
            f" {other_moved} while the limit was low"
        ),
    )
