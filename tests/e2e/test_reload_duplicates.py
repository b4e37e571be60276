"""Reloads that restart a route during a flow: nothing lost, duplicates bounded and counted.

A reload replaces the route's worker; the old one drains (cancel, settle what
it holds, close) while the new one consumes. At most a prefetch window per reload can be
relayed twice; this counts how many are, for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    duplicates,
    make_ids,
    publish_ids,
    take_until,
)
from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MESSAGES = 4000
PREFETCH = 200
RELOADS = 5


async def test_reloads_that_restart_a_route_mid_flow_lose_nothing(
    broker: Broker, sidecar: Sidecar
) -> None:
    """Five restarting reloads during a 4,000-message flow: 0 lost, duplicates counted."""
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "reload")
    ids = make_ids("reload", MESSAGES)
    await publish_ids(broker, flow.staging, ids)
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=PREFETCH)
    sidecar.write(route_map)
    await sidecar.start()
    left = []
    for reload in range(RELOADS):
        # A changed origin restarts the route (sidecar.routemap.reload_plan).
        route_map["routes"][0]["origin"] = f"reload-{reload}"
        sidecar.write(route_map)
        sidecar.send(signal.SIGHUP)
        left.append(await broker.depth(flow.staging))
        await asyncio.sleep(0.05)
    taken = await take_until(broker, flow.target, ids, timeout_s=60, context=sidecar.output)
    await sidecar.wait_ready()
    assert await broker.depth(flow.staging) == 0
    extra = duplicates(taken)
    print(  # noqa: T201
        f"\nreload duplicates: {extra} in {MESSAGES} messages, {RELOADS} reloads"
        f" (bound {RELOADS * PREFETCH}); left in staging at each reload: {left}"
    )
    assert left[0] > 0, "the flow ended before the first reload: nothing was tested"
    assert extra <= RELOADS * PREFETCH
