"""A partition inside a three-node cluster, made by the network: one node cut from its peers.

Each node runs in a test host of its own (``tests/faults/netns.py``: ``net_hosts``); the
nodes talk across a bridge the hosts share, their clients across each host's own link.
Cutting a host's bridge link parts its node from the other two while the sidecar still
reaches it. The cluster handles partitions with ``pause_minority``: the lone node pauses
(it closes its client connections) until it sees a majority again. The flow is the fault
suite's mixed flow on quorum queues (staging with a delivery limit), counted by id.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

import aiormq
import pytest

from tests.cluster.conftest import declare_quorum_flow, node_of, wait_ready_on
from tests.cluster.nodes import three_node_cluster
from tests.e2e.conftest import Sidecar
from tests.faults.netns import net_hosts
from tests.faults.test_faults import finish, left_in_staging, wait_progress
from tests.support import open_broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from tests.cluster.nodes import Cluster, Node
    from tests.faults.conftest import FaultRecord
    from tests.faults.netns import NetHost

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the cluster starts in the first

PER_LANE = int(os.environ.get("ACEMQ_PARTITION_PER_LANE", "10000"))
# A node counted as running again may take a moment more to listen for clients (its
# listeners start after the rabbit app): a client waits for it up to this long.
LISTENING_TIMEOUT_S = 60.0
# A paused node that sees its peers again resumes in seconds; in some CI runs RabbitMQ left
# the parted node paused for good (its peers never counted it again in 240 s). Past this
# the test restarts it, as an operator would, and says so in its record: the relay's books
# are what the test checks, the broker's own recovery is not.
REJOIN_S = 60.0
PREFETCH = 100  # the fault suite's: finish() bounds the duplicates by it


@pytest.fixture(scope="module")
def parted() -> Iterator[tuple[Cluster, tuple[NetHost, ...]]]:
    """Three nodes, each in a test host of its own, joined in one cluster."""
    with net_hosts("p", count=3) as hosts, three_node_cluster(hosts) as cluster:
        yield cluster, hosts


@pytest.fixture
async def sidecar(
    parted: tuple[Cluster, tuple[NetHost, ...]], tmp_path: Path
) -> AsyncIterator[Sidecar]:
    """A sidecar process given every node; killed at teardown whatever happened."""
    process = Sidecar(amqp_url=parted[0].nodes[0].url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


async def wait_listening(cluster: Cluster) -> None:
    """Return once every node takes a client connection (the last test may have parted one)."""
    cluster.wait_all_running()
    deadline = time.monotonic() + LISTENING_TIMEOUT_S
    for node in cluster.nodes:
        while True:
            try:
                connection = await aiormq.connect(node.url)
            except (aiormq.exceptions.AMQPError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
                continue
            await connection.close()
            break


def rejoin(cluster: Cluster, node: Node) -> str:
    """Wait until the parted ``node`` runs again; restart it if it stays paused. Say which."""
    deadline = time.monotonic() + REJOIN_S
    while time.monotonic() < deadline:
        if node.name in cluster.running():
            return "it rejoined by itself"
        time.sleep(0.5)
    node.stop()
    node.start()
    node.await_up()
    cluster.wait_all_running()
    return f"it was still paused {REJOIN_S:g} s after the mend and was restarted"


@pytest.mark.parametrize("whose", ["the sidecar's node", "another node"])
async def test_a_node_cut_from_its_peers_mid_flow_loses_nothing(
    parted: tuple[Cluster, tuple[NetHost, ...]],
    sidecar: Sidecar,
    record: Callable[..., FaultRecord],
    whose: str,
) -> None:
    """A node parted from the other two under a flow, then joined again.

    The sidecar's own node pauses (pause_minority) and closes its connections: the sidecar
    goes on on a node of the majority. Another node's loss moves the quorum leaders it held.
    Either way nothing is lost or misplaced; the node rejoins once the link is back (or is
    restarted if RabbitMQ leaves it paused: REJOIN_S, said in the record).
    """
    cluster, hosts = parted
    await wait_listening(cluster)
    async with open_broker(cluster.nodes[1].url) as client:
        flow = await declare_quorum_flow(client)
        await flow.publish(PER_LANE)
        routes = flow.route_map(sidecar, prefetch=PREFETCH)
        del routes["broker"]["url"]
        routes["broker"]["urls"] = cluster.urls
        sidecar.write(routes)
        await sidecar.start()
        await wait_progress(flow, sidecar)
        used = await node_of(sidecar, cluster)
        cut_node = used if whose == "the sidecar's node" else cluster.others(used)[0]
        host = hosts[cluster.nodes.index(cut_node)]
        assert host.peer is not None
        if cut_node is cluster.nodes[1]:  # the client's node: it pauses too
            client.url = cluster.others(cut_node)[0].url
            await client.reconnect()
        # Counted before the cut: a queue whose leader is parted may count nothing meanwhile.
        left = await left_in_staging(flow, fault="the partition")
        host.peer.cut()
        cut = time.monotonic()
        try:
            if cut_node is used:
                _, ready = await wait_ready_on(sidecar, flow, cluster, not_on=used, reconnects=1)
                recovery = [ready - cut]
            else:
                recovery = []
        finally:
            host.peer.mend()
        rejoined = await asyncio.to_thread(rejoin, cluster, cut_node)
        await wait_listening(cluster)
        await finish(
            flow,
            sidecar,
            record,
            faults=1,
            recovery_s=recovery,
            note=f"{cut_node.name} ({whose}) parted with {left} left in staging; {rejoined};"
            " recovery: the cut until ready on another node",
        )
