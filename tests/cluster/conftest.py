"""Fixtures for the cluster tests: one three-node cluster for them all, quorum flows, replicas.

``cluster`` starts the three nodes once (tests/cluster/nodes.py; about 40 s on the 2-core
machine) and stops them after the package's last test; after each test every node is brought
back up, so one test's fault never leaks into the next. The flow is the fault suite's mixed
flow (tests/faults/conftest.py: two lanes, good, repairable and quarantined messages, each
counted by id), declared on quorum queues: staging (with a delivery limit), target and
quarantine. ``ACEMQ_CLUSTER_MESSAGES`` sets its size (both lanes together).

Every test's numbers are printed and summarised at the end of the run, and written as JSON
lines to ``ACEMQ_CLUSTER_REPORT`` when that is set, for docs/scaling.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from sidecar.broker import BrokerAddress
from tests.brokers import broker_root
from tests.cluster.nodes import Cluster, three_node_cluster
from tests.e2e.conftest import Sidecar, eventually
from tests.faults.conftest import (
    FaultRecord,
    Lane,
    MixedFlow,
    declare_quarantine_exchange,
    declare_target,
    recorder,
    scrape,
    summarise,
)
from tests.support import Broker, open_broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from tests.cluster.nodes import Node

# Both lanes together; each test publishes this many (docs/scaling.md has the timings).
MESSAGES = int(os.environ.get("ACEMQ_CLUSTER_MESSAGES", "20000"))
PER_LANE = MESSAGES // 2
PREFETCH = 100
ROUTES = 2
DELIVERY_LIMIT = 20  # the staging queues' x-delivery-limit: a fault must never spend it
COMPLETE_TIMEOUT_S = 180.0
RECOVERY_TIMEOUT_S = 60.0
GRACE_S = 10.0
EXIT_MARGIN_S = 5.0
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="package")
def cluster(broker_version: str) -> Iterator[Cluster]:
    """The three-node cluster of the version, started once and stopped after its last test.

    ``local``: the machine's packages; 4.x: its root (tests/brokers.py). Skipped where
    RabbitMQ or the root is not there (failed in CI, where it must be).
    Part of the README's test command (about 6 minutes on the 2-core machine, the start
    included). ``ACEMQ_CLUSTER_TESTS=0`` skips it, for a quick local run; CI never sets it.
    """
    if os.environ.get("ACEMQ_CLUSTER_TESTS") == "0":
        pytest.skip("ACEMQ_CLUSTER_TESTS=0: the three-node cluster suite is skipped")
    with three_node_cluster(root=broker_root(broker_version)) as running:
        yield running


def heal(cluster: Cluster) -> None:
    """Start any node a test took down, and wait until all three run and see each other."""
    down = [node for node in cluster.nodes if node.taken_down]
    for node in down:
        node.start()
    for node in down:
        node.await_up()
    if down:
        cluster.wait_all_running()


@pytest.fixture(autouse=True)
def _heal(cluster: Cluster) -> None:
    """Before each test, start any node an earlier test left down (see ``client``)."""
    heal(cluster)


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Broker]:
    """A test client on c1 (it declares, so c1 leads the quorum queues it makes).

    At the end the cluster is healed before the client deletes its queues: deleting a
    quorum queue with a member down waits for it (25 s for a flow's queues, measured).
    """
    async with open_broker(cluster.nodes[0].url) as broker:
        yield broker
        await asyncio.to_thread(heal, cluster)


async def move_client(broker: Broker, node: Node) -> None:
    """Point the test client at another node (its names are still cleaned up at the end)."""
    broker.url = node.url
    await broker.reconnect()


async def declare_quorum_flow(
    broker: Broker, *, staging_arguments: dict[str, Any] | None = None
) -> MixedFlow:
    """The mixed flow of tests/faults, every queue a quorum queue, staging with a delivery limit.

    ``staging_arguments`` go on both staging queues too (x-single-active-consumer, say).
    """
    quarantine = broker.name("quarantine")
    quarantined = await broker.queue("quarantined", **QUORUM)
    await declare_quarantine_exchange(broker, quarantine, quarantined)
    declared = []
    for name, publishers in (("orders", "acemq"), ("invoices", "apps")):
        staging = await broker.queue(
            f"{name}.staging",
            **QUORUM,
            **({"x-delivery-limit": DELIVERY_LIMIT} if DELIVERY_LIMIT else {}),
            **(staging_arguments or {}),
        )
        staging_exchange = await broker.exchange(f"{name}.stage")
        await broker.bind(staging, staging_exchange, "#")
        lane = Lane(
            name=name,
            publishers=publishers,
            staging=staging,
            staging_exchange=staging_exchange,
            exchange=broker.name(f"{name}.exchange"),
            target=await broker.queue(f"{name}.target", **QUORUM),
        )
        await declare_target(broker, lane)
        declared.append(lane)
    return MixedFlow(broker, tuple(declared), quarantine, quarantined)


@pytest.fixture
async def flow(client: Broker) -> MixedFlow:
    """A declared quorum mixed flow (nothing published yet)."""
    return await declare_quorum_flow(client)


@dataclass
class Replicas:
    """Sidecar processes on one route map, each with every node's URL (shuffled per process)."""

    cluster: Cluster
    workdir: Path
    started: list[Sidecar]

    def new(self, flow: MixedFlow, *, urls: list[str] | None = None, **route: Any) -> Sidecar:
        """Write a route map for ``flow`` on the cluster and return an unstarted sidecar."""
        index = len(self.started) + 1
        workdir = self.workdir / f"replica-{index}"
        workdir.mkdir()
        sidecar = Sidecar(amqp_url=self.cluster.urls[0], workdir=workdir)
        route_map = flow.route_map(sidecar, prefetch=PREFETCH, shutdown_grace_s=GRACE_S)
        del route_map["broker"]["url"]
        route_map["broker"]["urls"] = urls or self.cluster.urls
        for entry in route_map["routes"]:
            entry.update(route)
        sidecar.write(route_map)
        self.started.append(sidecar)
        return sidecar

    def output(self) -> str:
        """Every replica's output, for a failure message."""
        return "\n".join(f"=== replica {i + 1}\n{s.output()}" for i, s in enumerate(self.started))


@pytest.fixture
async def replicas(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Sidecar replicas for the test, killed at teardown whatever happened."""
    made = Replicas(cluster, tmp_path, [])
    try:
        yield made
    finally:
        for sidecar in made.started:
            await sidecar.kill()


async def node_of(sidecar: Sidecar, cluster: Cluster) -> Node:
    """The node the sidecar says (on /readyz) it is connected to."""
    status, body = await sidecar.get("/readyz")
    assert status == 200, f"/readyz {status}: {body}\n{sidecar.output()}"
    return cluster.node(BrokerAddress.parse(json.loads(body)["node"]).endpoint)


async def wait_ready_on(
    sidecar: Sidecar,
    flow: MixedFlow,
    cluster: Cluster,
    *,
    not_on: Node | None = None,
    reconnects: float = 0,
    timeout_s: float = RECOVERY_TIMEOUT_S,
) -> tuple[Node, float]:
    """Wait for /readyz 200 on a node other than ``not_on``, every route up; return it and when."""
    last: list[str] = []

    async def ready() -> bool:
        assert sidecar.is_running(), f"the sidecar died\n{sidecar.output()}"
        status, body = await sidecar.get("/readyz")
        last[:] = [f"/readyz {status}: {body}"]
        if status != 200:
            return False
        node = BrokerAddress.parse(json.loads(body)["node"]).endpoint
        metrics = await scrape(sidecar)
        return (
            (not_on is None or node != not_on.endpoint)
            and metrics.value("acemq_sidecar_reconnects_total") >= reconnects
            and all(
                metrics.value("acemq_sidecar_route_up", route=lane.name) == 1 for lane in flow.lanes
            )
        )

    await eventually(
        ready,
        timeout_s=timeout_s,
        what=f"ready on a node other than {not_on.name if not_on else '-'}",
        context=lambda: "\n".join([*last, sidecar.output()]),
    )
    return await node_of(sidecar, cluster), time.monotonic()


async def wait_progress(flow: MixedFlow, *, more: int, context: Callable[[], str]) -> None:
    """Wait until ``more`` further copies arrived downstream: the flow is moving."""
    goal = await flow.downstream() + more

    async def moved() -> bool:
        return await flow.downstream() >= goal

    await eventually(moved, timeout_s=60, what=f"{goal} copies downstream", context=context)


async def wait_flowing(flow: MixedFlow, *, since: int, context: Callable[[], str]) -> float:
    """Wait until copies arrive downstream again (past ``since``) or staging is empty.

    Return when (``time.monotonic()``): the moment the relay had resumed.
    """

    async def flowing() -> bool:
        return await flow.downstream() > since or await flow.staging_depth() == 0

    await eventually(flowing, timeout_s=RECOVERY_TIMEOUT_S, what="copies flowing", context=context)
    return time.monotonic()


async def left_in_staging(flow: MixedFlow, *, fault: str) -> int:
    """Assert the fault hit mid-flow: messages were left in staging. Return how many."""
    depth = await flow.staging_depth()
    assert depth > 0, f"{fault} came after the flow had finished: nothing proven"
    return depth


# --- the numbers for docs/scaling.md ---------------------------------------------------------

RECORDS = pytest.StashKey[list[FaultRecord]]()


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., FaultRecord]:
    """Record (print, keep for the summary, append to ACEMQ_CLUSTER_REPORT) a test's numbers."""
    return recorder(request, RECORDS, report="ACEMQ_CLUSTER_REPORT")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print every cluster test's numbers at the end of the run."""
    summarise(terminalreporter, config, RECORDS, title="cluster test numbers")
