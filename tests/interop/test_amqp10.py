"""AMQP 1.0 on either side of the sidecar, on private RabbitMQ 4.0 and 4.3 nodes.

RabbitMQ 4 speaks AMQP 1.0 natively on the AMQP port and converts between 1.0 and 0-9-1.
Two flows, read field by field (python-qpid-proton, the Apache Qpid client):

- a publisher over 1.0 into the staging queue (``/queues/NAME``), the envelope in the
  application properties (as an application sets them) or in the message annotations:
  what the sidecar consumes over 0-9-1, and what it relays or quarantines;
- a canonical envelope published over 0-9-1, relayed, and read over 1.0 from the target
  queue: where each envelope field lands (a message annotation or an application
  property) and with which AMQP 1.0 type.

docs/interop.md ("AMQP 1.0") has the mapping these tests pin down.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from pamqp.commands import Basic
from proton import Message, int32, symbol
from proton.utils import BlockingConnection, ConnectionClosed

from sidecar.wire import Int32, Int64, Timestamp
from tests.brokers import LOCAL, VersionedNode, node_name, version_slug, versioned_node
from tests.e2e.conftest import ID_HEADER, Sidecar, declare_flow, declare_quarantine, eventually
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.private_node import PrivateNode

pytestmark = [pytest.mark.e2e, pytest.mark.version_changed, pytest.mark.timeout(180)]

FIRST_SEEN = 1_767_323_045_678
RECEIVE_TIMEOUT_S = 30.0
LONG_TEXT = "é" * 200  # 400 bytes of UTF-8: over the 255 of a 1.0 short string


@pytest.fixture(scope="module")
def versioned(broker_version: str) -> Iterator[VersionedNode]:
    """A private node of the version; none before 4.0 (where AMQP 1.0 is a plugin)."""
    if broker_version == LOCAL:
        pytest.skip("AMQP 1.0 is native from RabbitMQ 4.0: run with --broker-versions=4.0,4.3")
    name = node_name(f"a10-{version_slug(broker_version)}")
    with versioned_node(broker_version, name) as started:
        yield started


@pytest.fixture(scope="module")
def node(versioned: VersionedNode) -> PrivateNode:
    """The node of ``versioned`` (for the shared ``nb`` and ``sidecar_on_node``)."""
    return versioned.node


def report(versioned: VersionedNode, test: str, **fields: object) -> None:
    """Print what arrived (for docs/interop.md)."""
    line = json.dumps({"rabbitmq": versioned.version, "test": test, **fields}, default=str)
    print(f"\namqp10: {line}")  # noqa: T201 - the measurement the suite reports


def url_10(node: PrivateNode) -> str:
    """The node's URL for the 1.0 client (same port, same guest login)."""
    return f"amqp://guest:guest@127.0.0.1:{node.amqp_port}"


def send_10(node: PrivateNode, queue: str, messages: list[Message]) -> None:
    """Send messages over AMQP 1.0 to a queue, each settled by the broker."""
    connection = BlockingConnection(url_10(node), allowed_mechs="PLAIN")
    try:
        sender = connection.create_sender(f"/queues/{queue}")
        for message in messages:
            sender.send(message)
    finally:
        connection.close()


def receive_10(node: PrivateNode, queue: str, count: int) -> list[Message]:
    """Receive ``count`` messages over AMQP 1.0 from a queue, accepting each."""
    connection = BlockingConnection(url_10(node), allowed_mechs="PLAIN")
    try:
        receiver = connection.create_receiver(f"/queues/{queue}")
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=RECEIVE_TIMEOUT_S))
            receiver.accept()
        return got
    finally:
        connection.close()


def envelope_10(msg_id: str) -> dict[Any, Any]:
    """The canonical envelope with AMQP 1.0 types of the same widths as 0-9-1's."""
    return {
        ID_HEADER: msg_id,
        "x-acemq-type": "order.placed",
        "x-acemq-version": int32(1),
        "x-acemq-correlation": msg_id,
        "x-acemq-attempt": int32(1),
        "x-acemq-first-seen": FIRST_SEEN,  # a Python int: a 1.0 long
    }


async def take_all(nb: Broker, queue: str, count: int) -> dict[str, Any]:
    """Get ``count`` messages over 0-9-1; return each one's properties, by message id."""
    got: dict[str, Any] = {}

    async def complete() -> bool:
        message = await nb.channel.basic_get(queue, no_ack=True)
        if isinstance(message.delivery, Basic.GetOk):
            properties = message.header.properties
            got[str(properties.message_id)] = properties
        return len(got) >= count

    await eventually(complete, timeout_s=60, what=f"{count} on {queue}")
    return got


def kinds(table: dict[Any, Any]) -> dict[str, str]:
    """Each key of a header table or 1.0 map, with its Python (proton: AMQP) type's name."""
    return {str(key): type(value).__name__ for key, value in sorted(table.items(), key=str)}


async def test_a_publisher_over_amqp_1_0_into_staging(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """The envelope as 1.0 application properties, or as message annotations.

    Both arrive over 0-9-1 as headers of the same names and are relayed as canonical; the
    message id and type come from the 1.0 properties.
    """
    flow = await declare_flow(nb, "a10in")
    quarantine, quarantined = await declare_quarantine(nb)
    as_properties = Message(
        body=b'{"n": 1}',
        id="a10-props",
        content_type="application/json",
        properties=envelope_10("a10-props"),
    )
    as_annotations = Message(
        body=b'{"n": 2}',
        id="a10-annotations",
        content_type="application/json",
        annotations={symbol(key): value for key, value in envelope_10("a10-annotations").items()},
    )
    await asyncio.to_thread(send_10, versioned.node, flow.staging, [as_properties, as_annotations])
    sidecar_on_node.write(sidecar_on_node.route_map(quarantine=quarantine, flows=[flow]))
    await sidecar_on_node.start()
    relayed = await take_all(nb, flow.target, 2)
    assert await nb.depth(quarantined) == 0
    seen = {}
    for msg_id, properties in relayed.items():
        headers = dict(properties.headers or {})
        seen[msg_id] = {"headers": headers, "types": kinds(headers)}
        assert headers[ID_HEADER] == msg_id
        assert headers["x-acemq-type"] == "order.placed"
        assert headers["x-acemq-version"] == 1
        assert headers["x-acemq-attempt"] == 1
        assert headers["x-acemq-first-seen"] == FIRST_SEEN
        assert properties.content_type == "application/json"
    report(versioned, "1.0 publisher into staging, relayed, read over 0-9-1", relayed=seen)


async def test_a_consumer_over_amqp_1_0_of_the_target_queue(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A canonical envelope relayed, read over 1.0: every field, where and of what type."""
    flow = await declare_flow(nb, "a10out")
    quarantine, _ = await declare_quarantine(nb)
    headers = {
        ID_HEADER: "a10-out",
        "x-acemq-type": "order.placed",
        "x-acemq-version": Int32(1),
        "x-acemq-correlation": "a10-out",
        "x-acemq-attempt": Int32(1),
        "x-acemq-first-seen": Int64(FIRST_SEEN),
        "x-acemq-origin": "checkout@app-7",
        "tenant": "acme",  # application headers, not x-
        "tags": ["a", "b"],
        "dims": {"w": Int32(3)},
        "long-text": LONG_TEXT,
    }
    await nb.publish(
        flow.staging,
        body=b'{"n": 3}',
        headers=headers,
        message_id="a10-out",
        correlation_id="a10-out",
        content_type="application/json",
        timestamp=Timestamp(1_767_323_045),
        app_id="checkout",
    )
    sidecar_on_node.write(sidecar_on_node.route_map(quarantine=quarantine, flows=[flow]))
    await sidecar_on_node.start()
    (message,) = await asyncio.to_thread(receive_10, versioned.node, flow.target, 1)
    annotations = {str(key): value for key, value in (message.annotations or {}).items()}
    properties: dict[str, Any] = dict(message.properties or {})
    report(
        versioned,
        "relayed, read over 1.0",
        id=message.id,
        correlation_id=message.correlation_id,
        content_type=message.content_type,
        creation_time=message.creation_time,
        annotations=kinds(annotations),
        application_properties=kinds(properties),
        values={**annotations, **properties, "long-text": f"{len(LONG_TEXT.encode())} bytes"},
    )
    assert message.id == "a10-out"
    assert message.correlation_id == "a10-out"
    envelope = {name: value for name, value in headers.items() if name.startswith("x-")}
    for name, value in envelope.items():
        assert name in annotations, f"{name} not a message annotation: {annotations}"
        assert annotations[name] == value, (name, annotations[name])
        assert name not in properties
    assert properties.get("tenant") == "acme"
    assert properties.get("long-text") == LONG_TEXT  # a string still, at 400 bytes
    assert "tags" not in properties  # arrays and tables in headers without x- are dropped
    assert "dims" not in properties
    assert type(annotations["x-acemq-version"]).__name__ == "int32"
    assert type(annotations["x-acemq-first-seen"]) is int  # a 1.0 long, as proton gives it


async def test_a_relayed_decimal_header_ends_the_amqp_1_0_consumers_session(
    versioned: VersionedNode, nb: Broker, sidecar_on_node: Sidecar
) -> None:
    """A decimal header, kept as it came, cannot be read over 1.0.

    RabbitMQ 4.0.5 and 4.3.6 cannot convert it (``mc_amqpl:from_091`` has no clause for
    it) and end the consumer's session with ``amqp:internal-error``: a 1.0 consumer never
    gets such a message; a 0-9-1 consumer does.
    """
    flow = await declare_flow(nb, "a10dec")
    quarantine, _ = await declare_quarantine(nb)
    await nb.publish(
        flow.staging,
        headers={ID_HEADER: "a10-dec", "price": Decimal("1.25")},
        message_id="a10-dec",
    )
    sidecar_on_node.write(sidecar_on_node.route_map(quarantine=quarantine, flows=[flow]))
    await sidecar_on_node.start()

    async def relayed() -> bool:
        return await nb.depth(flow.target) == 1

    await eventually(relayed, timeout_s=30, what="the decimal message relayed")
    with pytest.raises(ConnectionClosed) as ended:
        await asyncio.to_thread(receive_10, versioned.node, flow.target, 1)
    assert "decimal" in str(ended.value), ended.value
    assert await nb.depth(flow.target) == 1  # still there, for a 0-9-1 consumer
    report(versioned, "decimal header read over 1.0", error=str(ended.value)[:160])
