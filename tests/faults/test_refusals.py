"""Refusals and held deliveries against a real RabbitMQ node of the module's own.

What the broker refuses (403, 406, nacks, an unroutable quarantine) must never spend a quorum
queue's delivery limit on a window, never loop, and never be lost; a held delivery is
settled before the broker's ``consumer_timeout`` takes it back. The node has
``consumer_timeout`` 5 s, checked every second (``channel_tick_interval``; RabbitMQ's
default checks once a minute), so the broker's own timer is seen within a test.

Every message is counted by id in the target, quarantine and dead-letter queues. The
numbers are printed for docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from pamqp.commands import Basic

from tests.brokers import module_node
from tests.e2e.conftest import (
    ID_HEADER,
    Sidecar,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
)
from tests.faults.private_node import PrivateNode
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CONSUMER_TIMEOUT_MS = 5000
NODE_CONF = f"consumer_timeout = {CONSUMER_TIMEOUT_MS}\n"
NODE_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."
SETTLE_TIMEOUT_S = 90.0
PREFETCH = 64
RUNTIME_SIZE_LIMIT_ON_4X = (
    "RabbitMQ 4.0.5 and 4.3.6 took the big bodies past a max_message_size lowered at run time"
    " (application:set_env): the target never refuses them, so they are relayed"
)


@pytest.fixture(scope="module")
def node(broker_version: str) -> Iterator[PrivateNode]:
    """A RabbitMQ node of the version for this module alone, with a 5 s consumer_timeout."""
    with module_node(broker_version, "refusals", conf=NODE_CONF, advanced=NODE_ADVANCED) as started:
        yield started


def route_map(
    sidecar: Sidecar,
    *,
    quarantine: str,
    routes: list[dict[str, Any]],
    **broker: Any,
) -> dict[str, Any]:
    """A route map on the private node with these routes and broker settings."""
    return {
        "broker": {
            "url": sidecar.amqp_url,
            "prefetch": PREFETCH,
            "connect_timeout_s": 5,
            **broker,
        },
        "http": {"listen": f"127.0.0.1:{sidecar.port}"},
        "quarantine": {"exchange": quarantine},
        "shutdown_grace_s": 10,
        "routes": routes,
    }


def route(name: str, staging: str, exchange: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "from": staging, "to": {"exchange": exchange}, **options}


async def dead_letter_queue(nb: Broker) -> tuple[str, str]:
    """A fanout dead-letter exchange with a queue bound; return both names."""
    exchange = await nb.exchange("dlx", kind="fanout")
    queue = await nb.queue("dlq")
    await nb.bind(queue, exchange, routing_key="")
    return exchange, queue


class Tally:
    """Every copy taken from a queue, by id, with its headers."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.headers: dict[str, dict[str, Any]] = {}

    async def take(self, nb: Broker, queue: str) -> None:
        """Take (and ack) whatever the queue holds now."""
        while True:
            message = await nb.channel.basic_get(queue, no_ack=True)
            if not isinstance(message.delivery, Basic.GetOk):
                return
            headers = dict(message.header.properties.headers or {})
            id_ = str(headers.get(ID_HEADER, message.header.properties.message_id))
            self.ids.append(id_)
            self.headers[id_] = headers

    def copies(self) -> Counter[str]:
        """How many copies of each id were taken."""
        return Counter(self.ids)


async def take_all(
    nb: Broker, queue: str, ids: list[str], *, sidecar: Sidecar, timeout_s: float = SETTLE_TIMEOUT_S
) -> Tally:
    """Take from ``queue`` until every id came once at least."""
    tally = Tally()

    async def complete() -> bool:
        await tally.take(nb, queue)
        return set(ids) <= set(tally.ids)

    await eventually(
        complete,
        timeout_s=timeout_s,
        what=f"{len(ids)} ids on {queue}",
        context=lambda: f"{len(set(ids) - set(tally.ids))} missing\n{sidecar.output()}",
    )
    return tally


def report(test: str, **numbers: object) -> None:
    """Print the test's numbers (for docs/reliability.md)."""
    print(f"\nrefusals: {json.dumps({'test': test, **numbers})}")  # noqa: T201


async def test_a_403_on_publish_quarantines_with_the_brokers_words_and_loses_nothing(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """An internal target (403 on every publish), quorum staging, limit 3.

    All 50 are quarantined with the broker's reason, none lost (a client that closes and
    reopens the one channel, requeueing the window each time, lost 50 of 50 to the queue's
    delivery limit in about 5 s).
    """
    staging = await nb.queue("r403.staging", **{"x-queue-type": "quorum", "x-delivery-limit": 3})
    internal = nb.name("r403.internal")
    await nb.channel.exchange_declare(internal, exchange_type="topic", durable=True, internal=True)
    nb.exchanges.append(internal)
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("r403", 50)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("r403", staging, internal)])
    )
    await sidecar_on_node.start(wait_ready=False)
    tally = await take_all(nb, quarantined, ids, sidecar=sidecar_on_node)
    reasons = {str(h.get("x-acemq-error")) for h in tally.headers.values()}
    assert all("403" in r and "internal exchange" in r for r in reasons), reasons
    await sidecar_on_node.wait_ready()
    assert await nb.depth(staging) == 0
    duplicates = sum(tally.copies().values()) - len(ids)
    report("403 internal exchange", messages=len(ids), lost=0, duplicates=duplicates)


@pytest.mark.version_changed
async def test_a_403_for_no_write_permission_leaves_the_other_route_flowing(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode
) -> None:
    """A user without write permission on one target; the other route relays."""
    staging = await nb.queue("perm.staging", **{"x-queue-type": "quorum", "x-delivery-limit": 2})
    denied = await nb.exchange("perm.denied")
    other_staging = await nb.queue("perm.other.staging")
    allowed = await nb.exchange("perm.allowed")
    target = await nb.queue("perm.target")
    await nb.bind(target, allowed)
    quarantine, quarantined = await declare_quarantine(nb)
    user, password = "acemq-limited", "limited-pw"
    await node.ctl.run("add_user", user, password)
    try:
        # Read and configure everything; write everything but the denied exchange.
        await node.ctl.run("set_permissions", "-p", "/", user, ".*", f"^(?!{denied}$).*", ".*")
        ids, other_ids = make_ids("perm", 40), make_ids("other", 40)
        await publish_ids(nb, staging, ids)
        await publish_ids(nb, other_staging, other_ids)
        url = f"amqp://{user}:{password}@127.0.0.1:{node.amqp_port}/"
        sidecar_on_node.write(
            route_map(
                sidecar_on_node,
                quarantine=quarantine,
                routes=[
                    route("denied", staging, denied),
                    route("allowed", other_staging, allowed),
                ],
                url=url,
            )
        )
        await sidecar_on_node.start(wait_ready=False)
        relayed = await take_all(nb, target, other_ids, sidecar=sidecar_on_node)
        tally = await take_all(nb, quarantined, ids, sidecar=sidecar_on_node)
        assert all("403 ACCESS_REFUSED" in str(h["x-acemq-error"]) for h in tally.headers.values())
        assert await nb.depth(staging) == 0
        report(
            "403 no write permission",
            messages=len(ids) + len(other_ids),
            lost=0,
            duplicates=sum(tally.copies().values()) - len(ids),
            other_route_duplicates=sum(relayed.copies().values()) - len(other_ids),
        )
    finally:
        await sidecar_on_node.kill()
        await node.ctl.run("delete_user", user)


@pytest.mark.version_changed
async def test_a_message_above_max_message_size_does_not_stall_the_others(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode, broker_version: str
) -> None:
    """max_message_size lowered below 3 queued messages: the 40 others relay.

    The route never sticks in a loop of 406 and channel reopen. 4.x's default limit (16 MiB)
    is tests/faults/test_broker_versions.py's subject; 4.0.5 and 4.3.6 read the limit at
    boot only, so there the 3 are relayed too (``RUNTIME_SIZE_LIMIT_ON_4X``).
    """
    big, small = make_ids("big", 3), make_ids("small", 40)
    async with sized_flow(nb, node, sidecar_on_node, small=small, big=big) as (_, target, _):
        if broker_version in ("4.0", "4.3"):
            relayed = await take_all(nb, target, small + big, sidecar=sidecar_on_node)
            report("406 max_message_size, 4.x", messages=43, relayed=len(set(relayed.ids)))
            return
        relayed = await take_all(nb, target, small, sidecar=sidecar_on_node)
        assert not set(big) & set(relayed.ids)
        report("406 max_message_size", messages=43, relayed=len(set(relayed.ids)), lost=0)


@pytest.mark.version_changed
async def test_a_message_no_copy_of_which_the_broker_accepts_is_dead_lettered(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode, broker_version: str
) -> None:
    """Too big for the target and for quarantine: rejected to the DLX, counted.

    On 4.x the limit lowered at run time is not applied (``RUNTIME_SIZE_LIMIT_ON_4X``): all
    13 are relayed and none is dead-lettered.
    """
    big, small = make_ids("big", 3), make_ids("small", 10)
    async with sized_flow(nb, node, sidecar_on_node, small=small, big=big) as flow:
        staging, target, dlq = flow
        if broker_version in ("4.0", "4.3"):
            await take_all(nb, target, small + big, sidecar=sidecar_on_node)
            await sidecar_on_node.wait_ready()
            assert await sidecar_on_node.metric("acemq_sidecar_dead_lettered_total") == 0
            assert await nb.depth(dlq) == 0
            assert await nb.depth(staging) == 0
            report("406 on target and quarantine, 4.x", messages=13, dead_lettered=0)
            return
        await take_all(nb, target, small, sidecar=sidecar_on_node)
        dead = await take_all(nb, dlq, big, sidecar=sidecar_on_node)
        await sidecar_on_node.wait_ready()
        assert await sidecar_on_node.metric("acemq_sidecar_dead_lettered_total") == len(big)
        assert await nb.depth(staging) == 0
        report("406 on target and quarantine", messages=13, dead_lettered=len(set(dead.ids)))


@contextlib.asynccontextmanager
async def sized_flow(
    nb: Broker, node: PrivateNode, sidecar: Sidecar, *, small: list[str], big: list[str]
) -> AsyncIterator[tuple[str, str, str]]:
    """Queue small and big messages, lower max_message_size below the big ones, run a route.

    Yields the staging queue, the target queue and the dead-letter queue; afterwards the
    sidecar is killed and the node's max_message_size put back, whatever happened.
    """
    staging, target, quarantine, dlq = await size_topology(nb)
    await publish_sized(nb, staging, small, big)
    async with node.ctl.rabbit_env_set("max_message_size", "65536"):
        try:
            sidecar.write(
                route_map(
                    sidecar,
                    quarantine=quarantine,
                    routes=[route("sized", staging, target[0])],
                    consumer_timeout_s=CONSUMER_TIMEOUT_MS / 1000,
                )
            )
            await sidecar.start(wait_ready=False)
            yield staging, target[1], dlq
        finally:
            await sidecar.kill()


async def size_topology(nb: Broker) -> tuple[str, tuple[str, str], str, str]:
    """Classic staging with a DLX, a target exchange and queue, quarantine; return names."""
    dlx, dlq = await dead_letter_queue(nb)
    staging = await nb.queue("sized.staging", **{"x-dead-letter-exchange": dlx})
    exchange = await nb.exchange("sized.target")
    target = await nb.queue("sized.out")
    await nb.bind(target, exchange)
    quarantine, _ = await declare_quarantine(nb)
    return staging, (exchange, target), quarantine, dlq


async def publish_sized(nb: Broker, staging: str, small: list[str], big: list[str]) -> None:
    for id_ in small:
        await nb.publish(staging, headers={ID_HEADER: id_}, message_id=id_, body=b"s" * 100)
    for id_ in big:
        await nb.publish(staging, headers={ID_HEADER: id_}, message_id=id_, body=b"B" * 100_000)


@pytest.mark.version_changed
async def test_a_copy_the_target_keeps_nacking_is_quarantined_before_the_consumer_timeout(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """consumer_timeout 5 s, quorum staging x-delivery-limit 1, the target full.

    The held copy is quarantined (reason: what the broker said, for how long) at half the
    timeout, before the broker takes it back (held past it, it is taken back twice and the
    queue drops it: gone from staging, target and quarantine, and nothing logged).
    """
    staging = await nb.queue("held.staging", **{"x-queue-type": "quorum", "x-delivery-limit": 1})
    exchange = await nb.exchange("held.target")
    full = await nb.queue("held.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await nb.bind(full, exchange)
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("held", 5)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(
            sidecar_on_node,
            quarantine=quarantine,
            routes=[route("held", staging, exchange)],
            consumer_timeout_s=CONSUMER_TIMEOUT_MS / 1000,
        )
    )
    await sidecar_on_node.start(wait_ready=False)
    tally = await take_all(nb, quarantined, ids, sidecar=sidecar_on_node)
    for headers in tally.headers.values():
        reason = str(headers["x-acemq-error"])
        assert "nacked" in reason, reason
        assert "consumer_timeout of 5s" in reason, reason
    await sidecar_on_node.wait_ready()
    assert await nb.depth(staging) == 0
    report("held past consumer_timeout (target nacks)", messages=len(ids), lost=0)


async def test_a_held_quarantine_is_dead_lettered_before_the_consumer_timeout(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """The quarantine exchange routes nowhere: rejected to the staging DLX."""
    dlx, dlq = await dead_letter_queue(nb)
    staging = await nb.queue(
        "dlx.staging",
        **{"x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": dlx},
    )
    exchange = await nb.exchange("dlx.target")  # no binding: every copy returns
    quarantine = await nb.exchange("dlx.quarantine", kind="fanout")  # no binding either
    ids = make_ids("dlx", 3)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(
            sidecar_on_node,
            quarantine=quarantine,
            routes=[route("dlx", staging, exchange)],
            consumer_timeout_s=CONSUMER_TIMEOUT_MS / 1000,
        )
    )
    await sidecar_on_node.start(wait_ready=False)
    dead = await take_all(nb, dlq, ids, sidecar=sidecar_on_node)
    for headers in dead.headers.values():
        assert "x-death" in headers
    assert await sidecar_on_node.metric("acemq_sidecar_dead_lettered_total") == len(ids)
    report("quarantine unroutable past consumer_timeout", messages=3, dead_lettered=3, lost=0)


@pytest.mark.version_changed
async def test_an_idle_route_is_ready_again_after_the_broker_took_its_held_deliveries(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """The sidecar told a long timeout, the broker's is 5 s and takes them away.

    Once the queue has dropped them (delivery limit) the route is idle: /readyz must say
    200 and route_up 1 without a new message, not 503 for ever.
    """
    dlx, dlq = await dead_letter_queue(nb)
    staging = await nb.queue(
        "idle.staging",
        **{"x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": dlx},
    )
    exchange = await nb.exchange("idle.target")  # no binding: every copy returns
    quarantine = await nb.exchange("idle.quarantine", kind="fanout")
    ids = make_ids("idle", 3)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(
            sidecar_on_node,
            quarantine=quarantine,
            routes=[route("idle", staging, exchange)],
            consumer_timeout_s=3600,  # the sidecar does not act: the broker's timer does
        )
    )
    await sidecar_on_node.start(wait_ready=False)
    status, body = 0, ""

    async def held() -> bool:
        nonlocal status, body
        status, body = await sidecar_on_node.get("/readyz")
        return status == 503 and "quarantine exchange" in body

    await eventually(held, timeout_s=30, what="held on the quarantine", context=lambda: body)
    # The broker takes them back twice (limit 1), then dead-letters them.
    await take_all(nb, dlq, ids, sidecar=sidecar_on_node, timeout_s=120)
    await sidecar_on_node.wait_ready(timeout_s=60)
    assert await sidecar_on_node.metric("acemq_sidecar_route_up", route="idle") == 1
    report("idle route after the broker took its held deliveries", messages=3, ready=True)


async def test_a_nacked_copy_is_retried_a_bounded_number_of_times_and_counted(
    nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A target routing to two queues, one full (reject-publish), nacks.

    Each retry puts one more copy in the other queue: with max_attempts 3 each message
    has exactly 3 copies there, one in quarantine, and retried_copies_total counts the 2
    beyond the first (unbounded retries made 7 copies of one message in 30 s).
    """
    staging = await nb.queue("nack.staging")
    exchange = await nb.exchange("nack.target", kind="fanout")
    ok = await nb.queue("nack.ok")
    full = await nb.queue("nack.full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await nb.bind(ok, exchange, routing_key="")
    await nb.bind(full, exchange, routing_key="")
    quarantine, quarantined = await declare_quarantine(nb)
    ids = make_ids("nack", 10)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(
            sidecar_on_node,
            quarantine=quarantine,
            routes=[route("nack", staging, exchange)],
            nack_retry={"max_attempts": 3, "max_s": 120},
        )
    )
    await sidecar_on_node.start(wait_ready=False)
    await take_all(nb, quarantined, ids, sidecar=sidecar_on_node)
    await sidecar_on_node.wait_ready()
    copies = Tally()
    await copies.take(nb, ok)
    assert copies.copies() == dict.fromkeys(ids, 3)
    retried = await sidecar_on_node.metric("acemq_sidecar_retried_copies_total", route="nack")
    assert retried == 2 * len(ids)
    report(
        "nacked by one of two target queues",
        messages=len(ids),
        lost=0,
        copies_in_the_other_queue=sum(copies.copies().values()),
        retried_copies_total=retried,
    )


async def test_while_the_broker_blocks_nothing_is_published_and_sigterm_settles_in_time(
    nb: Broker, sidecar_on_node: Sidecar, node: PrivateNode
) -> None:
    """A memory alarm: /readyz says why, SIGTERM exits 0 within the grace.

    broker_blocked is 1 meanwhile; after the alarm nothing is lost or duplicated: the
    alarm is on before the first publish, which the publish gate's probe meets.
    """
    staging = await nb.queue("blocked.staging")
    exchange = await nb.exchange("blocked.target")
    target = await nb.queue("blocked.out")
    await nb.bind(target, exchange)
    quarantine, _ = await declare_quarantine(nb)
    ids = make_ids("blocked", 200)
    await publish_ids(nb, staging, ids)
    sidecar_on_node.write(
        route_map(sidecar_on_node, quarantine=quarantine, routes=[route("b", staging, exchange)])
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
        assert await sidecar_on_node.metric("acemq_sidecar_broker_blocked") == 1
        sidecar_on_node.send(signal.SIGTERM)
        assert await sidecar_on_node.wait_exit(timeout_s=10 + 10) == 0
    finally:
        await node.ctl.run("set_vm_memory_high_watermark", "0.4")
    await sidecar_on_node.start()
    taken = await take_all(nb, target, ids, sidecar=sidecar_on_node)
    # RabbitMQ blocks a connection when it first reads a publish during an alarm, and reads
    # nothing more until it clears: the publish gate's probe meets the alarm, the copies
    # wait for its answer, and SIGTERM lets them go unwritten (sidecar/flow/publish_gate.py).
    copies = taken.copies()
    twice = sorted(id_ for id_, n in copies.items() if n > 1)
    duplicates = sum(copies.values()) - len(ids)
    assert duplicates == 0, f"{duplicates} duplicates: {twice}\n{sidecar_on_node.output()}"
    report(
        "connection.blocked, SIGTERM, then unblocked",
        messages=len(ids),
        lost=0,
        duplicates=duplicates,
    )
