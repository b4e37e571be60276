"""Memory by bytes, not by message count: 5 MiB messages under broker.max_in_flight_bytes.

Issue 17.4: 200 messages of 5 MiB at the default prefetch 512 peaked at 2,048 MiB (the
broker sends a whole prefetch window at once; RabbitMQ ignores basic.qos prefetch_size).
The sidecar's window (``sidecar.settlement.in_flight_window``) keeps the bodies in flight
within the budget; this reads the process's peak RSS (``VmHWM`` in /proc) after a drain.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import (
    ID_HEADER,
    Sidecar,
    declare_flow,
    declare_quarantine,
    make_ids,
    take_until,
)
from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MIB = 2**20
MESSAGES = 40  # 200 MiB through the shared broker: enough to see 512 in flight or not
BODY = 5 * MIB
BUDGET = 16 * MIB
# What the sidecar costs with nothing in flight (about 45 MiB), with room; and each body
# in flight is held about twice (the delivery and its copy's frames).
OVERHEAD_MIB = 100
BOUND_MIB = 2 * BUDGET / MIB + OVERHEAD_MIB


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size so far (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.mark.xfail(
    strict=True,
    reason="a window the byte budget learns reaches only the route's next channel: the client"
    " cannot change a running consumer's prefetch on every queue type (a per-consumer"
    " basic.qos applies to later consumers, a channel-wide one closes the connection on a"
    " quorum queue); applying it at once needs a re-consume (docs/decisions/0001, open item 5)",
)
async def test_large_messages_stay_within_the_byte_budget(broker: Broker, sidecar: Sidecar) -> None:
    """40 x 5 MiB at prefetch 512 and a 16 MiB budget: peak RSS under 2 x budget + 100 MiB."""
    flow = await declare_flow(broker, "big")
    quarantine, _ = await declare_quarantine(broker)
    ids = make_ids("big", MESSAGES)
    for id_ in ids:
        await broker.publish(
            flow.staging, headers={ID_HEADER: id_}, message_id=id_, body=b"x" * BODY
        )
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=512)
    route_map["broker"]["max_in_flight_bytes"] = BUDGET
    sidecar.write(route_map)
    await sidecar.start()
    relayed = await take_until(broker, flow.target, ids, timeout_s=120, context=sidecar.output)
    assert sidecar.process is not None
    peak = peak_rss_mib(sidecar.process.pid)
    print(f"\nmemory budget: peak RSS {peak:.0f} MiB for {MESSAGES} x 5 MiB, bound {BOUND_MIB:.0f}")  # noqa: T201
    assert sorted(set(relayed)) == ids
    assert peak < BOUND_MIB, f"peak RSS {peak:.0f} MiB, bound {BOUND_MIB:.0f} MiB"
