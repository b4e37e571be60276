"""Tracing end to end: the sidecar process, the real broker and an OTLP receiver of the test's.

The receiver is an HTTP server on 127.0.0.1 that decodes each ``ExportTraceServiceRequest``
with ``opentelemetry-proto``, as a collector would. A relayed, a repaired and a quarantined
message, each carrying a producer's ``traceparent``, must come out as spans with the
messaging conventions' attributes under the producer's span, the violations as events, and
the delivered messages' ``traceparent`` as the producer wrote it. A collector that is not
there must cost the flow nothing: every message relayed, the spans dropped and counted.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from sidecar.wire import Int32, Int64
from tests.e2e.conftest import (
    Sidecar,
    declare_quarantine,
    eventually,
    free_port,
    make_ids,
    take_until,
)
from tests.support import Broker

pytestmark = pytest.mark.e2e

SETTLE_TIMEOUT_S = 30.0
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACES = {  # message id -> the producer's trace id
    "t-relayed": "4bf92f3577b34da6a3ce929d0e0e4736",
    "t-repaired": "5bf92f3577b34da6a3ce929d0e0e4737",
    "t-quarantined": "6bf92f3577b34da6a3ce929d0e0e4738",
}


def traceparent(message_id: str) -> str:
    return f"00-{TRACES[message_id]}-{PRODUCER_SPAN}-01"


@dataclass
class Received:
    """What the receiver decoded: the spans, with their resource's attributes."""

    spans: list[tuple[dict[str, Any], Span]] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def all(self) -> list[tuple[dict[str, Any], Span]]:
        """Return every span received so far, with its resource's attributes."""
        with self.lock:
            return list(self.spans)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes(span: Span) -> dict[str, Any]:
    """Return a span's attributes as plain values."""
    return {kv.key: _value(kv.value) for kv in span.attributes}


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP trace receiver on a free port; its base URL and what it received."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            with received.lock:
                received.requests += 1
                for resource_spans in request.resource_spans:
                    resource = {
                        kv.key: _value(kv.value) for kv in resource_spans.resource.attributes
                    }
                    for scope_spans in resource_spans.scope_spans:
                        received.spans.extend((resource, span) for span in scope_spans.spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Topology:
    """Producers publish to ``inbound``; the route relays staging to ``exchange``."""

    inbound: str  # the exchange producers publish to, bound to staging with "#"
    staging: str
    exchange: str  # the target: order.# only, so refund.* is unroutable
    target: str
    quarantine: str
    quarantine_queue: str


@pytest.fixture
async def topology(broker: Broker) -> Topology:
    inbound = await broker.exchange("in")
    staging = await broker.queue("staging")
    await broker.bind(staging, inbound, routing_key="#")
    exchange = await broker.exchange("orders")
    target = await broker.queue("target")
    await broker.bind(target, exchange, routing_key="order.#")
    quarantine, quarantine_queue = await declare_quarantine(broker)
    return Topology(inbound, staging, exchange, target, quarantine, quarantine_queue)


def route_map(sidecar: Sidecar, topology: Topology, tracing: dict[str, Any]) -> dict[str, Any]:
    return {
        "broker": {"url": sidecar.amqp_url, "connect_timeout_s": 5},
        "http": {"listen": f"127.0.0.1:{sidecar.port}"},
        "quarantine": {"exchange": topology.quarantine},
        "shutdown_grace_s": 10,
        "tracing": tracing,
        "routes": [
            {
                "name": "orders",
                "from": topology.staging,
                "to": {"exchange": topology.exchange, "routing_key": "keep"},
            }
        ],
    }


def envelope(message_id: str, **extra: Any) -> dict[str, Any]:
    """A canonical envelope with the producer's traceparent."""
    return {
        "x-acemq-id": message_id,
        "x-acemq-type": "order.placed",
        "x-acemq-version": Int32(1),
        "x-acemq-correlation": message_id,
        "x-acemq-attempt": Int32(1),
        "x-acemq-first-seen": Int64(1_767_323_045_678),
        "x-acemq-origin": "checkout@app-7",
        "traceparent": traceparent(message_id),
        **extra,
    }


async def test_spans_for_a_relayed_a_repaired_and_a_quarantined_message(
    broker: Broker,
    sidecar: Sidecar,
    topology: Topology,
    receiver: tuple[str, Received],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, received = receiver
    monkeypatch.setenv("OTEL_SERVICE_NAME", "orders-relay")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    sidecar.write(route_map(sidecar, topology, {"endpoint": endpoint}))
    await sidecar.start()
    messages = [
        ("t-relayed", "order.placed", envelope("t-relayed")),
        ("t-repaired", "order.placed", envelope("t-repaired", **{"x-acemq-attempt": " 4 "})),
        ("t-quarantined", "refund.issued", envelope("t-quarantined")),
    ]
    for message_id, routing_key, headers in messages:
        await broker.publish(
            "",
            exchange=topology.inbound,
            routing_key=routing_key,
            headers=headers,
            message_id=message_id,
        )
    relayed = await broker.take(topology.target, 2)
    (quarantined,) = await broker.take(topology.quarantine_queue, 1)
    for message in (*relayed, quarantined):
        headers = message.header.properties.headers or {}
        assert headers["traceparent"] == traceparent(str(headers["x-acemq-id"]))

    def every_span() -> bool:  # three process spans, four send spans (one returned)
        return len(received.all()) >= 7

    await eventually(every_span, timeout_s=SETTLE_TIMEOUT_S, what="7 spans", context=sidecar.output)
    spans = received.all()
    assert {resource["service.name"] for resource, _ in spans} == {"orders-relay"}
    process = {
        attributes(span)["messaging.message.id"]: span
        for _, span in spans
        if span.kind == Span.SPAN_KIND_CONSUMER
    }
    assert set(process) == set(TRACES)
    for message_id, span in process.items():
        assert span.trace_id.hex() == TRACES[message_id]
        assert span.parent_span_id.hex() == PRODUCER_SPAN
        assert span.name == f"process {topology.staging}"
        routing_key = "refund.issued" if message_id == "t-quarantined" else "order.placed"
        assert {
            key: attributes(span)[key]
            for key in (
                "messaging.system",
                "messaging.operation.type",
                "messaging.destination.name",
                "messaging.rabbitmq.destination.routing_key",
                "messaging.message.conversation_id",
                "acemq.producer",
            )
        } == {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.destination.name": f"{topology.inbound}:{routing_key}:{topology.staging}",
            "messaging.rabbitmq.destination.routing_key": routing_key,
            "messaging.message.conversation_id": message_id,
            "acemq.producer": "checkout",
        }
    assert attributes(process["t-relayed"])["acemq.verdict"] == "relayed"
    assert attributes(process["t-repaired"])["acemq.verdict"] == "repaired"
    violations = [
        {kv.key: _value(kv.value) for kv in event.attributes}
        for event in process["t-repaired"].events
        if event.name == "acemq.violation"
    ]
    assert violations == [
        {"acemq.violation.kind": "coerced", "acemq.violation.header": "x-acemq-attempt"}
    ]
    quarantine = attributes(process["t-quarantined"])
    assert quarantine["acemq.verdict"] == "quarantined"
    assert quarantine["acemq.quarantine.reason"].startswith("unroutable:")

    sends: dict[bytes, list[Span]] = {}
    for _, span in spans:
        if span.kind == Span.SPAN_KIND_PRODUCER:
            sends.setdefault(span.parent_span_id, []).append(span)
    (relayed_send,) = sends[process["t-relayed"].span_id]
    assert relayed_send.name == f"send {topology.exchange}"
    assert relayed_send.trace_id.hex() == TRACES["t-relayed"]
    send = attributes(relayed_send)
    assert send["messaging.operation.type"] == "send"
    assert send["messaging.destination.name"] == f"{topology.exchange}:order.placed"
    assert send["acemq.publish.outcome"] == "confirmed"
    outcomes = {
        attributes(span)["acemq.copy"]: (attributes(span)["acemq.publish.outcome"], span.status)
        for span in sends[process["t-quarantined"].span_id]
    }
    assert outcomes["target"][0] == "returned"
    assert outcomes["target"][1].code == Status.STATUS_CODE_ERROR
    assert outcomes["quarantine"][0] == "confirmed"


async def test_a_collector_that_is_not_there_costs_the_flow_nothing(
    broker: Broker,
    sidecar: Sidecar,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    nobody = f"http://127.0.0.1:{free_port()}"
    sidecar.write(route_map(sidecar, topology, {"endpoint": nobody, "max_queue_size": 256}))
    await sidecar.start()
    ids = make_ids("flow", 20_000)
    batch = 250
    for start in range(0, len(ids), batch):
        await asyncio.gather(
            *(
                broker.publish(
                    "",
                    exchange=topology.inbound,
                    routing_key="order.placed",
                    headers=envelope("t-relayed", **{"x-acemq-id": id_}),
                    message_id=id_,
                )
                for id_ in ids[start : start + batch]
            )
        )
    taken = await take_until(broker, topology.target, ids, timeout_s=120, context=sidecar.output)
    assert set(taken) == set(ids)

    async def dropped() -> bool:
        return await sidecar.metric("acemq_sidecar_trace_spans_dropped_total") > 0

    await eventually(
        dropped, timeout_s=SETTLE_TIMEOUT_S, what="spans dropped", context=sidecar.output
    )
    assert (await sidecar.get("/readyz"))[0] == 200
    assert await sidecar.metric("acemq_sidecar_messages_total", outcome="relayed") == len(ids)
