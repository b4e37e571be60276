"""A message's dead-letter history (``x-death``) across the relay, on each broker version.

A message dead-lettered into staging arrives with the broker's ``x-death``; the sidecar
publishes its copy with that header as it came. When the target queue dead-letters the
copy again, RabbitMQ 3.10 reads the client's ``x-death`` and adds its own entry to it (the
history is whole); from 4.0 an ``x-`` header a client published belongs to the broker and
is not read back: the new ``x-death`` holds the target's entry only. What the test measures
is written in docs/compatibility.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from pamqp.commands import Basic

from tests.brokers import LOCAL
from tests.integration.conftest import make_topology, route_map_yaml

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiormq.abc

    from tests.support import Broker

pytestmark = pytest.mark.integration

TAKE_TIMEOUT_S = 15.0

ENVELOPE = {
    "x-acemq-id": "dl-1",
    "x-acemq-type": "order.placed",
    "x-acemq-version": 1,
    "x-acemq-correlation": "dl-1",
    "x-acemq-attempt": 1,
    "x-acemq-first-seen": 1_767_323_045_000,
}


def deaths(message: aiormq.abc.DeliveredMessage) -> list[tuple[str, str, int]]:
    """The message's ``x-death`` entries as (queue, reason, count), newest first."""
    entries: Any = (message.header.properties.headers or {})["x-death"]
    return [(str(e["queue"]), str(e["reason"]), int(e["count"])) for e in entries]


async def get_one(broker: Broker, queue: str) -> aiormq.abc.DeliveredMessage:
    """The next message of ``queue`` (waiting for it), unacked: the test settles it."""
    async with asyncio.timeout(TAKE_TIMEOUT_S):
        while True:
            message = await broker.channel.basic_get(queue, no_ack=False)
            if isinstance(message.delivery, Basic.GetOk):
                return message
            await asyncio.sleep(0.02)


@pytest.mark.version_changed
async def test_a_relayed_copy_dead_lettered_again_keeps_its_history_on_3_10_only(
    broker: Broker, run_sidecar: Callable[..., Any], broker_version: str
) -> None:
    """Expired into staging, relayed, rejected from the target: which entries ``x-death`` holds."""
    topo = await make_topology(broker, "death")
    dead = await broker.exchange("dead", "fanout")
    dead_letters = await broker.queue("dead-letters")
    await broker.bind(dead_letters, dead, "")
    target = await broker.queue("out.dying", **{"x-dead-letter-exchange": dead})
    await broker.bind(target, topo.target_exchange, "#")
    expiring = await broker.queue(
        "expiring",
        **{"x-message-ttl": 0, "x-dead-letter-exchange": topo.staging_exchange},
    )
    route = {"name": "r1", "from": topo.staging, "exchange": topo.target_exchange}
    async with run_sidecar(route_map_yaml(broker.url, topo.quarantine_exchange, [route])):
        await broker.publish(expiring, headers=ENVELOPE, message_id="dl-1")
        relayed = await get_one(broker, target)
    assert deaths(relayed) == [(expiring, "expired", 1)]  # as staging had it
    assert isinstance(relayed.delivery, Basic.GetOk)
    await broker.channel.basic_reject(int(relayed.delivery.delivery_tag or 0), requeue=False)
    (again,) = await broker.take(dead_letters, 1)
    if broker_version == LOCAL:  # 3.10 reads the copy's x-death and adds to it
        assert deaths(again) == [(target, "rejected", 1), (expiring, "expired", 1)]
    else:  # 4.x: the client's x-death is not read back; the broker's history starts anew
        assert deaths(again) == [(target, "rejected", 1)]
    assert (again.header.properties.headers or {})["x-acemq-id"] == "dl-1"
