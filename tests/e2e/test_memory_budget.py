"""Memory by bytes, not by message count: 5 MiB messages under broker.max_in_flight_bytes.

Issue 17.4: 200 messages of 5 MiB at the default prefetch 512 peaked at 2,048 MiB (the
broker sends a whole prefetch window at once; RabbitMQ ignores basic.qos prefetch_size).
The route's window starts at one and follows the bodies it sees (``sidecar.window``,
changed by re-consuming: ``sidecar.route_consumer``), so the bodies in flight keep
within the budget; this reads the process's peak RSS (``VmHWM`` in /proc) after a drain.
A window that grew on small messages and then meets large ones can hold, once, up to the
old window of the large size before it shrinks: the second test measures that bound.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    ID_HEADER,
    Sidecar,
    declare_flow,
    declare_quarantine,
    make_ids,
    publish_ids,
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


SMALL = 2000
SHRINK_PREFETCH = 16
SHRINK_LARGE = 20


async def test_a_window_grown_on_small_messages_overshoots_at_most_once_for_large_ones(
    broker: Broker, sidecar: Sidecar
) -> None:
    """2000 x 1 KiB then 20 x 5 MiB, prefetch 16, 16 MiB: at most the old window x 5 MiB.

    The window the small ones grew takes what the broker sent before the first large
    header (at most that window of 5 MiB bodies); once it is at least half full it
    shrinks to two. A route that drains the large ones as fast as they come never fills
    it, and keeps it (the window is not what limits it then): either way peak RSS stays
    under the old window x 5 MiB, held twice, plus the sidecar itself.
    tests/integration/test_window.py makes the route slower than its broker, so that the
    shrink must come, and counts the bytes.
    """
    flow = await declare_flow(broker, "shrink")
    quarantine, _ = await declare_quarantine(broker)
    small, large = make_ids("small", SMALL), make_ids("large", SHRINK_LARGE)
    await publish_ids(broker, flow.staging, small)
    for id_ in large:
        await broker.publish(
            flow.staging, headers={ID_HEADER: id_}, message_id=id_, body=b"x" * BODY
        )
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=SHRINK_PREFETCH)
    route_map["broker"]["max_in_flight_bytes"] = BUDGET
    sidecar.write(route_map)
    await sidecar.start()
    relayed = await take_until(
        broker, flow.target, small + large, timeout_s=120, context=sidecar.output
    )
    assert sidecar.process is not None
    peak = peak_rss_mib(sidecar.process.pid)
    assert sorted(set(relayed)) == sorted(small + large)
    shrinks = re.findall(
        rf"window (\d+) -> (\d+) for bodies of up to {BODY} bytes", sidecar.stderr()
    )
    old = int(shrinks[0][0]) if shrinks else SHRINK_PREFETCH
    bound = 2 * old * BODY / MIB + OVERHEAD_MIB
    print(  # noqa: T201
        f"\nwindow shrink: peak RSS {peak:.0f} MiB for {SMALL} x 1 KiB then {SHRINK_LARGE}"
        f" x 5 MiB at prefetch {SHRINK_PREFETCH}; shrinks {shrinks}; bound {bound:.0f} MiB"
    )
    assert all(int(new) <= BUDGET // BODY for _, new in shrinks), shrinks
    assert peak < bound, f"peak RSS {peak:.0f} MiB, bound {bound:.0f} MiB"
