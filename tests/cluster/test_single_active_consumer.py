"""single_active_consumer: replicas take turns on a queue, and its order survives a failover.

The platform declares the staging queue with ``x-single-active-consumer: true`` (a quorum
queue here); every replica consumes it, the broker delivers to one at a time. When the
active replica is killed, the broker returns its unacked deliveries and makes another
replica active, which relays them before anything newer. So each target queue holds the
messages in the order they were published: the first copy of each id comes in order, and
the only step back is the one failover's re-run of what the killed replica had in flight
(a duplicate, with the same id).
"""

from __future__ import annotations

import itertools
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
    QUORUM,
    ROUTES,
    declare_quorum_flow,
    wait_flowing,
    wait_progress,
)
from tests.faults.conftest import Fate, scrape

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.cluster.conftest import Replicas
    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import FaultRecord, MixedFlow
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SAC = {"x-single-active-consumer": True}
PROGRESS = 500


def order_of(flow: MixedFlow, lane: str) -> list[int]:
    """The publish index of every copy in a lane's target queue, in the queue's order."""
    return [
        int(copy.id.rpartition("-")[2])
        for copy in flow.copies
        if copy.place is Fate.TARGET and flow.lane_of[copy.id] == lane
    ]


def first_copies(order: list[int]) -> list[int]:
    """The order with every repeat of an index dropped: what an idempotent consumer sees."""
    return list(dict.fromkeys(order))


def steps_back(order: list[int]) -> int:
    """How often the order goes back: once per failover re-run at most."""
    return sum(1 for before, after in itertools.pairwise(order) if after < before)


async def active(sidecars: list[Sidecar], route: str) -> Sidecar:
    """The replica relaying ``route`` now: the one whose count for it grows."""
    before = [await _count(sidecar, route) for sidecar in sidecars]
    grew: list[Sidecar] = []
    deadline = time.monotonic() + 30
    while not grew and time.monotonic() < deadline:
        after = [await _count(sidecar, route) for sidecar in sidecars]
        grew = [s for s, b, a in zip(sidecars, before, after, strict=True) if a > b]
    assert len(grew) == 1, f"{len(grew)} replicas relayed {route} at once, not one"
    return grew[0]


async def _count(sidecar: Sidecar, route: str) -> float:
    return (await scrape(sidecar)).value("acemq_sidecar_messages_total", route=route)


async def test_order_survives_the_loss_of_the_active_replica(
    client: Broker,
    replicas: Replicas,
    record: Callable[..., FaultRecord],
) -> None:
    """Three replicas on single-active-consumer queues; the active one is killed mid-flow."""
    flow = await declare_quorum_flow(client, staging_arguments=SAC)
    await flow.publish(PER_LANE)
    sidecars = [replicas.new(flow) for _ in range(3)]
    for sidecar in sidecars:
        await sidecar.start()
    await wait_progress(flow, more=PROGRESS, context=replicas.output)
    victim = await active(sidecars, "orders")
    left = await flow.staging_depth()
    assert left > 0, "the flow had finished before the kill: nothing proven"
    before = await flow.downstream()
    victim.send(signal.SIGKILL)
    assert await victim.wait_exit(timeout_s=EXIT_MARGIN_S) == -signal.SIGKILL
    killed = time.monotonic()
    resumed = await wait_flowing(flow, since=before, context=replicas.output) - killed
    survivors = [sidecar for sidecar in sidecars if sidecar is not victim]
    successor = await active(survivors, "orders")

    await flow.wait_complete(timeout_s=COMPLETE_TIMEOUT_S, context=replicas.output)
    for sidecar in survivors:
        sidecar.send(signal.SIGTERM)
    for sidecar in survivors:
        assert await sidecar.wait_exit(timeout_s=GRACE_S + EXIT_MARGIN_S) == 0, sidecar.output()
    await flow.collect()
    bound = PREFETCH * ROUTES
    duplicates = flow.check(max_duplicates=bound, context=replicas.output)
    back = {}
    for lane in flow.lanes:
        order = order_of(flow, lane.name)
        firsts = first_copies(order)
        if firsts != sorted(firsts):
            wrong = next(i for i, (a, b) in enumerate(itertools.pairwise(firsts)) if b < a)
            at = order.index(firsts[wrong + 1])
            pytest.fail(
                f"{lane.name}: out of order at copy {at} of {len(order)}:"
                f" {order[max(0, at - 120) : at + 40]}\n{replicas.output()}"
            )
        back[lane.name] = steps_back(order)
        assert back[lane.name] <= 1, f"{lane.name}: {back[lane.name]} steps back, not <= 1"
    record(
        messages=flow.published,
        faults=1,
        duplicates=duplicates,
        duplicate_bound=bound,
        recovery_s=(resumed,),
        note=(
            f"active replica {sidecars.index(victim) + 1} killed with {left} left, replica"
            f" {sidecars.index(successor) + 1} took over; target order kept, steps back {back}"
            f"; staging queues {QUORUM | SAC}"
        ),
    )
