"""The network's silent faults: a broker behind a link that drops every packet, no FIN, no RST.

A private node runs inside a test host (``tests/faults/netns.py``) reached by two links: the
sidecar's connections cross one, the test's own publisher and checks the other. Cutting the
sidecar's link makes both its connections half-open at once, as a NAT or a load balancer
that forgets them does: what it writes vanishes, nothing more arrives, and nothing tells it
so. Each test proves, by id, under a mixed flow: nothing lost, nothing misplaced,
duplicates within what was in flight; ``/readyz`` not ready from the detection until the
relay runs again; and the times: the cut to its detection (bound: two heartbeat intervals
and the half interval the check runs at, docs/decisions/0066), the mend to the relay
moving again (bound: the reconnect backoff's delay then, plus a connect).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import Sidecar, eventually
from tests.faults.conftest import MixedFlow, declare_mixed_flow, scrape, wait_recovered
from tests.faults.netns import net_host
from tests.faults.private_node import private_node
from tests.faults.test_faults import finish, left_in_staging, wait_progress
from tests.support import open_broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from tests.faults.conftest import FaultRecord
    from tests.faults.netns import Link, NetHost
    from tests.faults.private_node import PrivateNode
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODE_NAME = "acemq-netfault@localhost"
# 20,000 messages across the two lanes by default.
PER_LANE = int(os.environ.get("ACEMQ_NETFAULT_PER_LANE", "10000"))
PREFETCH = 100
HEARTBEAT_S = 4
# The check runs every half interval and gives up after two silent intervals.
DETECT_BOUND_S = 2.5 * HEARTBEAT_S
# After the mend: the reconnect's backoff then (the cut lasts under 20 s: its attempts
# are at most 8 s apart by then) and one connect.
RESUME_BOUND_S = 8.0 + 5.0
SLACK_S = 3.0  # the test's own polling and a loaded machine


@pytest.fixture(scope="module")
def behind() -> Iterator[tuple[NetHost, PrivateNode]]:
    """A test host with two links and a private node inside it."""
    # guest logs in from the links' addresses: they are the test's own.
    conf = "loopback_users = none\n"
    with net_host("nf", links=2) as host, private_node(NODE_NAME, host=host, conf=conf) as node:
        yield host, node


@pytest.fixture
def relay_link(behind: tuple[NetHost, PrivateNode]) -> Iterator[Link]:
    """The link the sidecar's connections cross; mended at the end whatever happened."""
    link = behind[0].links[0]
    try:
        yield link
    finally:
        link.mend()


@pytest.fixture
async def nb(behind: tuple[NetHost, PrivateNode]) -> AsyncIterator[Broker]:
    """The test's client on the node, across the link that stays up."""
    host, node = behind
    async with open_broker(node.url_at(host.links[1].inside_address)) as client:
        yield client


@pytest.fixture
async def flow(nb: Broker) -> MixedFlow:
    """A declared mixed flow on the node behind the links (nothing published yet)."""
    return await declare_mixed_flow(nb)


@pytest.fixture
async def sidecar(
    behind: tuple[NetHost, PrivateNode], relay_link: Link, tmp_path: Path
) -> AsyncIterator[Sidecar]:
    """A sidecar process reaching the node across the relay link; killed at teardown."""
    process = Sidecar(amqp_url=behind[1].url_at(relay_link.inside_address), workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


def route_map(flow: MixedFlow, sidecar: Sidecar) -> dict[str, Any]:
    """Both lanes, with heartbeats short enough for the test to wait for two of them."""
    routes = flow.route_map(sidecar, prefetch=PREFETCH)
    routes["broker"]["heartbeat_s"] = HEARTBEAT_S
    return routes


async def wait_not_ready(sidecar: Sidecar, *, since: float) -> float:
    """Wait until /readyz says not ready; return the seconds since ``since``."""

    async def not_ready() -> bool:
        assert sidecar.is_running(), f"the sidecar died\n{sidecar.output()}"
        status, _ = await sidecar.get("/readyz")
        return status != 200

    await eventually(
        not_ready,
        timeout_s=DETECT_BOUND_S + SLACK_S,
        what="/readyz not ready after the cut",
        context=sidecar.output,
    )
    return time.monotonic() - since


async def outage(sidecar: Sidecar, link: Link) -> tuple[float, float]:
    """Cut the link, wait for the detection, stay cut a heartbeat more, mend it.

    Return the seconds from the cut to /readyz not ready, and the time of the mend.
    """
    link.cut()
    cut = time.monotonic()
    detected_s = await wait_not_ready(sidecar, since=cut)
    await asyncio.sleep(HEARTBEAT_S)
    status, body = await sidecar.get("/readyz")
    assert status != 200, f"ready with its link cut: {body}"
    link.mend()
    return detected_s, time.monotonic()


async def test_a_half_open_link_mid_flow_loses_nothing_and_the_relay_resumes(
    flow: MixedFlow,
    sidecar: Sidecar,
    relay_link: Link,
    record: Callable[..., FaultRecord],
) -> None:
    """The link drops every packet mid-flow: detected, not ready, resumed once mended."""
    await flow.publish(PER_LANE)
    sidecar.write(route_map(flow, sidecar))
    await sidecar.start()
    await wait_progress(flow, sidecar)
    detected_s, mended = await outage(sidecar, relay_link)
    left = await left_in_staging(flow, fault="the cut")
    resumed_s = await wait_recovered(sidecar, flow, since=mended, reconnects=1)
    assert resumed_s <= RESUME_BOUND_S + SLACK_S, f"relaying again {resumed_s:.1f}s after"
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[detected_s, resumed_s],
        note=f"left in staging {left}; recovery: the cut until not ready, the mend until ready",
    )


async def test_a_half_open_link_while_idle_is_found_and_the_flow_after_it_relayed(
    flow: MixedFlow,
    sidecar: Sidecar,
    relay_link: Link,
    record: Callable[..., FaultRecord],
) -> None:
    """Nothing flowing at the cut: the heartbeats find it; what is published meanwhile waits."""
    sidecar.write(route_map(flow, sidecar))
    await sidecar.start()
    relay_link.cut()
    cut = time.monotonic()
    await flow.publish(PER_LANE // 4)  # across the test's own link: into staging meanwhile
    detected_s = await wait_not_ready(sidecar, since=cut)
    await asyncio.sleep(HEARTBEAT_S)
    relay_link.mend()
    mended = time.monotonic()
    assert (await scrape(sidecar)).value("acemq_sidecar_broker_connected") == 0
    resumed_s = await wait_recovered(sidecar, flow, since=mended, reconnects=1)
    assert resumed_s <= RESUME_BOUND_S + SLACK_S, f"relaying again {resumed_s:.1f}s after"
    await finish(
        flow,
        sidecar,
        record,
        faults=1,
        recovery_s=[detected_s, resumed_s],
        note="idle at the cut; recovery: the cut until not ready, the mend until ready",
    )
