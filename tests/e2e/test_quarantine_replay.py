"""The runbook end to end: a running sidecar quarantines, the operator replays, it is judged again.

A message replayed unfixed is refused again and comes back to quarantine with its replay
count one higher; a message whose cause was fixed (a missing binding) is relayed, stamped
as a replay. And a replay started the moment a ``list`` returns reads every message: the
list gave back all it held before returning.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys

import pytest
from pamqp.commands import Basic

from sidecar.broker import BrokerAddress
from sidecar.clock import Clock
from sidecar.quarantine import tool as quarantine_tool
from sidecar.quarantine.rows import Selection
from tests.conftest import REPO
from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
)
from tests.support import Broker

pytestmark = pytest.mark.timeout(90)

WAIT_S = 30.0
ROUNDS = 8


async def replay(url: str, *args: str) -> tuple[int, str]:
    """Run ``python -m sidecar quarantine replay ...``; return its status and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "quarantine",
        "replay",
        *args,
        cwd=REPO,
        env={**os.environ, "AMQP_URL": url},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(WAIT_S):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def one_quarantined(broker: Broker, queue: str, sidecar: Sidecar) -> dict[str, object]:
    """Wait for the quarantine queue to hold one message; take it; return its headers."""
    await eventually(
        lambda: _depth(broker, queue, 1),
        timeout_s=WAIT_S,
        what=f"one message in {queue}",
        context=sidecar.output,
    )
    message = await broker.channel.basic_get(queue, no_ack=False)
    assert isinstance(message.delivery, Basic.GetOk)
    assert message.delivery.delivery_tag is not None
    # Put it back where it was: the next replay reads it from the queue.
    await broker.channel.basic_nack(message.delivery.delivery_tag, requeue=True)
    return dict(message.header.properties.headers or {})


async def _depth(broker: Broker, queue: str, count: int) -> bool:
    return await broker.depth(queue) == count


async def test_a_replay_refused_again_comes_back_counted(broker: Broker, sidecar: Sidecar) -> None:
    """Replayed twice unfixed: back in quarantine each time, acemq-replay-count 1, then 2."""
    exchange, quarantine = await declare_quarantine(broker)
    flow = await declare_flow(broker, "apps")
    route = {**flow.route(), "publishers": "apps"}
    sidecar.write({**sidecar.route_map(quarantine=exchange, flows=[flow]), "routes": [route]})
    await sidecar.start()
    await broker.publish(flow.staging, headers={"x-acemq-tenant": "acme"}, message_id="t-1")

    first = await one_quarantined(broker, quarantine, sidecar)
    assert "acemq-replay-count" not in first
    reason = first["x-acemq-error"]
    assert isinstance(reason, str)
    assert '"x-acemq-tenant" is in the reserved' in reason

    for count in (1, 2):
        status, output = await replay(broker.url, quarantine)
        assert status == 0, output
        assert output.startswith("replayed 1, skipped 0 (not selected), failed 0, of 1 read")
        again = await one_quarantined(broker, quarantine, sidecar)
        assert again["acemq-replay-count"] == count
        assert again["acemq-replayed-from"] == quarantine
        assert again["x-acemq-error"] == reason
        assert again["acemq-quarantined-from"] == flow.staging
        assert again["x-acemq-tenant"] == "acme"
        assert "acemq-original-error" not in again  # the reason is the sidecar's, not displaced


async def test_a_fixed_message_is_relayed_stamped_as_a_replay(
    broker: Broker, sidecar: Sidecar
) -> None:
    """Unroutable until the binding exists; replayed after the fix, it reaches the target."""
    exchange, quarantine = await declare_quarantine(broker)
    flow = await declare_flow(broker, "orders", with_exchange=False)
    await broker.channel.exchange_declare(flow.exchange, exchange_type="topic", durable=True)
    broker.exchanges.append(flow.exchange)
    sidecar.write(sidecar.route_map(quarantine=exchange, flows=[flow]))
    await sidecar.start()
    await broker.publish(
        flow.staging, headers={"x-acemq-id": "o-1", "x-app": "kept"}, message_id="o-1"
    )
    quarantined = await one_quarantined(broker, quarantine, sidecar)
    assert str(quarantined["x-acemq-error"]).startswith("unroutable:")

    await broker.bind(flow.target, flow.exchange, "#")  # the fix
    status, output = await replay(broker.url, quarantine, "--reason", "unroutable")
    assert status == 0, output
    (relayed,) = await broker.take(flow.target, 1, timeout_s=WAIT_S)
    headers = relayed.header.properties.headers or {}
    assert headers["x-acemq-id"] == "o-1"
    assert headers["x-app"] == "kept"
    assert headers["acemq-replay-count"] == 1
    assert headers["acemq-replayed-from"] == quarantine
    assert "x-acemq-error" not in headers
    assert "acemq-quarantined-from" not in headers
    assert await broker.depth(quarantine) == 0


@pytest.mark.parametrize(
    ("queue_type", "messages"),
    # The least that showed the gap (short by a window of the reader's 1,000 or all of it):
    # a quorum queue in 6 of 10 lists of 1 message and of 100; a classic queue first at
    # 2,000 (two windows), in 3 of 10 lists of 3,000.
    [("quorum", 100), ("classic", 3000)],
)
async def test_a_replay_right_after_a_list_reads_every_message(
    broker: Broker, queue_type: str, messages: int
) -> None:
    """``list``, then at once ``replay --dry-run``, eight times: each reads every message.

    The broker puts what a closed channel held unacked back in the queue after the
    channel's close-ok (a quorum queue when its leader has applied the consumer's end, a
    classic one when its process has taken the channel's exit), so a command that returns
    at the close-ok leaves its messages out of the count for a moment.
    """
    queue = await broker.queue("quarantine", **{"x-queue-type": queue_type})
    await publish_ids(broker, queue, make_ids("q", messages))
    target = quarantine_tool.BrokerTarget(address=BrokerAddress.parse(broker.url))
    connection = await quarantine_tool.open_connection(target)
    listed: list[int] = []
    counted: list[int] = []
    try:
        for _ in range(ROUNDS):
            report = await quarantine_tool.list_messages(
                connection, queue, Selection(), now_ms=0, on_row=lambda _row: None
            )
            listed.append(report.read)
            replay = await quarantine_tool.replay_messages(
                connection,
                queue,
                Selection(),
                to=queue,
                dry_run=True,
                clock=Clock.system(),
                progress=io.StringIO(),
            )
            counted.append(replay.read.at_start)
    finally:
        await connection.close()
    assert listed == [messages] * ROUNDS, f"the lists read {listed} of {messages}"
    assert counted == [messages] * ROUNDS, f"the replays counted {counted} of {messages}"
    assert await broker.depth(queue) == messages
