"""Memory a bound: peak RSS within the process's baseline + the byte budget + about one body.

On a private node (hundreds of MiB go through it, and a body of 120 MiB): the process's
peak resident set (``VmHWM`` in /proc) once it is ready with nothing to relay is its
baseline; after each flow the peak must stay within baseline + ``max_in_flight_bytes``
+ the largest body + ``SLACK_MIB``. The route's window follows the bodies it sees
(``sidecar.flow.window``), and what a window sent before a larger body arrived is not read
while the route's deliveries hold the budget (the consuming connection stops reading,
``sidecar.amqp.channel``); a body is held once. The numbers are printed for
docs/memory.md.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.brokers import module_node
from tests.e2e.conftest import (
    ID_HEADER,
    Sidecar,
    declare_flow,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_until,
)
from tests.faults.private_node import PrivateNode
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MIB = 2**20
BUDGET = 64 * MIB  # the default broker.max_in_flight_bytes
# Beyond baseline + budget + one body: the reads and writes in flight (a read is at most
# 256 KiB, the socket's write buffer 1 MiB), a body frame being copied, and the
# allocator's slack after hundreds of MiB went through it.
SLACK_MIB = 24
NODE_CONF = f"max_message_size = {128 * MIB}\n"


@pytest.fixture(scope="module")
def node(broker_version: str) -> Iterator[PrivateNode]:
    """A RabbitMQ node of the version for this module alone, taking bodies up to 128 MiB.

    128 MiB is 3.x's default max_message_size; 4.0 lowered the default to 16 MiB.
    """
    with module_node(broker_version, "memory", conf=NODE_CONF) as started:
        yield started


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size so far (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


async def relay_and_measure(
    nb: Broker,
    sidecar: Sidecar,
    *,
    name: str,
    small: int,
    bodies: list[int],
    prefetch: int = 512,
) -> dict[str, float]:
    """Relay ``small`` x 1 KiB, then one message per size in ``bodies``; return the numbers."""
    flow = await declare_flow(nb, name)
    quarantine, _ = await declare_quarantine(nb)
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=prefetch)
    route_map["broker"]["max_in_flight_bytes"] = BUDGET
    sidecar.write(route_map)
    await sidecar.start()
    assert sidecar.process is not None
    baseline = peak_rss_mib(sidecar.process.pid)
    small_ids = make_ids(f"{name}.small", small)
    await publish_ids(nb, flow.staging, small_ids)
    large_ids = make_ids(f"{name}.large", len(bodies))
    for id_, size in zip(large_ids, bodies, strict=True):
        await nb.publish(flow.staging, headers={ID_HEADER: id_}, message_id=id_, body=bytes(size))
    relayed = await take_until(
        nb, flow.target, small_ids + large_ids, timeout_s=400, context=sidecar.output
    )
    assert sorted(set(relayed)) == sorted(small_ids + large_ids)
    peak = peak_rss_mib(sidecar.process.pid)
    largest = max(bodies) / MIB
    numbers = {
        "baseline_mib": round(baseline),
        "peak_mib": round(peak),
        "budget_mib": BUDGET / MIB,
        "largest_body_mib": round(largest, 1),
        "bound_mib": round(baseline + BUDGET / MIB + largest + SLACK_MIB),
    }
    print(f"\nmemory: {json.dumps({'flow': name, **numbers})}")  # noqa: T201
    return numbers


@pytest.mark.parametrize("large", [100, 150])
async def test_a_backlog_of_small_then_large_bodies_stays_within_the_bound(
    nb: Broker, sidecar_on_node: Sidecar, large: int
) -> None:
    """3,000 x 1 KiB grow the window to 512; then 5 MiB bodies arrive a window at a time."""
    numbers = await relay_and_measure(
        nb, sidecar_on_node, name=f"backlog{large}", small=3000, bodies=[5 * MIB] * large
    )
    assert numbers["peak_mib"] <= numbers["bound_mib"], numbers


@pytest.mark.parametrize("size_mib", [64, 100, 120])
async def test_a_single_large_body_is_held_once(
    nb: Broker, sidecar_on_node: Sidecar, size_mib: int
) -> None:
    numbers = await relay_and_measure(
        nb, sidecar_on_node, name=f"single{size_mib}", small=10, bodies=[size_mib * MIB]
    )
    assert numbers["peak_mib"] <= numbers["bound_mib"], numbers


MAX_BODY = 2 * MIB  # the route map's broker.max_body_bytes in the test below
# What passing a body through may cost beyond the baseline: a read, the publishing
# socket's write buffer, a frame being copied, and the allocator's slack.
PASSING_SLACK_MIB = 24


async def test_a_body_over_max_body_bytes_passes_through_to_quarantine_unheld(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """120 MiB with max_body_bytes at 2 MiB: quarantined whole, the peak far below 120 MiB.

    The bodies under the limit are relayed as before, on either side of it.
    """
    flow = await declare_flow(nb, "passing")
    quarantine, quarantine_queue = await declare_quarantine(nb)
    route_map = sidecar_on_node.route_map(quarantine=quarantine, flows=[flow], prefetch=64)
    route_map["broker"]["max_body_bytes"] = MAX_BODY
    sidecar_on_node.write(route_map)
    await sidecar_on_node.start()
    assert sidecar_on_node.process is not None
    pid = sidecar_on_node.process.pid
    baseline = peak_rss_mib(pid)
    before, after = make_ids("passing.before", 20), make_ids("passing.after", 20)
    await publish_ids(nb, flow.staging, before)
    large = random.Random(7).randbytes(120 * MIB)
    await nb.publish(
        flow.staging, headers={ID_HEADER: "passing.large"}, message_id="passing.large", body=large
    )
    under = bytes(MAX_BODY)  # at the limit: held and relayed
    await nb.publish(
        flow.staging, headers={ID_HEADER: "passing.under"}, message_id="passing.under", body=under
    )
    await publish_ids(nb, flow.staging, after)
    relayed = await take_until(
        nb,
        flow.target,
        [*before, "passing.under", *after],
        timeout_s=300,
        context=sidecar_on_node.output,
    )
    assert "passing.large" not in relayed
    (copy,) = await nb.take(quarantine_queue, 1, timeout_s=120)
    assert hashlib.sha256(copy.body).digest() == hashlib.sha256(large).digest()
    headers = copy.header.properties.headers or {}
    assert headers[ID_HEADER] == "passing.large"
    reason = str(headers["x-acemq-error"])
    assert f"body too large to hold: {120 * MIB} bytes" in reason, reason
    peak = peak_rss_mib(pid)
    numbers = {"baseline_mib": round(baseline), "peak_mib": round(peak), "body_mib": 120}
    print(f"\nmemory: {json.dumps({'flow': 'passing', **numbers})}")  # noqa: T201
    assert peak <= baseline + MAX_BODY / MIB + PASSING_SLACK_MIB, numbers
    # Every delivery was acked: stopped, the sidecar gives nothing back to staging.
    await sidecar_on_node.kill()
    await eventually(lambda: staging_empty(nb, flow.staging), timeout_s=30, what="staging empty")


async def staging_empty(nb: Broker, queue: str) -> bool:
    return await nb.depth(queue) == 0
