"""Both OTLP protocols for real: spans exported to a receiver of the test's on 127.0.0.1.

gRPC: a ``TraceService`` server of ``opentelemetry-proto``'s stubs; HTTP/protobuf: an
``http.server`` decoding ``ExportTraceServiceRequest``. Each checks the exporter the route
map's ``protocol`` and ``endpoint`` choose, and the resource the variables make.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from sidecar.observe import start_tracing
from sidecar.observe.tracing.export import SdkTracing, grpc_insecure
from sidecar.routemap import TracingConfig
from tests.fakes.route import orders_route

Requests = list[ExportTraceServiceRequest]


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, requests: Requests) -> None:
        self.requests = requests

    def Export(  # noqa: N802 - the service's method name
        self,
        request: ExportTraceServiceRequest,
        context: Any,  # noqa: ARG002 - the service's signature
    ) -> ExportTraceServiceResponse:
        self.requests.append(request)
        return ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Requests]]:
    requests: Requests = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(requests), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        server.stop(grace=None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Requests, list[str]]]:
    requests: Requests = []
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            paths.append(self.path)
            requests.append(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests, paths
    finally:
        server.shutdown()
        server.server_close()


def _one_span_to(config: TracingConfig, env: dict[str, str]) -> None:
    tracing = start_tracing(
        config, env=env, metrics=orders_route().context.metrics, version="9.9.9"
    )
    assert isinstance(tracing, SdkTracing)
    tracing.tracer.start_span("process staging.orders").end()
    tracing.shutdown(timeout_s=10)


def _names(requests: Requests) -> list[tuple[str, str]]:
    return [
        (
            next(
                kv.value.string_value
                for kv in resource_spans.resource.attributes
                if kv.key == "service.name"
            ),
            span.name,
        )
        for request in requests
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def test_grpc(grpc_receiver: tuple[str, Requests]) -> None:
    endpoint, requests = grpc_receiver
    _one_span_to(TracingConfig(endpoint=endpoint, protocol="grpc"), {})
    assert _names(requests) == [("acemq-sidecar", "process staging.orders")]


def test_http_protobuf_posts_to_v1_traces(
    http_receiver: tuple[str, Requests, list[str]],
) -> None:
    endpoint, requests, paths = http_receiver
    env = {"OTEL_SERVICE_NAME": "orders-relay"}
    _one_span_to(TracingConfig(endpoint=endpoint), env)
    assert _names(requests) == [("orders-relay", "process staging.orders")]
    assert paths == ["/v1/traces"]


def test_the_variables_choose_the_protocol_and_endpoint(
    grpc_receiver: tuple[str, Requests],
) -> None:
    endpoint, requests = grpc_receiver
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    _one_span_to(TracingConfig(service_name="from-the-map"), env)
    assert _names(requests) == [("from-the-map", "process staging.orders")]


@pytest.mark.parametrize(
    ("endpoint", "env", "insecure"),
    [
        ("http://collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "false"}, True),
        ("https://collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, False),
        ("collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True),
        ("collector:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "TRUE"}, True),
        ("collector:4317", {}, False),
        (None, {}, True),  # the specification's default endpoint, http://localhost:4317
    ],
)
def test_grpc_transport_security_is_the_schemes_else_the_insecure_variable(
    endpoint: str | None, env: dict[str, str], *, insecure: bool
) -> None:
    """``otel-collector:4317`` with ``OTEL_EXPORTER_OTLP_INSECURE=true`` goes without TLS."""
    assert grpc_insecure(endpoint, env) is insecure


def test_grpc_without_a_scheme_reaches_a_plain_collector_when_told_insecure(
    grpc_receiver: tuple[str, Requests],
) -> None:
    endpoint, requests = grpc_receiver
    bare = endpoint.removeprefix("http://")
    _one_span_to(
        TracingConfig(endpoint=bare, protocol="grpc"), {"OTEL_EXPORTER_OTLP_INSECURE": "true"}
    )
    assert _names(requests) == [("acemq-sidecar", "process staging.orders")]
