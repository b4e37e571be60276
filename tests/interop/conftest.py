"""One interop run per module: publish the message set, relay it, let every client read it.

The topology, on the real broker: a fanout staging exchange feeding the staging queue (so a
message keeps any routing key, the empty one included), ``acemq-sidecar run`` as a process
(tests/e2e/conftest.py's :class:`Sidecar`, on a generated route map) relaying to a direct
target exchange, and for every message one queue per client plus a ``reference`` queue,
bound with the message's routing key. The reference copy is read in-process with the
project's codec, which keeps every wire tag. Messages marked ``raw`` also go straight into
one more queue per client, without the sidecar. Then each client's program runs once over
all its queues, the clients side by side.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Flow, Sidecar, declare_quarantine, eventually
from tests.interop.canonical import CLIENTS
from tests.interop.clients import Missing, Output, Program, consume, prepare
from tests.interop.messages import MESSAGES, RAW, Message
from tests.support import Broker, open_broker

RELAY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PROPERTY_NAMES = (
    "app_id",
    "cluster_id",
    "content_encoding",
    "content_type",
    "correlation_id",
    "delivery_mode",
    "expiration",
    "message_id",
    "priority",
    "reply_to",
    "timestamp",
    "type",
    "user_id",
)


@dataclass(frozen=True, slots=True)
class Copy:
    """A relayed message as the project's codec reads it: the wire tags kept."""

    headers: dict[str, Any]
    properties: dict[str, Any]
    body: bytes


@dataclass
class Run:
    """Everything one interop run saw."""

    programs: dict[str, Program]
    missing: dict[str, Missing]
    relayed: dict[tuple[str, str], str] = field(default_factory=dict)  # (client, message) -> queue
    raw: dict[tuple[str, str], str] = field(default_factory=dict)
    reference: dict[str, Copy] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)  # body -> x-acemq-error
    outputs: dict[str, Output] = field(default_factory=dict)

    def require(self, client: str) -> Output:
        """The client's output; skip (or, under CI=true, fail) when its toolchain is missing."""
        if client in self.missing:
            reason = self.missing[client].message()
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{reason} (CI must run every interop client)")
            pytest.skip(reason)
        output = self.outputs[client]
        problem = output.problem(_queues(self, client))
        assert problem is None, problem
        return output

    def line(self, client: str, message: str, *, raw: bool = False) -> dict[str, Any]:
        """The line a client printed for one message (relayed, or the raw copy)."""
        queue = (self.raw if raw else self.relayed)[client, message]
        return self.outputs[client].lines[queue]


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Program | Missing]:
    """Every client's consumer, built once per session (or why it cannot run here)."""
    build = tmp_path_factory.mktemp("interop-build")
    return {client: prepare(client, build) for client in CLIENTS}


@pytest.fixture(scope="module")
def interop(
    amqp_url: str,
    programs: dict[str, Program | Missing],
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """The one run every interop test reads."""
    run = Run(
        programs={c: p for c, p in programs.items() if isinstance(p, Program)},
        missing={c: p for c, p in programs.items() if isinstance(p, Missing)},
    )
    workdir = tmp_path_factory.mktemp("interop-sidecar")
    asyncio.run(_interop(run, amqp_url, workdir))
    return run


async def _interop(run: Run, amqp_url: str, workdir: Path) -> None:
    async with open_broker(amqp_url) as broker:
        topology = await _topology(broker, run)
        for message in MESSAGES:
            await _publish(broker, message, exchange=topology.publish, routing_key=message.key)
        sidecar = Sidecar(amqp_url=amqp_url, workdir=workdir)
        try:
            route_map = sidecar.route_map(quarantine=topology.quarantine, flows=[topology.flow])
            sidecar.write(route_map)
            await sidecar.start()
            await eventually(
                _settled(sidecar, len(MESSAGES)),
                timeout_s=RELAY_TIMEOUT_S,
                what=f"the sidecar to settle all {len(MESSAGES)} messages",
                context=sidecar.output,
            )
            sidecar.send(signal.SIGTERM)
            await sidecar.wait_exit(timeout_s=STOP_TIMEOUT_S)
        finally:
            await sidecar.kill()
        for copy in await broker.drain(topology.quarantined):
            reason = (copy.header.properties.headers or {}).get("x-acemq-error")
            run.quarantined[copy.body.decode(errors="replace")] = str(reason)
        for message in MESSAGES:
            if message.name in run.quarantined:
                continue
            got = await broker.drain(run.relayed["reference", message.name])
            if got:
                run.reference[message.name] = _copy(got[0])
        outputs = await asyncio.gather(
            *(
                consume(program, amqp_url, _queues(run, client))
                for client, program in run.programs.items()
            )
        )
        run.outputs = {output.client: output for output in outputs}


@dataclass(frozen=True, slots=True)
class Topology:
    """The run's exchanges and queues besides the per-message ones."""

    flow: Flow  # the route: staging queue -> target exchange, routing key kept
    publish: str  # the fanout exchange in front of the staging queue
    quarantine: str  # the quarantine exchange
    quarantined: str  # the queue bound to it


async def _topology(broker: Broker, run: Run) -> Topology:
    """Declare everything, and put the raw copies in their queues."""
    staging = await broker.queue("interop.staging")
    publish = await broker.exchange("interop.publish", kind="fanout")
    await broker.bind(staging, publish, routing_key="")
    target = await broker.exchange("interop.target", kind="direct")
    quarantine, quarantined = await declare_quarantine(broker)
    # No single target queue: each message has one queue per client, bound below.
    flow = Flow(name="interop", staging=staging, exchange=target, target="")
    for message in MESSAGES:
        for client in (*CLIENTS, "reference"):
            queue = await broker.queue(f"{client}.{message.name}")
            await broker.bind(queue, target, routing_key=message.key)
            run.relayed[client, message.name] = queue
    for message in RAW:
        for client in CLIENTS:
            queue = await broker.queue(f"raw.{client}.{message.name}")
            await _publish(broker, message, exchange="", routing_key=queue)
            run.raw[client, message.name] = queue
    return Topology(flow=flow, publish=publish, quarantine=quarantine, quarantined=quarantined)


async def _publish(broker: Broker, message: Message, *, exchange: str, routing_key: str) -> None:
    await broker.publish(
        routing_key,
        body=message.name.encode(),
        headers=dict(message.headers),
        exchange=exchange,
        routing_key=routing_key,
        **message.properties,
    )


def _settled(sidecar: Sidecar, count: int) -> Any:
    async def check() -> bool:
        return await sidecar.metric("acemq_sidecar_messages_total") >= count

    return check


def _copy(message: Any) -> Copy:
    props = message.header.properties
    values = {name: getattr(props, name, None) for name in PROPERTY_NAMES if name != "type"}
    values["type"] = props.message_type
    return Copy(headers=dict(props.headers or {}), properties=values, body=message.body)


def _queues(run: Run, client: str) -> list[str]:
    relayed = [q for (c, name), q in run.relayed.items() if c == client and name in run.reference]
    return relayed + [q for (c, _), q in run.raw.items() if c == client]
