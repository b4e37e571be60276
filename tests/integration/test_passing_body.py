"""A body over ``broker.max_body_bytes`` against a real broker: passed through, never held.

The sidecar publishes its quarantine copy as the body's frames arrive, on the publishing
connection; until the broker confirms it the delivery stays unacked, and a copy the broker
does not take is given back to staging (the body is gone from the sidecar) to pass
through again, its waits growing from round to round. Another route on the same
connections relays on meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Callable
from typing import Any

import aiormq
import pytest

from sidecar.contract import ERROR as ERROR_HEADER
from tests.brokers import differs_on
from tests.integration.conftest import route_map_yaml, wait_for
from tests.support import Broker

pytestmark = pytest.mark.integration

MIB = 2**20
LIMIT = 256 * 1024


async def test_a_body_over_the_limit_goes_to_quarantine_whole_while_another_route_relays(
    broker: Broker, run_sidecar: Callable[..., Any], request: pytest.FixtureRequest
) -> None:
    """Unroutable at first (no queue bound): given back, then quarantined once one is."""
    differs_on(
        request,
        ("4.0", "4.3"),
        "4.x's default max_message_size (16 MiB) refuses the test's 20 MiB"
        " body at its publish into staging",
        raises=aiormq.exceptions.ChannelPreconditionFailed,
    )
    staging, other = await broker.queue("staging.passing"), await broker.queue("staging.other")
    target = await broker.exchange("target.passing", "fanout")
    relayed = await broker.queue("relayed.passing")
    await broker.bind(relayed, target, "")
    quarantine = await broker.exchange("quarantine.passing", "fanout")
    routes = [
        {"name": "big", "from": staging, "exchange": target},
        {"name": "other", "from": other, "exchange": target},
    ]
    text = route_map_yaml(broker.url, quarantine, routes, max_body_bytes=LIMIT)
    body = random.Random(3).randbytes(20 * MIB)
    async with run_sidecar(text) as running:
        await broker.publish(staging, headers={"x-acemq-id": "big-1"}, body=body)
        for index in range(200):
            await broker.publish(other, headers={"x-acemq-id": f"o-{index}"})
        copies = await broker.take(relayed, 200, timeout_s=30)
        ids = sorted(str((m.header.properties.headers or {})["x-acemq-id"]) for m in copies)
        assert ids == sorted(f"o-{index}" for index in range(200))
        await wait_for(
            lambda: "quarantine" in running.service.readiness().detail,
            timeout_s=20,
            what="the big route says its quarantine copy is not taken",
        )
        held = await broker.queue("quarantined.passing")
        await broker.bind(held, quarantine, "")
        (message,) = await broker.take(held, 1, timeout_s=60)
        await wait_for(
            lambda: (
                running.sample("acemq_sidecar_messages_total", route="big", outcome="quarantined")
                == 1
            ),
            timeout_s=20,
            what="counted quarantined once confirmed",
        )
        await wait_for(lambda: running.service.readiness().ok, timeout_s=20, what="resumed")
    assert hashlib.sha256(message.body).digest() == hashlib.sha256(body).digest()
    headers = dict(message.header.properties.headers or {})
    assert headers["x-acemq-id"] == "big-1"
    assert "body too large to hold" in str(headers[ERROR_HEADER])
    assert await broker.depth(staging) == 0
    assert await broker.depth(relayed) == 0


async def test_a_copy_not_taken_gives_the_delivery_back_with_growing_waits(
    broker: Broker, run_sidecar: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Each round costs a quorum queue a delivery: a few seconds apart, and none lost.

    A quorum staging queue with a delivery limit of 5, the quarantine unbound for 10 s:
    at most two rounds, the message still in staging; bound, it is quarantined.
    """
    staging = await broker.queue(
        "staging.rounds", **{"x-queue-type": "quorum", "x-delivery-limit": 5}
    )
    target = await broker.exchange("target.rounds", "fanout")
    quarantine = await broker.exchange("quarantine.rounds", "fanout")
    routes = [{"name": "big", "from": staging, "exchange": target}]
    text = route_map_yaml(broker.url, quarantine, routes, max_body_bytes=LIMIT)
    body = random.Random(5).randbytes(4 * MIB)
    caplog.set_level(logging.WARNING, logger="sidecar.relay")

    def rounds() -> int:
        return sum("gave a message back" in record.getMessage() for record in caplog.records)

    async with run_sidecar(text):
        await broker.publish(staging, headers={"x-acemq-id": "big-2"}, body=body)
        await wait_for(lambda: rounds() >= 1, timeout_s=20, what="a first round")
        await asyncio.sleep(10)
        assert rounds() <= 3, f"{rounds()} rounds in 10 s"
        held = await broker.queue("quarantined.rounds")
        await broker.bind(held, quarantine, "")
        (message,) = await broker.take(held, 1, timeout_s=60)
    assert hashlib.sha256(message.body).digest() == hashlib.sha256(body).digest()
    assert await broker.depth(staging) == 0
