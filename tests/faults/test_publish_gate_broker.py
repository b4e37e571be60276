"""The publish gate against a real RabbitMQ node of the module's own (no consumer_timeout).

A copy whose confirm never comes (its target queue's process suspended, as a quorum queue
without a leader would hold it) must stall no other route of the connection, also where
the user may not write to ``amq.default`` and the gate leads with a copy instead of its
probe. The node keeps RabbitMQ's default ``consumer_timeout`` (30 min): a shorter one
would close the stuck route's channel and end the wait by itself.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING

import pytest

from sidecar.flow.publish_gate import QUIET_S
from tests.brokers import module_node
from tests.e2e.conftest import Sidecar, declare_quarantine, eventually, make_ids, publish_ids
from tests.faults.private_node import PrivateNode
from tests.faults.test_refusals import report, route, route_map, take_all
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GRACE_S = 10  # the route map's shutdown_grace_s (tests.faults.test_refusals.route_map)


@pytest.fixture(scope="module")
def node(broker_version: str) -> Iterator[PrivateNode]:
    """A RabbitMQ node of the version for this module alone, with RabbitMQ's defaults."""
    with module_node(broker_version, "gate") as started:
        yield started


def _queue_process(queue: str, call: str) -> str:
    """An Erlang expression applying ``sys:CALL`` to the process of a classic queue."""
    return (
        f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),'
        f" sys:{call}(amqqueue:get_pid(Q))."
    )


async def test_a_lead_whose_confirm_never_comes_stalls_no_other_route(
    nb: Broker, node: PrivateNode, sidecar_on_node: Sidecar
) -> None:
    """No write on amq.default: the first copy after a quiet spell leads; its confirm never comes.

    Route A's target queue is suspended (as a quorum queue without a leader would be), so
    the copy that leads for the connection is never confirmed. Route B must still relay
    everything, and once A's queue runs again nothing of A is lost.
    """
    staging_a, staging_b = await nb.queue("lead.a.staging"), await nb.queue("lead.b.staging")
    target_a, target_b = await nb.queue("lead.a.target"), await nb.queue("lead.b.target")
    exchange_a, exchange_b = await nb.exchange("lead.a"), await nb.exchange("lead.b")
    await nb.bind(target_a, exchange_a)
    await nb.bind(target_b, exchange_b)
    quarantine, _ = await declare_quarantine(nb)
    user, password = "acemq-no-default", "no-default-pw"
    await node.ctl.run("add_user", user, password)
    suspended = False
    try:
        await node.ctl.run("set_permissions", "-p", "/", user, ".*", "^(?!amq\\.default$).*", ".*")
        url = f"amqp://{user}:{password}@127.0.0.1:{node.amqp_port}/"
        sidecar_on_node.write(
            route_map(
                sidecar_on_node,
                quarantine=quarantine,
                routes=[route("a", staging_a, exchange_a), route("b", staging_b, exchange_b)],
                url=url,
            )
        )
        await sidecar_on_node.start(wait_ready=True)
        warm = make_ids("lead.warm", 5)
        await publish_ids(nb, staging_b, warm)
        await take_all(nb, target_b, warm, sidecar=sidecar_on_node)
        await node.ctl.run("eval", _queue_process(target_a, "suspend"))
        suspended = True
        # A quiet spell, so that A's first copy leads; then B's backlog.
        await asyncio.sleep(2 * QUIET_S)
        ids_a, ids_b = make_ids("lead.a", 20), make_ids("lead.b", 2000)
        await publish_ids(nb, staging_a, ids_a)
        await asyncio.sleep(QUIET_S)
        await publish_ids(nb, staging_b, ids_b)
        relayed = await take_all(nb, target_b, ids_b, sidecar=sidecar_on_node, timeout_s=60)
        await node.ctl.run("eval", _queue_process(target_a, "resume"))
        suspended = False
        tally_a = await take_all(nb, target_a, ids_a, sidecar=sidecar_on_node)
        report(
            "a lead never confirmed, no write on amq.default",
            messages=len(ids_a) + len(ids_b),
            lost=0,
            other_route_duplicates=sum(relayed.copies().values()) - len(ids_b),
            duplicates=sum(tally_a.copies().values()) - len(ids_a),
        )
    finally:
        if suspended:
            await node.ctl.run("eval", _queue_process(target_a, "resume"))
        await sidecar_on_node.kill()
        await node.ctl.run("delete_user", user)


async def test_sigterm_during_a_memory_alarm_exits_without_waiting_on_the_broker(
    nb: Broker, node: PrivateNode, sidecar_on_node: Sidecar
) -> None:
    """An alarm the probe met: SIGTERM lets the waiting copies go unwritten, and exits 0.

    The broker reads nothing from the blocked publishing connection, so nothing may wait
    for its answer on the way out (a channel's or the connection's close-ok). The time
    from the signal to the exit is printed for docs/reliability.md; nothing is lost or
    relayed twice once the alarm clears.
    """
    staging, target = await nb.queue("alarm.staging"), await nb.queue("alarm.target")
    exchange = await nb.exchange("alarm")
    await nb.bind(target, exchange)
    quarantine, _ = await declare_quarantine(nb)
    ids = make_ids("alarm", 200)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("a", staging, exchange)])
    )
    await node.ctl.run("set_vm_memory_high_watermark", "0.0001")
    try:
        await sidecar_on_node.start(wait_ready=False)
        body = ""

        async def blocked() -> bool:
            nonlocal body
            status, body = await sidecar_on_node.get("/readyz")
            return status == 503 and '"broker": "blocked: ' in body

        await eventually(blocked, timeout_s=30, what="/readyz says blocked", context=lambda: body)
        signalled = time.monotonic()
        sidecar_on_node.send(signal.SIGTERM)
        status = await sidecar_on_node.wait_exit(timeout_s=GRACE_S + 30)
        exit_s = time.monotonic() - signalled
        assert status == 0, sidecar_on_node.output()
    finally:
        await node.ctl.run("set_vm_memory_high_watermark", "0.4")
    await sidecar_on_node.start()
    taken = await take_all(nb, target, ids, sidecar=sidecar_on_node)
    duplicates = sum(taken.copies().values()) - len(ids)
    assert duplicates == 0, sidecar_on_node.output()
    report(
        "SIGTERM during a memory alarm",
        messages=len(ids),
        lost=0,
        duplicates=duplicates,
        exit_after_s=round(exit_s, 2),
        grace_s=GRACE_S,
    )
