"""Node faults on a three-node cluster during a mixed flow on quorum queues: nothing lost.

Each test publishes the mixed flow (good, repairable and quarantined messages on two
routes, each with an id), starts the sidecar with every node's URL, breaks a node while
the backlog is being relayed, and then counts every id: each is in its target queue or in
quarantine as its plan says (lost 0, misplaced 0), staging is empty, and the duplicates
are at most what was in flight at the faults (prefetch x routes per fault that took the
sidecar's connection), each with the same x-acemq-id. The numbers are recorded for
docs/scaling.md.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING

import pytest

from tests.cluster.conftest import (
    COMPLETE_TIMEOUT_S,
    EXIT_MARGIN_S,
    GRACE_S,
    PER_LANE,
    PREFETCH,
    RECOVERY_TIMEOUT_S,
    ROUTES,
    move_client,
    node_of,
    wait_flowing,
    wait_progress,
    wait_ready_on,
)
from tests.e2e.conftest import eventually
from tests.faults.conftest import Fate, scrape, wait_nothing_in_flight

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.cluster.conftest import Replicas
    from tests.cluster.nodes import Cluster
    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import FaultRecord, MixedFlow
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

IN_FLIGHT_BOUND = PREFETCH * ROUTES  # what one lost connection can leave confirmed, unacked
PROGRESS = 500  # copies downstream before a fault, so that it lands mid-flow


async def finish(
    flow: MixedFlow,
    sidecars: list[Sidecar],
    record: Callable[..., FaultRecord],
    *,
    faults: int,
    bound: int,
    recovery_s: list[float],
    note: str,
) -> int:
    """Relay to the end, stop cleanly, check the books by id, record the numbers."""

    def context() -> str:
        return "\n".join(sidecar.output() for sidecar in sidecars)

    await flow.wait_complete(timeout_s=COMPLETE_TIMEOUT_S, context=context)

    async def staging_empty() -> bool:
        return await flow.staging_depth() == 0

    # What a killed node's consumer held goes back to the queue when the queue lets go of
    # that consumer, which on 4.3 can come after every copy is counted downstream (their
    # copies were confirmed, their acks lost with the node): relayed again (duplicates,
    # within the bound) before the stop. A message that never comes back still fails here.
    await eventually(
        staging_empty, timeout_s=RECOVERY_TIMEOUT_S, what="staging empty", context=context
    )
    for sidecar in sidecars:
        await wait_nothing_in_flight(sidecar, flow, context=context)
        sidecar.send(signal.SIGTERM)
    for sidecar in sidecars:
        status = await sidecar.wait_exit(timeout_s=GRACE_S + EXIT_MARGIN_S)
        assert status == 0, f"exit status {status} after SIGTERM\n{sidecar.output()}"
    await flow.collect()
    assert await flow.staging_depth() == 0
    duplicates = flow.check(max_duplicates=bound, context=context)
    record(
        messages=flow.published,
        faults=faults,
        duplicates=duplicates,
        duplicate_bound=bound,
        recovery_s=tuple(recovery_s),
        note=note,
    )
    return duplicates


@pytest.mark.version_changed("4.3")
async def test_kill_9_of_the_node_the_sidecar_uses_resumes_on_another(
    cluster: Cluster,
    client: Broker,
    flow: MixedFlow,
    replicas: Replicas,
    record: Callable[..., FaultRecord],
) -> None:
    """kill -9 of the sidecar's node mid-flow: it resumes on another node by itself."""
    await flow.publish(PER_LANE)
    sidecar = replicas.new(flow)
    await sidecar.start()
    node = await node_of(sidecar, cluster)
    await move_client(client, cluster.others(node)[0])
    await wait_progress(flow, more=PROGRESS, context=sidecar.output)
    left = await flow.staging_depth()
    assert left > 0, "the flow had finished before the kill: nothing proven"
    killed = time.monotonic()
    await asyncio.to_thread(node.kill)
    before = await flow.downstream()
    moved_to, ready = await wait_ready_on(sidecar, flow, cluster, not_on=node, reconnects=1)
    flowing = await wait_flowing(flow, since=before, context=sidecar.output)
    assert moved_to is not node
    # The node stays down to the end. A channel whose first publish to a quorum queue
    # came during its leader election can be nacked for as long as the node is down
    # (RabbitMQ 3.10, docs/scaling.md): the relay retries a nacked copy on a new channel,
    # so the flow finishes without the node.
    await finish(
        flow,
        [sidecar],
        record,
        faults=1,
        bound=IN_FLIGHT_BOUND,
        recovery_s=[ready - killed, flowing - killed],
        note=(
            f"{node.name} killed with {left} left in staging; resumed on {moved_to.name}"
            " (recovery: ready, then copies flowing again); the node stayed down to the end"
        ),
    )


async def test_a_rolling_restart_of_all_three_nodes_loses_nothing(
    cluster: Cluster,
    client: Broker,
    flow: MixedFlow,
    replicas: Replicas,
    record: Callable[..., FaultRecord],
) -> None:
    """Each node stopped and started in turn under flow, as an upgrade does."""
    batch = PER_LANE // 3
    sidecar = replicas.new(flow)
    await sidecar.start()
    recovery: list[float] = []
    lost_connection = 0
    notes = []
    for node in cluster.nodes:
        await move_client(client, cluster.others(node)[0])
        used = await node_of(sidecar, cluster)
        # A backlog for this restart: the sidecar, held still while it is published and
        # until the node stops taking connections, would drain it first otherwise (a
        # stop takes seconds; the backlog, under one on this machine). It relays on
        # through the rest of the node's stop.
        sidecar.send(signal.SIGSTOP)
        try:
            await flow.publish(batch)
            stopping = asyncio.create_task(asyncio.to_thread(node.stop), name=f"stop {node.name}")
            await refusing_connections(node.amqp_port, timeout_s=30.0)
            stopped = time.monotonic()
        finally:
            sidecar.send(signal.SIGCONT)
        # Whether the node was still stopping when the flow resumed is the machine's timing
        # (a loaded one may finish the stop first): the note says which, the checks hold
        # for both.
        resumed_during_stop = not stopping.done()
        await stopping
        left = await flow.staging_depth()  # of the backlog, once the node is down
        if used is node:
            lost_connection += 1
        before = await flow.downstream()
        await wait_ready_on(sidecar, flow, cluster, not_on=node)
        recovery.append(await wait_flowing(flow, since=before, context=sidecar.output) - stopped)
        await asyncio.to_thread(node.start)
        await asyncio.to_thread(node.await_up)
        await asyncio.to_thread(cluster.wait_all_running)
        during = "resumed while it stopped" if resumed_during_stop else "resumed after its stop"
        notes.append(f"{node.name}{' (in use)' if used is node else ''}: {left} left, {during}")
    metrics = await scrape(sidecar)
    assert metrics.value("acemq_sidecar_reconnects_total") >= lost_connection, metrics.text
    await finish(
        flow,
        [sidecar],
        record,
        faults=3,
        bound=max(1, lost_connection) * IN_FLIGHT_BOUND,
        recovery_s=recovery,
        note="; ".join(notes) + "; recovery: the stop until copies flow again",
    )


async def refusing_connections(port: int, *, timeout_s: float) -> None:
    """Return once nothing listens on ``port`` (a stopping node closed it), or at the bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("how", ["stop", "kill -9"])
async def test_losing_the_staging_queues_leader_moves_the_leader_and_loses_nothing(  # noqa: PLR0917 - fixtures
    cluster: Cluster,
    client: Broker,
    flow: MixedFlow,
    replicas: Replicas,
    record: Callable[..., FaultRecord],
    how: str,
) -> None:
    """The node leading every queue of the flow stops or dies: followers take over.

    The sidecar is given the other two nodes only, so what this proves is the quorum
    leaders moving under a connection that stays up, not a reconnect. A graceful stop hands
    leadership over: no copy is sent twice. A kill leaves the target queues electing while
    copies are published to them; RabbitMQ 3.10 may nack those copies, on that channel,
    for as long as the node is down (docs/scaling.md): the flow must still finish without
    the node, its duplicates within the window.
    """
    leader = cluster.leader(flow.lanes[0].staging)
    assert all(cluster.leader(lane.staging) is leader for lane in flow.lanes)
    followers = cluster.others(leader)
    await move_client(client, followers[0])
    await flow.publish(PER_LANE)
    sidecar = replicas.new(flow, urls=[node.url for node in followers])
    await sidecar.start()
    await wait_progress(flow, more=PROGRESS, context=sidecar.output)
    left = await flow.staging_depth()
    assert left > 0, "the flow had finished before the leader stopped: nothing proven"
    stopped = time.monotonic()
    await asyncio.to_thread(leader.stop if how == "stop" else leader.kill)
    before = await flow.downstream()
    resumed = await wait_flowing(flow, since=before, context=sidecar.output) - stopped
    new_leaders = {cluster.leader(lane.staging).name for lane in flow.lanes}
    assert leader.name not in new_leaders
    reconnects = (await scrape(sidecar)).value("acemq_sidecar_reconnects_total")
    assert reconnects == 0, f"{reconnects:g} reconnects: the connection should have stayed up"
    # The connection stays up, so a copy is never sent twice: a publish that waits for its
    # confirm through the election (about 3 s) must not be given up on and sent again.
    await finish(
        flow,
        [sidecar],
        record,
        faults=1,
        bound=0 if how == "stop" else IN_FLIGHT_BOUND,
        recovery_s=[resumed],
        note=(
            f"leader {leader.name} ({how}) with {left} left; new leaders {sorted(new_leaders)};"
            f" reconnects {reconnects:g}; recovery: stop until copies flow"
        ),
    )


async def test_three_replicas_compete_and_one_killed_loses_nothing(
    cluster: Cluster,
    client: Broker,
    flow: MixedFlow,
    replicas: Replicas,
    record: Callable[..., FaultRecord],
) -> None:
    """Three sidecar processes on the same routes; kill -9 of one leaves the other two."""
    await flow.publish(PER_LANE)
    sidecars = [replicas.new(flow) for _ in range(3)]
    for sidecar in sidecars:
        await sidecar.start()
    nodes = [(await node_of(sidecar, cluster)).name for sidecar in sidecars]
    await wait_progress(flow, more=PROGRESS, context=replicas.output)
    left = await flow.staging_depth()
    assert left > 0, "the flow had finished before the kill: nothing proven"
    victim, survivors = sidecars[1], [sidecars[0], sidecars[2]]
    victim.send(signal.SIGKILL)
    assert await victim.wait_exit(timeout_s=EXIT_MARGIN_S) == -signal.SIGKILL
    killed = time.monotonic()
    before = await flow.downstream()
    resumed = await wait_flowing(flow, since=before, context=replicas.output) - killed
    shares = []
    for sidecar in survivors:
        metrics = await scrape(sidecar)
        shares.append(int(metrics.value("acemq_sidecar_messages_total")))
    assert all(share > 0 for share in shares), f"a replica relayed nothing: {shares}"
    await finish(
        flow,
        survivors,
        record,
        faults=1,
        bound=IN_FLIGHT_BOUND,
        recovery_s=[resumed],
        note=(
            f"replicas on {nodes}; replica 2 killed with {left} left; the survivors settled"
            f" {shares} by the end of their run; recovery: kill until copies flow"
        ),
    )
    relayed = sum(1 for fate in flow.fates.values() if fate is Fate.TARGET)
    assert relayed > 0
