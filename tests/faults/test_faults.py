"""Faults during a mixed flow of at least 5,000 messages on two routes (acemq and apps).

Each test starts the sidecar as a process on a backlog of good, repairable and
quarantined messages, injects its fault while the backlog is being relayed, and then
proves invariant 3 by id: every message is in its target queue or in quarantine (where its
plan says), staging is empty, and the duplicates number at most what was in flight at the
faults (prefetch x routes per fault), each one a copy with the same ``x-acemq-id``. The
process recovers by itself (only kill -9 needs a restart, as in Kubernetes), and /metrics
tells the story: reconnects_total rose, route_up and broker_connected are back to 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import eventually
from tests.faults.conftest import (
    Fate,
    MixedFlow,
    RabbitCtl,
    declare_quarantine_exchange,
    declare_target,
    scrape,
    wait_nothing_in_flight,
    wait_recovered,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import FaultRecord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

# Two lanes: 8,000 messages by default (the relay runs at several thousand a second);
# ACEMQ_FAULT_PER_LANE=10000 gives a run of 20,000 messages.
PER_LANE = int(os.environ.get("ACEMQ_FAULT_PER_LANE", "4000"))
PREFETCH = 100
ROUTES = 2
IN_FLIGHT_BOUND = PREFETCH * ROUTES  # what one fault can leave confirmed but unacked
PROGRESS = 300  # copies relayed between faults, so each one lands mid-flow
COMPLETE_TIMEOUT_S = 90.0
GRACE_S = 10.0
EXIT_MARGIN_S = 5.0
PAUSE_OBSERVED_S = 2.0


async def start_flow(flow: MixedFlow, sidecar: Sidecar, *, prefetch: int = PREFETCH) -> None:
    """Publish the backlog and start the sidecar on it."""
    await flow.publish(PER_LANE)
    sidecar.write(flow.route_map(sidecar, prefetch=prefetch, shutdown_grace_s=GRACE_S))
    await sidecar.start()


async def wait_progress(flow: MixedFlow, sidecar: Sidecar, *, more: int = PROGRESS) -> None:
    """Wait until ``more`` further copies arrived downstream: the flow is moving."""
    goal = await flow.downstream() + more

    async def moved() -> bool:
        return await flow.downstream() >= goal

    await eventually(moved, timeout_s=30, what=f"{goal} copies downstream", context=sidecar.output)


async def refill(flow: MixedFlow, sidecar: Sidecar, per_lane: int) -> None:
    """Publish ``per_lane`` more on each lane with the sidecar held still, so they wait."""
    sidecar.send(signal.SIGSTOP)
    try:
        await flow.publish(per_lane)
    finally:
        sidecar.send(signal.SIGCONT)


async def left_in_staging(flow: MixedFlow, *, fault: str) -> int:
    """Assert the fault hit mid-flow: messages were left in staging. Return how many."""
    depth = await flow.staging_depth()
    assert depth > 0, f"{fault} came after the flow had finished: nothing proven"
    return depth


async def finish(
    flow: MixedFlow,
    sidecar: Sidecar,
    record: Callable[..., FaultRecord],
    *,
    faults: int,
    recovery_s: list[float],
    note: str = "",
) -> None:
    """Relay to the end, check the metrics and the books, stop cleanly, record the numbers."""
    await flow.wait_complete(timeout_s=COMPLETE_TIMEOUT_S, context=sidecar.output)
    await wait_nothing_in_flight(sidecar, flow, context=sidecar.output)
    metrics = await scrape(sidecar)
    if sidecar.runs == 1:  # one process saw every message: each was acked at least once
        for fate, outcome in ((Fate.TARGET, "relayed"), (Fate.QUARANTINE, "quarantined")):
            expected = sum(1 for value in flow.fates.values() if value is fate)
            counted = metrics.value("acemq_sidecar_messages_total", outcome=outcome)
            assert counted >= expected, f"messages_total{{{outcome}}} {counted} < {expected}"
    sidecar.send(signal.SIGTERM)
    status = await sidecar.wait_exit(timeout_s=GRACE_S + EXIT_MARGIN_S)
    assert status == 0, f"exit status {status} after SIGTERM\n{sidecar.output()}"
    await flow.collect()
    assert await flow.staging_depth() == 0
    duplicates = flow.check(max_duplicates=faults * IN_FLIGHT_BOUND, context=sidecar.output)
    record(
        messages=flow.published,
        faults=faults,
        duplicates=duplicates,
        duplicate_bound=faults * IN_FLIGHT_BOUND,
        recovery_s=tuple(recovery_s),
        note=note,
    )


@pytest.mark.version_changed
async def test_close_all_connections_three_times_loses_nothing(
    flow: MixedFlow,
    sidecar: Sidecar,
    rabbitmqctl: RabbitCtl,
    record: Callable[..., FaultRecord],
) -> None:
    """Three connection cuts mid-flow: three reconnects by itself, every id accounted for."""
    await start_flow(flow, sidecar)
    assert (await scrape(sidecar)).value("acemq_sidecar_reconnects_total") == 0
    recovery: list[float] = []
    left: list[int] = []
    for fault in range(1, 4):
        if fault > 1:  # a backlog of its own for this cut: the last one may be relayed by now
            await refill(flow, sidecar, PER_LANE // 4)
        await wait_progress(flow, sidecar)
        # rabbitmqctl takes a second or two to start, in which the sidecar would drain the
        # backlog: hold it still (in flight, mid-work) until the cut has landed.
        sidecar.send(signal.SIGSTOP)
        try:
            await rabbitmqctl.close_all_connections()
        finally:
            sidecar.send(signal.SIGCONT)
        cut = time.monotonic()
        await flow.broker.reconnect()  # the test's own connection went too
        left.append(await left_in_staging(flow, fault=f"cut {fault}"))
        recovery.append(await wait_recovered(sidecar, flow, since=cut, reconnects=fault))
    assert sidecar.runs == 1
    await finish(
        flow, sidecar, record, faults=3, recovery_s=recovery, note=f"left in staging {left}"
    )


async def test_broker_restart_loses_nothing(
    flow: MixedFlow,
    sidecar: Sidecar,
    rabbitmqctl: RabbitCtl,
    record: Callable[..., FaultRecord],
) -> None:
    """stop_app/start_app mid-flow: not ready while down, back by itself, nothing lost."""
    await start_flow(flow, sidecar)
    await wait_progress(flow, sidecar)
    # rabbitmqctl takes a second or two to start, in which the sidecar would drain the
    # backlog: hold it still (in flight, mid-work) until the broker has stopped.
    sidecar.send(signal.SIGSTOP)
    try:
        async with rabbitmqctl.app_stopped():
            sidecar.send(signal.SIGCONT)
            last: list[str] = []

            async def down_noticed() -> bool:
                status, body = await sidecar.get("/readyz")
                metrics = await scrape(sidecar)
                last[:] = [f"/readyz {status}: {body}"]
                return status == 503 and metrics.value("acemq_sidecar_broker_connected") == 0

            await eventually(
                down_noticed,
                timeout_s=10,
                what="the broker down on /readyz",
                context=lambda: "; ".join(last),
            )
            assert sidecar.is_running(), sidecar.output()
    finally:
        sidecar.send(signal.SIGCONT)
    back = time.monotonic()
    await flow.broker.reconnect()
    left = await left_in_staging(flow, fault="the broker restart")
    recovery = await wait_recovered(sidecar, flow, since=back, reconnects=1)
    assert sidecar.runs == 1
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[recovery],
        note=f"left in staging {left}; recovery counted from start_app's return",
    )


async def test_kill_9_then_restart_loses_nothing(
    flow: MixedFlow, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """kill -9 mid-flow, then a restart: the broker requeues the unacked, all are relayed."""
    await start_flow(flow, sidecar)
    await wait_progress(flow, sidecar)
    sidecar.send(signal.SIGKILL)
    status = await sidecar.wait_exit(timeout_s=EXIT_MARGIN_S)
    assert status == -signal.SIGKILL, sidecar.output()
    left = await left_in_staging(flow, fault="kill -9")
    restarted = time.monotonic()
    await sidecar.start()
    recovery = await wait_recovered(sidecar, flow, since=restarted)
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[recovery],
        note=f"left in staging {left}; recovery counted from the restart",
    )


async def test_target_exchange_deleted_and_recreated_pauses_only_its_route(
    flow: MixedFlow, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """Target exchange deleted mid-flow: its route pauses (503), the other flows, then resumes."""
    await start_flow(flow, sidecar)
    orders, invoices = flow.lane("orders"), flow.lane("invoices")
    await wait_progress(flow, sidecar)
    await flow.broker.channel.exchange_delete(orders.exchange)
    await assert_paused(sidecar, [orders.name], missing=orders.exchange)
    held = await flow.broker.depth(orders.staging)
    assert held > 0, "the exchange went after the flow had finished: nothing proven"
    # The other route keeps flowing while this one is paused.
    invoices_before = await flow.broker.depth(invoices.target)
    await asyncio.sleep(PAUSE_OBSERVED_S)
    invoices_after = await flow.broker.depth(invoices.target)
    assert invoices_after > invoices_before or await flow.broker.depth(invoices.staging) == 0
    assert await flow.broker.depth(orders.staging) >= held, "messages left staging while paused"
    metrics = await scrape(sidecar)
    assert metrics.value("acemq_sidecar_route_up", route=orders.name) == 0, metrics.text

    recreated = time.monotonic()
    await declare_target(flow.broker, orders)
    recovery = await wait_recovered(sidecar, flow, since=recreated)
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[recovery],
        note=f"{held} held in staging while paused; recovery from the re-declare",
    )


async def test_deleting_one_targets_exchange_leaves_the_other_route_and_connection_alone(
    flow: MixedFlow, sidecar: Sidecar
) -> None:
    """Invariant 4: a missing target pauses only its route; the connection stays up."""
    await start_flow(flow, sidecar)
    orders, invoices = flow.lane("orders"), flow.lane("invoices")
    await wait_progress(flow, sidecar)
    await flow.broker.channel.exchange_delete(orders.exchange)
    await assert_paused(sidecar, [orders.name], missing=orders.exchange)
    await asyncio.sleep(PAUSE_OBSERVED_S)
    metrics = await scrape(sidecar)
    assert metrics.value("acemq_sidecar_reconnects_total") == 0, sidecar.output()
    assert metrics.value("acemq_sidecar_route_up", route=invoices.name) == 1, metrics.text


async def test_quarantine_exchange_missing_when_a_reject_arrives(
    flow: MixedFlow, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """No quarantine exchange: rejects stay in staging (503) until it exists; nothing lost."""
    await start_flow(flow, sidecar)
    await wait_progress(flow, sidecar)
    await flow.broker.channel.exchange_delete(flow.quarantine)
    names = [lane.name for lane in flow.lanes]
    await assert_paused(sidecar, names, missing=flow.quarantine)
    held = await left_in_staging(flow, fault="deleting the quarantine exchange")
    await asyncio.sleep(PAUSE_OBSERVED_S)
    assert await flow.staging_depth() >= held, "messages left staging while paused"
    assert sidecar.is_running(), sidecar.output()

    recreated = time.monotonic()
    await declare_quarantine_exchange(flow.broker, flow.quarantine, flow.quarantined)
    recovery = await wait_recovered(sidecar, flow, since=recreated)
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[recovery],
        note=f"{held} held in staging while paused; recovery from the re-declare",
    )


async def assert_paused(sidecar: Sidecar, routes: list[str], *, missing: str) -> None:
    """Wait for /readyz 503 naming ``missing`` and route_up 0 on exactly these routes."""
    last: list[str] = []

    async def paused() -> bool:
        status, body = await sidecar.get("/readyz")
        metrics = await scrape(sidecar)
        last[:] = [f"/readyz {status}: {body}"]
        return (
            status == 503
            and missing in body
            and all(metrics.value("acemq_sidecar_route_up", route=r) == 0 for r in routes)
        )

    await eventually(
        paused,
        timeout_s=30,
        what=f"routes {routes} paused on {missing}",
        context=lambda: "\n".join([*last, sidecar.output()]),
    )


async def test_sigterm_with_a_full_prefetch_window_drains_then_a_restart_finishes(
    flow: MixedFlow, sidecar: Sidecar, record: Callable[..., FaultRecord]
) -> None:
    """SIGTERM with every route's prefetch window in flight: settle it, exit 0, no duplicate."""
    await start_flow(flow, sidecar)
    await wait_progress(flow, sidecar)
    in_flight: list[float] = []

    async def windows_full() -> bool:
        # The relay keeps up with the broker, so a window is not full at every instant.
        metrics = await scrape(sidecar)
        in_flight[:] = [
            metrics.value("acemq_sidecar_in_flight", route=lane.name) for lane in flow.lanes
        ]
        return all(count >= PREFETCH // 2 for count in in_flight)

    await eventually(windows_full, timeout_s=20, what="half-full windows", context=sidecar.output)
    sidecar.send(signal.SIGTERM)
    term = time.monotonic()
    status = await sidecar.wait_exit(timeout_s=GRACE_S + EXIT_MARGIN_S)
    drained = time.monotonic() - term
    assert status == 0, f"exit status {status} after SIGTERM\n{sidecar.output()}"
    assert "draining" in sidecar.stderr(), sidecar.output()
    assert all(PREFETCH // 2 <= count <= PREFETCH for count in in_flight), (
        f"in flight at SIGTERM {in_flight}: not a full window within prefetch {PREFETCH}"
    )
    left = await left_in_staging(flow, fault="SIGTERM")
    restarted = time.monotonic()
    await sidecar.start()
    recovery = await wait_recovered(sidecar, flow, since=restarted)
    # A clean drain settles everything it took: no id may come twice.
    await finish(
        flow,
        sidecar,
        record,
        faults=0,
        recovery_s=[drained, recovery],
        note=(
            f"in flight at SIGTERM {in_flight}, left in staging {left};"
            " recovery = drain seconds, then restart to ready"
        ),
    )
