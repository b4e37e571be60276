"""A route's consumer let go on a real RabbitMQ node of the module's own.

Two things only a broker can show: what a reload leaves behind while the broker blocks the
connection (a memory alarm, set with ``rabbitmqctl`` on this node alone), and what the
route does once the broker's ``consumer_timeout``, shorter than the route map says, took a
delivery back (checked every second: ``channel_tick_interval``; RabbitMQ's default checks
once a minute). The broker's own lists are the judge: ``rabbitmqctl list_consumers`` and
the ids in every queue. The numbers are printed for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from tests.brokers import CONSUMER_TIMED_OUT, module_node
from tests.e2e.conftest import (
    Sidecar,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_ids,
)
from tests.faults.private_node import PrivateNode
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODE_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."
ALARM = "0.0000001"  # of the machine's memory: the node is over it at once
NO_ALARM = "0.4"
BACKLOG = 300
AFTER = 200
RELOADS = 12
RELOAD_GAP_S = 0.3
SETTLE_TIMEOUT_S = 90.0
CONSUMER_TIMEOUT_MS = 5000
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000  # RabbitMQ 3.10's


@pytest.fixture(scope="module")
def node(broker_version: str) -> Iterator[PrivateNode]:
    """A RabbitMQ node of the version for this module alone, its consumer timer each second."""
    with module_node(broker_version, "release", advanced=NODE_ADVANCED) as started:
        yield started


def report(test: str, **numbers: object) -> None:
    """Print the test's numbers (for docs/reliability.md)."""
    print(f"\nrelease: {json.dumps({'test': test, **numbers})}")  # noqa: T201


def route_map(
    sidecar: Sidecar, *, quarantine: str, routes: list[dict[str, Any]], **broker: Any
) -> dict[str, Any]:
    """A route map on the private node with these routes and broker settings."""
    return {
        "broker": {"url": sidecar.amqp_url, "connect_timeout_s": 5, **broker},
        "http": {"listen": f"127.0.0.1:{sidecar.port}"},
        "quarantine": {"exchange": quarantine},
        "shutdown_grace_s": 10,
        "routes": routes,
    }


def route(name: str, staging: str, exchange: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "from": staging, "to": {"exchange": exchange}, **options}


async def target(nb: Broker, name: str) -> tuple[str, str]:
    """A topic exchange with a queue bound to everything; return both names."""
    exchange = await nb.exchange(f"{name}.exchange")
    queue = await nb.queue(f"{name}.target")
    await nb.bind(queue, exchange)
    return exchange, queue


async def consumers(node: PrivateNode) -> Counter[str]:
    """The broker's consumers, counted by queue (``rabbitmqctl list_consumers``)."""
    text = await node.ctl.run(
        "list_consumers", "-p", "/", "--quiet", "--no-table-headers", "queue_name"
    )
    return Counter(line.strip() for line in text.splitlines() if line.strip())


async def take_every(nb: Broker, queue: str, ids: list[str], *, sidecar: Sidecar) -> list[str]:
    """Take from ``queue`` until every id came; return all taken, repeats included."""
    taken: list[str] = []

    async def complete() -> bool:
        taken.extend(await take_ids(nb, queue))
        return set(ids) <= set(taken)

    await eventually(
        complete,
        timeout_s=SETTLE_TIMEOUT_S,
        what=f"{len(ids)} ids on {queue}",
        context=lambda: f"{len(set(ids) - set(taken))} missing\n{sidecar.output()}",
    )
    return taken


async def reload_while_blocked(
    sidecar: Sidecar, node: PrivateNode, version: Callable[[int], dict[str, Any]]
) -> Counter[str]:
    """Start under a memory alarm, send RELOADS SIGHUPs with the maps ``version`` gives.

    Returns the broker's consumers while still blocked; the alarm is cleared after.
    """
    await node.ctl.run("set_vm_memory_high_watermark", ALARM)
    try:
        await sidecar.start(wait_ready=False)
        body = ""

        async def blocked() -> bool:
            nonlocal body
            status, body = await sidecar.get("/readyz")
            return status == 503 and '"broker": "blocked: ' in body

        await eventually(blocked, timeout_s=30, what="/readyz says blocked", context=lambda: body)
        for n in range(1, RELOADS + 1):
            sidecar.write(version(n), keep_stamp=True)
            sidecar.send(signal.SIGHUP)
            await asyncio.sleep(RELOAD_GAP_S)
        return await consumers(node)
    finally:
        await node.ctl.run("set_vm_memory_high_watermark", NO_ALARM)


async def wait_for_consumers(node: PrivateNode, want: Counter[str], *, sidecar: Sidecar) -> None:
    """Wait until the broker lists exactly these consumers, and still does a second later."""

    async def settled() -> bool:
        return await consumers(node) == want

    await eventually(settled, timeout_s=30, what=f"consumers {dict(want)}", context=sidecar.output)
    await asyncio.sleep(1.0)  # a consumer left behind would show again by now
    listed = await consumers(node)
    assert listed == want, f"{dict(listed)}\n{sidecar.output()}"


async def test_a_reload_storm_during_a_memory_alarm_leaves_one_consumer_per_route(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode
) -> None:
    """Twelve SIGHUPs while blocked: a prefetch changed, a route retargeted, one removed.

    After the alarm each route has one consumer, the removed one none; nothing reaches the
    old target or the removed route's target; every message is relayed by the route's
    last config or waits in the removed route's staging queue.
    """
    sidecar = sidecar_on_node
    quarantine, _ = await declare_quarantine(nb)
    changed = await nb.queue("changed.staging")
    changed_exchange, changed_target = await target(nb, "changed")
    moved = await nb.queue("moved.staging")
    old_exchange, old_target = await target(nb, "moved.old")
    new_exchange, new_target = await target(nb, "moved.new")
    removed = await nb.queue("removed.staging")
    removed_exchange, removed_target = await target(nb, "removed")
    names = {changed: "changed", moved: "moved", removed: "removed"}
    backlog = {queue: make_ids(name, BACKLOG) for queue, name in names.items()}
    for queue, ids in backlog.items():
        await publish_ids(nb, queue, ids)

    def version(n: int) -> dict[str, Any]:
        """The map after ``n`` reloads: prefetch flips, moved retargeted, removed gone at 6."""
        routes = [
            route("changed", changed, changed_exchange, prefetch=64 + n % 2),
            route("moved", moved, old_exchange if n == 0 else new_exchange),
        ]
        if n < RELOADS // 2:
            routes.append(route("removed", removed, removed_exchange))
        return route_map(sidecar, quarantine=quarantine, routes=routes)

    sidecar.write(version(0))
    sidecar.pad()
    during = await reload_while_blocked(sidecar, node, version)
    await sidecar.wait_ready(timeout_s=60)
    await wait_for_consumers(node, Counter({changed: 1, moved: 1}), sidecar=sidecar)

    after = {queue: make_ids(f"after.{name}", AFTER) for queue, name in names.items()}
    for queue, ids in after.items():
        await publish_ids(nb, queue, ids)
    relayed = await take_every(
        nb, changed_target, backlog[changed] + after[changed], sidecar=sidecar
    )
    retargeted = await take_every(nb, new_target, backlog[moved] + after[moved], sidecar=sidecar)
    await asyncio.sleep(1.0)  # what an old consumer would relay arrives by now
    to_old = await take_ids(nb, old_target)
    to_removed = await take_ids(nb, removed_target)
    assert to_old == [], f"{len(to_old)} relayed to the old target\n{sidecar.output()}"
    assert to_removed == [], f"{len(to_removed)} relayed for the removed route"
    assert await nb.depth(removed) == BACKLOG + AFTER
    assert sidecar.is_running(), sidecar.output()
    duplicates = len(relayed) + len(retargeted) - 2 * (BACKLOG + AFTER)
    report(
        "reload storm during a memory alarm",
        messages=3 * (BACKLOG + AFTER),
        reloads=RELOADS,
        consumers_while_blocked={names[queue]: n for queue, n in during.items()},
        to_old_target=len(to_old),
        to_removed_target=len(to_removed),
        left_in_removed_staging=BACKLOG + AFTER,
        duplicates=duplicates,
    )


@pytest.mark.version_changed
async def test_a_delivery_the_brokers_consumer_timeout_took_back_is_quarantined_not_lost(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode
) -> None:
    """The broker's consumer_timeout (5 s) under the map's (the default 1,800 s), target full.

    Quorum staging with ``x-delivery-limit`` 1 and no dead-letter exchange: the broker's
    406 takes the first held delivery back (an attempt spent); held as long again, it would
    be taken back a second time and dropped. Held at most half as long, each message goes
    to quarantine, with the advice to set ``broker.consumer_timeout_s`` logged once.
    """
    sidecar = sidecar_on_node
    staging = await nb.queue("timeout.staging", **{"x-queue-type": "quorum", "x-delivery-limit": 1})
    exchange = await nb.exchange("timeout.target")
    full = await nb.queue("timeout.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await nb.bind(full, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("timeout", 3)
    await publish_ids(nb, staging, ids)
    # Read when a channel opens (rabbit_channel:init): it applies to the sidecar's.
    await node.ctl.run(
        "eval", f"application:set_env(rabbit, consumer_timeout, {CONSUMER_TIMEOUT_MS})."
    )
    try:
        sidecar.write(
            route_map(
                sidecar,
                quarantine=quarantine,
                routes=[route("timeout", staging, exchange)],
                nack_retry={"max_attempts": 1000, "max_s": 3600},  # the timeout decides
            )
        )
        await sidecar.start(wait_ready=False)
        taken = await take_every(nb, quarantined, ids, sidecar=sidecar)
        await sidecar.wait_ready()
    finally:
        await sidecar.kill()
        await node.ctl.run(
            "eval", f"application:set_env(rabbit, consumer_timeout, {DEFAULT_CONSUMER_TIMEOUT_MS})."
        )
    advice = sidecar.stderr().count("Set broker.consumer_timeout_s")
    assert advice == 1, sidecar.output()
    assert await nb.depth(staging) == 0
    timed_out = len(CONSUMER_TIMED_OUT.findall(node_log(node)))
    report(
        "the broker's consumer_timeout under the map's, quorum limit 1, target full",
        messages=len(ids),
        quarantined=len(set(taken)),
        lost=len(set(ids) - set(taken)),
        duplicates=len(taken) - len(ids),
        taken_back_by_the_broker=timed_out,
    )
    assert timed_out >= 1  # the broker's timer did fire: the sidecar learnt from its 406


def node_log(node: PrivateNode) -> str:
    """Every log file of the node, concatenated."""
    return "".join(
        path.read_text(encoding="utf-8", errors="replace") for path in node.base.glob("log/*.log")
    )
