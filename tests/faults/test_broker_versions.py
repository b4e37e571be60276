"""What RabbitMQ 4.x changed under the sidecar, on a private node of each version.

Each test runs once per version of ``--broker-versions`` (tests/brokers.py): the machine's
own packages (``local``, 3.10.8 on Debian 12) and the cached roots of 4.0 and 4.3
(``scripts/brokers``); each is marked ``version_changed``, so CI runs it on every version.
The subjects are the ones 4.x changed (docs/compatibility.md): a quorum
staging queue at 4.x's default delivery limit (20) through connection cuts and kill -9,
what each requeue spends of it, the broker's consumer timeout, a relay user without
configure permission, global QoS refused (4.3), bodies at and over 16 MiB, and returns.
Every message is counted by id where it must end; the numbers are printed for
docs/compatibility.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import aiormq
import aiormq.abc
import pytest
from pamqp.commands import Basic

from tests.brokers import VersionedNode, node_name, version_slug, versioned_node
from tests.e2e.conftest import (
    ID_HEADER,
    Sidecar,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_ids,
)
from tests.faults.conftest import (
    Fate,
    MixedFlow,
    declare_mixed_flow,
    scrape,
    wait_recovered,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.faults.conftest import FaultRecord
    from tests.faults.private_node import PrivateNode
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.version_changed, pytest.mark.timeout(300)]

NODE_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."  # the consumer timer, each second
DEFAULT_DELIVERY_LIMIT = 20  # a quorum queue's from 4.0; set where the broker has none
PER_LANE = 1500
PREFETCH = 100
ROUTES = 2
CUTS = 3
GRACE_S = 10.0
COMPLETE_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 90.0
CONSUMER_TIMEOUT_MS = 5000
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def versioned(broker_version: str) -> Iterator[VersionedNode]:
    """A private node of the version (``--broker-versions``), for this module's tests."""
    name = node_name(f"v{version_slug(broker_version)}")
    with versioned_node(broker_version, name, advanced=NODE_ADVANCED) as started:
        yield started


@pytest.fixture(scope="module")
def node(versioned: VersionedNode) -> PrivateNode:
    """The node of ``versioned`` (for the shared ``nb`` and ``sidecar_on_node``)."""
    return versioned.node


def report(versioned: VersionedNode, test: str, **numbers: object) -> None:
    """Print the test's numbers with the broker's version (for docs/compatibility.md)."""
    line = json.dumps({"rabbitmq": versioned.version, "test": test, **numbers})
    print(f"\nversions: {line}")  # noqa: T201 - the measurement the suite reports


def quorum_staging(versioned: VersionedNode) -> dict[str, Any]:
    """A quorum staging queue at 4.x's defaults: the delivery limit set only where none is."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if versioned.release < (4, 0):
        arguments["x-delivery-limit"] = DEFAULT_DELIVERY_LIMIT
    return arguments


def route_map(
    sidecar: Sidecar, *, quarantine: str, routes: list[dict[str, Any]], **broker: Any
) -> dict[str, Any]:
    """A route map on the node with these routes and broker settings."""
    return {
        "broker": {"url": sidecar.amqp_url, "connect_timeout_s": 5, **broker},
        "http": {"listen": f"127.0.0.1:{sidecar.port}"},
        "quarantine": {"exchange": quarantine},
        "shutdown_grace_s": GRACE_S,
        "routes": routes,
    }


def route(name: str, staging: str, exchange: str, **options: Any) -> dict[str, Any]:
    """One route of a route map."""
    return {"name": name, "from": staging, "to": {"exchange": exchange}, **options}


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


async def wait_moved(flow: MixedFlow, sidecar: Sidecar, *, more: int) -> None:
    """Wait until ``more`` further copies arrived downstream: the flow is moving."""
    goal = await flow.downstream() + more

    async def moved() -> bool:
        return await flow.downstream() >= goal

    await eventually(moved, timeout_s=60, what=f"{goal} copies downstream", context=sidecar.output)


# --- the fault flow on a quorum staging queue at the default delivery limit ---------------


async def backlog(flow: MixedFlow, sidecar: Sidecar) -> None:
    """Publish more while the sidecar is held still, then let it relay some of it.

    Held, so that the backlog is there whatever the relay's pace: the fault that follows
    lands mid-flow.
    """
    sidecar.send(signal.SIGSTOP)
    try:
        await flow.publish(PER_LANE // 4)
    finally:
        sidecar.send(signal.SIGCONT)
    await wait_moved(flow, sidecar, more=100)


async def test_quorum_staging_at_the_default_delivery_limit_loses_nothing_through_faults(
    versioned: VersionedNode,
    nb: Broker,
    sidecar_on_node: Sidecar,
    record: Callable[..., FaultRecord],
) -> None:
    """Three connection cuts and a kill -9 mid-flow, quorum staging with no dead-letter target.

    Every cut and the kill return the sidecar's unacked deliveries, each spending one of the
    message's 20 attempts (a message past them would be dropped: missing by id). Nothing is
    lost or misplaced; duplicates at most what was in flight at the faults.
    """
    sidecar = sidecar_on_node
    flow = await declare_mixed_flow(nb, **quorum_staging(versioned))
    await flow.publish(PER_LANE)
    sidecar.write(flow.route_map(sidecar, prefetch=PREFETCH, shutdown_grace_s=GRACE_S))
    await sidecar.start()
    recovery: list[float] = []
    left: list[int] = []
    for cut in range(1, CUTS + 1):
        await backlog(flow, sidecar)
        sidecar.send(signal.SIGSTOP)  # hold it mid-work while rabbitmqctl starts
        try:
            await versioned.node.ctl.close_all_connections()
        finally:
            sidecar.send(signal.SIGCONT)
        since = time.monotonic()
        await flow.broker.reconnect()
        left.append(await flow.staging_depth())
        recovery.append(await wait_recovered(sidecar, flow, since=since, reconnects=cut))
    await backlog(flow, sidecar)
    sidecar.send(signal.SIGKILL)
    assert await sidecar.wait_exit(timeout_s=5) == -signal.SIGKILL
    left.append(await flow.staging_depth())
    since = time.monotonic()
    await sidecar.start()
    recovery.append(await wait_recovered(sidecar, flow, since=since))
    assert all(depth > 0 for depth in left), f"a fault came after the flow had finished: {left}"
    await flow.wait_complete(timeout_s=COMPLETE_TIMEOUT_S, context=sidecar.output)
    sidecar.send(signal.SIGTERM)
    assert await sidecar.wait_exit(timeout_s=GRACE_S + 5) == 0, sidecar.output()
    faults = CUTS + 1
    bound = faults * PREFETCH * ROUTES
    duplicates = flow.check(max_duplicates=bound, context=sidecar.output)
    quarantined = sum(1 for fate in flow.fates.values() if fate is Fate.QUARANTINE)
    record(
        messages=flow.published,
        faults=faults,
        duplicates=duplicates,
        duplicate_bound=bound,
        recovery_s=tuple(recovery),
        note=f"RabbitMQ {versioned.version}; left in staging {left}",
    )
    report(
        versioned,
        "quorum staging, default delivery limit, 3 cuts and kill -9",
        messages=flow.published,
        quarantined=quarantined,
        lost=0,
        duplicates=duplicates,
        left_in_staging=left,
    )


# --- the broker's consumer timeout ---------------------------------------------------------


async def test_a_delivery_the_brokers_consumer_timeout_took_back_is_quarantined_not_lost(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """The broker's consumer_timeout (5 s) under the map's (1,800 s), the target full.

    Quorum staging, ``x-delivery-limit`` 1, no dead-letter exchange: the broker takes the
    first held delivery back (an attempt spent) and the route learns its timeout from the
    406 (decision 0031); held as long again, the message would be dropped. Each goes to
    quarantine before the broker's timeout instead.
    """
    sidecar = sidecar_on_node
    node = versioned.node
    staging = await nb.queue("timeout.staging", **{"x-queue-type": "quorum", "x-delivery-limit": 1})
    exchange = await nb.exchange("timeout.target")
    full = await nb.queue("timeout.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await nb.bind(full, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("timeout", 3)
    await publish_ids(nb, staging, ids)
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
        started = time.monotonic()
        await sidecar.start(wait_ready=False)
        taken = await take_every(nb, quarantined, ids, sidecar=sidecar)
        took_s = time.monotonic() - started
        await sidecar.wait_ready()
    finally:
        await sidecar.kill()
        await node.ctl.run(
            "eval",
            f"application:set_env(rabbit, consumer_timeout, {DEFAULT_CONSUMER_TIMEOUT_MS}).",
        )
    assert await nb.depth(staging) == 0
    assert sidecar.stderr().count("Set broker.consumer_timeout_s") == 1, sidecar.output()
    timed_out = node_log(node).count("acknowledgement")
    report(
        versioned,
        "consumer_timeout 5 s under the map's 1,800 s, quorum limit 1, target full",
        messages=len(ids),
        quarantined=len(set(taken)),
        lost=len(set(ids) - set(taken)),
        duplicates=len(taken) - len(ids),
        timeout_lines_in_the_node_log=timed_out,
        seconds=round(took_s, 1),
    )
    assert timed_out >= 1, node_log(node)[-3000:]  # the broker's timer did fire


def node_log(node: PrivateNode) -> str:
    """Every log file of the node, concatenated."""
    return "".join(
        path.read_text(encoding="utf-8", errors="replace") for path in node.base.glob("log/*.log")
    )


# --- a relay user without configure permission -----------------------------------------------


async def test_a_relay_user_without_configure_permission_relays_and_quarantines(
    versioned: VersionedNode, nb: Broker, node: PrivateNode, tmp_path: Path
) -> None:
    """A user with read and write on every name and configure on none: the whole flow runs.

    The sidecar declares nothing; its checks are passive declares, which 4.3 allows without
    configure permission on queues and exchanges that exist.
    """
    user, password = "acemq-relay", "relay-secret"
    await node.ctl.run("add_user", user, password)
    await node.ctl.run("set_permissions", "-p", "/", user, "^$", ".*", ".*")
    sidecar = Sidecar(
        amqp_url=f"amqp://{user}:{password}@127.0.0.1:{node.amqp_port}/", workdir=tmp_path
    )
    try:
        flow = await declare_mixed_flow(nb, **quorum_staging(versioned))
        await flow.publish(200)
        sidecar.write(flow.route_map(sidecar, prefetch=PREFETCH, shutdown_grace_s=GRACE_S))
        await sidecar.start()
        await flow.wait_complete(timeout_s=COMPLETE_TIMEOUT_S, context=sidecar.output)
        sidecar.send(signal.SIGTERM)
        assert await sidecar.wait_exit(timeout_s=GRACE_S + 5) == 0, sidecar.output()
        duplicates = flow.check(max_duplicates=0, context=sidecar.output)
    finally:
        await sidecar.kill()
        await node.ctl.run("delete_user", user)
    report(
        versioned,
        "relay user with no configure permission",
        messages=flow.published,
        lost=0,
        duplicates=duplicates,
    )


async def test_a_relay_user_without_read_permission_is_told_which_one_is_missing(
    versioned: VersionedNode, nb: Broker, node: PrivateNode, tmp_path: Path
) -> None:
    """Configure and read on nothing: the route pauses, /readyz names the permission.

    4.x's 403 says ``read access to queue ... refused for user ...``; 3.10.8's only
    ``access to queue``, to which the sidecar adds that the login needs read permission.
    The route's state carries it to /readyz and the log, and nothing leaves staging.
    """
    user, password = "acemq-noread", "noread-secret"
    await node.ctl.run("add_user", user, password)
    await node.ctl.run("set_permissions", "-p", "/", user, "^$", ".*", "^$")
    sidecar = Sidecar(
        amqp_url=f"amqp://{user}:{password}@127.0.0.1:{node.amqp_port}/", workdir=tmp_path
    )
    try:
        staging = await nb.queue("noread.staging")
        exchange = await nb.exchange("noread.target")
        quarantine, _ = await declare_quarantine(nb)
        await publish_ids(nb, staging, make_ids("noread", 3))
        sidecar.write(
            route_map(sidecar, quarantine=quarantine, routes=[route("noread", staging, exchange)])
        )
        await sidecar.start(wait_ready=False)
        said: list[str] = []

        async def told() -> bool:
            status, body = await sidecar.get("/readyz")
            said[:] = [f"{status} {body}"]
            named = "read access to queue" in body or "needs read permission on queue" in body
            return status == 503 and named and user in body

        await eventually(
            told, timeout_s=30, what="/readyz naming read access", context=sidecar.output
        )
        assert await nb.depth(staging) == 3
    finally:
        await sidecar.kill()
        await node.ctl.run("delete_user", user)
    report(versioned, "relay user without read permission", readyz=said[0][:300])


# --- global QoS --------------------------------------------------------------------------------


async def test_global_qos_is_denied_on_4_3_and_the_sidecar_relays_without_it(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """4.3 denies the deprecated feature ``global_qos``; the sidecar relays on every version.

    The sidecar's ``basic.qos`` is per consumer (``global`` false: tests/unit/amqp). What a
    global one gets from the broker is recorded: 4.3.6 answers ``qos-ok`` all the same.
    """
    state = "(no deprecated features before 3.13)"
    if versioned.release >= (4, 0):
        listed = await versioned.node.ctl.run(
            "list_deprecated_features", "--formatter", "json", "--quiet"
        )
        features = {  # 4.0 lists the phase alone, 4.3 the state too
            item["name"]: item.get("state", item["deprecation_phase"])
            for item in json.loads(listed)
        }
        state = features["global_qos"]
    if versioned.release >= (4, 3):
        assert state == "denied", state
    connection = await aiormq.connect(versioned.node.url)
    try:
        channel = await connection.channel()
        try:
            answer = type(await channel.basic_qos(prefetch_count=10, global_=True)).__name__
        except aiormq.exceptions.ChannelClosed as error:
            answer = str(error)
    finally:
        await connection.close()
    staging = await nb.queue("qos.staging")
    exchange = await nb.exchange("qos.target")
    target = await nb.queue("qos.out")
    await nb.bind(target, exchange)
    quarantine, _ = await declare_quarantine(nb)
    ids = make_ids("qos", 50)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("qos", staging, exchange)])
    )
    await sidecar_on_node.start()
    taken = await take_every(nb, target, ids, sidecar=sidecar_on_node)
    report(
        versioned,
        "global basic.qos",
        global_qos=state,
        a_global_qos_got=answer,
        relayed=len(set(taken)),
        of=len(ids),
    )


# --- bodies at and over 16 MiB -------------------------------------------------------------------


async def publish_body(nb: Broker, queue: str, msg_id: str, size: int) -> str:
    """Publish a body of ``size`` bytes; return "" if confirmed, else what the broker said."""
    connection = await aiormq.connect(nb.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        confirm = await channel.basic_publish(
            bytes(size),
            routing_key=queue,
            properties=aiormq.spec.Basic.Properties(
                message_id=msg_id, headers={ID_HEADER: msg_id}, delivery_mode=2
            ),
        )
        return "" if isinstance(confirm, Basic.Ack) else f"not confirmed: {confirm!r}"
    except aiormq.exceptions.AMQPError as error:
        return str(error)
    finally:
        await connection.close()


async def test_bodies_at_and_over_16_mib(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A 16 MiB body is relayed on every version; one byte more is refused at the publish.

    4.x's default ``max_message_size`` is 16 MiB: the larger body never reaches staging
    there. 3.10's is 128 MiB: it is relayed.
    """
    staging = await nb.queue("big.staging", **quorum_staging(versioned))
    exchange = await nb.exchange("big.target")
    target = await nb.queue("big.out")
    await nb.bind(target, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    at = await publish_body(nb, staging, "big-at", 16 * MIB)
    over = await publish_body(nb, staging, "big-over", 16 * MIB + 1)
    assert not at, at
    if versioned.release >= (4, 0):
        assert "message size" in over or "max" in over, over
    else:
        assert not over, over
    ids = ["big-at"] if over else ["big-at", "big-over"]
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("big", staging, exchange)])
    )
    await sidecar_on_node.start()
    taken = await take_every(nb, target, ids, sidecar=sidecar_on_node)
    assert await nb.depth(quarantined) == 0
    report(
        versioned,
        "bodies of 16 MiB and 16 MiB + 1",
        relayed=sorted(set(taken)),
        over_16_mib_at_the_publish=over or "confirmed",
    )


# --- returns -------------------------------------------------------------------------------------


async def test_an_unroutable_copy_comes_back_and_is_quarantined_as_unroutable(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A mandatory copy no binding takes comes back and goes to quarantine as unroutable.

    Its reason names the exchange and key; the routable ones beside it are relayed.
    """
    staging = await nb.queue("ret.staging", **quorum_staging(versioned))
    stage = await nb.exchange("ret.stage")  # keeps the publisher's routing key
    await nb.bind(staging, stage, "#")
    exchange = await nb.exchange("ret.target")
    target = await nb.queue("ret.out")
    await nb.bind(target, exchange, "ok.#")
    quarantine, quarantined = await declare_quarantine(nb)
    routable, unroutable = make_ids("ret-ok", 20), make_ids("ret-bad", 5)
    for ids, key in ((routable, "ok.x"), (unroutable, "bad.x")):
        for msg_id in ids:
            await nb.publish(
                staging,
                headers={ID_HEADER: msg_id},
                message_id=msg_id,
                exchange=stage,
                routing_key=key,
            )
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("ret", staging, exchange)])
    )
    await sidecar_on_node.start()
    relayed = await take_every(nb, target, routable, sidecar=sidecar_on_node)
    reasons: dict[str, str] = {}
    while set(reasons) < set(unroutable):
        message = await nb.channel.basic_get(quarantined, no_ack=True)
        if not isinstance(message.delivery, Basic.GetOk):
            await asyncio.sleep(0.2)
            continue
        headers = message.header.properties.headers or {}
        reasons[str(message.header.properties.message_id)] = str(headers.get("x-acemq-error"))
    assert all("unroutable" in reason for reason in reasons.values()), reasons
    metrics = await scrape(sidecar_on_node)
    assert metrics.value("acemq_sidecar_messages_total", outcome="quarantined") == len(unroutable)
    report(
        versioned,
        "returns",
        relayed=len(set(relayed)),
        quarantined_unroutable=len(reasons),
        reason=next(iter(reasons.values())),
    )


async def test_a_returned_copy_is_published_again_and_routed_once_bound(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A copy returned while no binding takes its key goes out again and lands once bound.

    The binding is made after the sidecar saw the return, as a Khepri node may see a new
    binding a moment late (4.2+, a cluster): the retry is routed, nothing is quarantined,
    and the metric says so. ``max_attempts`` 5 from 1 s (31 s in all) leaves the test time.
    """
    staging = await nb.queue("late.staging", **quorum_staging(versioned))
    exchange = await nb.exchange("late.target")
    target = await nb.queue("late.out")
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("late", 3)
    await publish_ids(nb, staging, ids)  # by the default exchange: key "late.staging", kept
    sidecar_on_node.write(
        route_map(
            sidecar_on_node,
            quarantine=quarantine,
            routes=[route("late", staging, exchange)],
            return_retry={"max_attempts": 5, "delay_s": 1.0, "max_per_s": 100},
        )
    )
    await sidecar_on_node.start()

    async def returned() -> bool:
        metrics = await scrape(sidecar_on_node)
        sent = metrics.value("acemq_sidecar_return_retries_total", route="late", result="sent")
        return sent >= len(ids)

    await eventually(returned, timeout_s=30, what="3 returns seen", context=sidecar_on_node.output)
    await nb.bind(target, exchange, staging)
    relayed = await take_every(nb, target, ids, sidecar=sidecar_on_node)
    metrics = await scrape(sidecar_on_node)
    routed = metrics.value("acemq_sidecar_return_retries_total", route="late", result="routed")
    assert routed == len(ids), metrics.text
    assert metrics.value("acemq_sidecar_messages_total", outcome="quarantined") == 0
    assert await take_ids(nb, quarantined) == []
    report(versioned, "a return retried", relayed=len(set(relayed)), routed_on_retry=routed)


# --- what each way of giving a delivery back spends of a quorum queue's delivery limit -----

GIVE_BACKS = ("basic.reject", "basic.nack", "channel.close", "connection.close")
COUNT_HEADERS = ("x-delivery-count", "x-acquired-count")


def counts_of(headers: dict[str, Any] | None) -> dict[str, int]:
    """The broker's counts a delivery carries (0 where a header is absent)."""
    return {name: int((headers or {}).get(name, 0)) for name in COUNT_HEADERS}


async def give_back_once(url: str, queue: str, way: str) -> dict[str, int]:
    """Get the queue's one message (no ack), give it back ``way``; return its counts seen."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        got = await channel.basic_get(queue, no_ack=False)
        assert isinstance(got.delivery, Basic.GetOk), f"nothing in {queue}"
        seen = counts_of(got.header.properties.headers)
        tag = got.delivery.delivery_tag
        assert tag is not None
        if way == "basic.reject":
            await channel.basic_reject(tag, requeue=True)
        elif way == "basic.nack":
            await channel.basic_nack(tag, requeue=True)
        elif way == "channel.close":
            await channel.close()
    finally:
        await connection.close()
    return seen


async def test_what_each_give_back_spends_of_a_quorum_queues_delivery_limit(
    versioned: VersionedNode, nb: Broker
) -> None:
    """One message on a quorum queue given back twice each way; the counts it then carries.

    A way spends an attempt when ``x-delivery-count`` rises after it (the broker drops the
    message past ``x-delivery-limit``). The numbers decide how the sidecar gives back.
    """
    queue = await nb.queue("spend", **quorum_staging(versioned))
    await nb.publish(queue, message_id="spend-1")
    ways = [way for way in GIVE_BACKS for _ in range(2)]
    seen = [await give_back_once(nb.url, queue, way) for way in ways]
    got = await nb.channel.basic_get(queue, no_ack=True)  # the counts after the last way
    assert isinstance(got.delivery, Basic.GetOk)
    seen.append(counts_of(got.header.properties.headers))
    spent: dict[str, list[int]] = {}
    for index, way in enumerate(ways):
        rise = seen[index + 1]["x-delivery-count"] - seen[index]["x-delivery-count"]
        spent.setdefault(way, []).append(rise)
    report(versioned, "what each give-back spends", spent=spent, last_counts=seen[-1])
    nack_spends = 0 if versioned.release >= (4, 3) else 1
    assert spent == {
        "basic.reject": [1, 1],
        "basic.nack": [nack_spends, nack_spends],
        "channel.close": [1, 1],
        "connection.close": [1, 1],
    }, spent


async def test_a_sigterm_gives_held_deliveries_back_by_nack_which_4_3_does_not_count(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """Three SIGTERMs while the target nacks every copy (held), then staging read.

    On 4.3 the drain gives the held deliveries back with a ``basic.nack`` before the
    channel's close, which spends no attempt (``x-delivery-count`` 0 in staging); before
    4.3 the close gives them back, one attempt per stop (3). Nothing is lost either way.
    The count is read in staging: a relayed copy does not carry it.
    """
    sidecar = sidecar_on_node
    staging = await nb.queue("held.staging", **quorum_staging(versioned))
    exchange = await nb.exchange("held.target")
    full = await nb.queue("held.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await nb.bind(full, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("held", 5)
    await publish_ids(nb, staging, ids)
    sidecar.write(
        route_map(
            sidecar,
            quarantine=quarantine,
            routes=[route("held", staging, exchange)],
            nack_retry={"max_attempts": 1000, "max_s": 3600},
        )
    )
    stops = 3
    for _ in range(stops):
        await sidecar.start(wait_ready=False)

        async def holding() -> bool:
            status, _ = await sidecar.get("/metrics")
            if status != 200:  # not serving yet
                return False
            metrics = await scrape(sidecar)
            return metrics.value("acemq_sidecar_in_flight", route="held") == len(ids)

        await eventually(holding, timeout_s=30, what="every delivery held", context=sidecar.output)
        sidecar.send(signal.SIGTERM)
        assert await sidecar.wait_exit(timeout_s=GRACE_S + 5) == 0, sidecar.output()
    counts: dict[str, int] = {}

    async def given_back() -> bool:
        while True:
            got = await nb.channel.basic_get(staging, no_ack=True)
            if not isinstance(got.delivery, Basic.GetOk):
                return set(ids) <= set(counts)
            headers = got.header.properties.headers or {}
            count = headers.get("x-delivery-count", 0)
            assert isinstance(count, int)
            counts[str(got.header.properties.message_id)] = count

    await eventually(given_back, timeout_s=60, what="every id in staging", context=sidecar.output)
    assert await nb.depth(quarantined) == 0
    spent = sorted(set(counts.values()))
    report(versioned, "SIGTERM while held, three times", stops=stops, delivery_counts=spent)
    assert spent == ([0] if versioned.release >= (4, 3) else [stops]), counts


async def test_a_message_one_return_from_its_last_delivery_is_quarantined_naming_the_limit(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """Quorum staging at the default limit (20): one message given back 19 times, one 18.

    ``basic.reject`` (requeue) spends an attempt on every version. The one at 19 would have
    only its last delivery after one more return: it goes to quarantine, the reason naming
    the limit; the one at 18 is relayed.
    """
    sidecar = sidecar_on_node
    exchange = await nb.exchange("limit.target")
    target = await nb.queue("limit.out")
    await nb.bind(target, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    routes = []
    for msg_id, returns in (("limit-19", DEFAULT_DELIVERY_LIMIT - 1), ("limit-18", 18)):
        staging = await nb.queue(f"{msg_id}.staging", **quorum_staging(versioned))
        await nb.publish(staging, headers={ID_HEADER: msg_id}, message_id=msg_id)
        for _ in range(returns):
            await give_back_once(nb.url, staging, "basic.reject")
        routes.append(route(msg_id, staging, exchange))
    sidecar.write(route_map(sidecar, quarantine=quarantine, routes=routes))
    await sidecar.start()
    relayed = await take_every(nb, target, ["limit-18"], sidecar=sidecar)
    reasons: dict[str, str] = {}

    async def quarantined_one() -> bool:
        got = await nb.channel.basic_get(quarantined, no_ack=True)
        if isinstance(got.delivery, Basic.GetOk):
            headers = got.header.properties.headers or {}
            reasons[str(got.header.properties.message_id)] = str(headers.get("x-acemq-error"))
        return bool(reasons)

    await eventually(quarantined_one, timeout_s=30, what="limit-19 quarantined")
    assert set(reasons) == {"limit-19"}, reasons
    assert reasons["limit-19"].startswith("delivery limit: "), reasons
    assert "back 19 times" in reasons["limit-19"], reasons
    assert relayed == ["limit-18"]
    report(
        versioned,
        "one return from the last delivery",
        quarantined=sorted(reasons),
        relayed=relayed,
        reason=reasons["limit-19"],
    )


async def test_quarantine_list_on_a_quorum_queue_spends_nothing_on_4_3(
    versioned: VersionedNode, nb: Broker
) -> None:
    """``acemq-sidecar quarantine list`` twice on a quorum queue of 300: same order after.

    On 4.3 the reader gives what it held back by a nack before closing its channels: no
    attempt is spent (``x-delivery-count`` 0); before 4.3 by the close, one per list (2).
    """
    queue = await nb.queue("qlist", **quorum_staging(versioned))
    ids = make_ids("qlist", 300)
    for msg_id in ids:  # one at a time: the queue's order is the ids'
        await nb.publish(queue, headers={ID_HEADER: msg_id}, message_id=msg_id)
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sidecar",
            "quarantine",
            "list",
            queue,
            env={**os.environ, "AMQP_URL": nb.url},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            _, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        assert f"read {len(ids)} of the {len(ids)} message(s)" in err.decode()
    order: list[str] = []
    spent: set[int] = set()
    while True:
        got = await nb.channel.basic_get(queue, no_ack=True)
        if not isinstance(got.delivery, Basic.GetOk):
            break
        order.append(str(got.header.properties.message_id))
        spent.add(counts_of(got.header.properties.headers)["x-delivery-count"])
    assert order == ids
    report(versioned, "quarantine list twice, quorum queue", messages=len(ids), spent=sorted(spent))
    assert spent == ({0} if versioned.release >= (4, 3) else {2}), spent
