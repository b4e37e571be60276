"""The OpenTelemetry SDK set up for the relay: sampler, resource, OTLP exporter, batch export.

Configured the way every OpenTelemetry user expects (``OTEL_EXPORTER_OTLP_*``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER(_ARG)``), a key
set in the route map's ``tracing`` section winning over its variable. Spans are exported
by the SDK's batch processor on a thread of its own, from a bounded queue: a collector that
is down or slow costs the relay nothing but the spans, which are dropped and counted
(``acemq_sidecar_trace_spans_dropped_total``). No global provider is installed. Imported
only when tracing is on (``setup``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from sidecar.observe.tracing.guard import TraceFaults, guarded
from sidecar.observe.tracing.sampling import SAMPLERS, SampledTracer, Sampling
from sidecar.observe.tracing.spans import SpanRouteTracer
from sidecar.routemap import TraceLink

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span

    from sidecar.routemap import Route, TracingConfig

__all__ = [
    "SdkTracing",
    "exporter_for",
    "grpc_insecure",
    "queue_size",
    "sampling_for",
]

DEFAULT_SERVICE_NAME: Final = "acemq-sidecar"
SCOPE: Final = "acemq-sidecar.relay"
GRPC_DEFAULT_ENDPOINT: Final = "http://localhost:4317"  # the OTel specification's
QUEUE_SIZE: Final = 2048  # the batch span processor's, when neither the map nor the env says


def sampling_for(config: TracingConfig, env: Mapping[str, str]) -> Sampling:
    """Return who gets a span: the route map's ratio, parent-based; else ``OTEL_TRACES_SAMPLER``'s.

    Without either, a parent-based ratio of ``OTEL_TRACES_SAMPLER_ARG`` (1.0 when unset).
    The SDK's own sampler is then always on: the decision is made before it is asked.
    """
    if config.sampler_ratio is not None:
        return Sampling(parent_based=True, ratio=config.sampler_ratio)
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_traceidratio"
    if name not in SAMPLERS:  # said at start (setup.unhonoured): the specification's default
        return Sampling(parent_based=True, ratio=1.0)
    try:
        ratio = min(max(float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")), 0.0), 1.0)
    except ValueError:
        ratio = 1.0
    fixed = {"always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0}
    fixed["parentbased_always_off"] = 0.0
    return Sampling(parent_based=name.startswith("parentbased_"), ratio=fixed.get(name, ratio))


def queue_size(config: TracingConfig, env: Mapping[str, str]) -> int:
    """Return how many ended spans may wait for export: the map's, else OTEL_BSP_MAX_QUEUE_SIZE."""
    if config.max_queue_size is not None:
        return config.max_queue_size
    try:
        size = int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", QUEUE_SIZE))
    except ValueError:
        return QUEUE_SIZE
    return size if size > 0 else QUEUE_SIZE


def grpc_insecure(endpoint: str | None, env: Mapping[str, str]) -> bool:
    """Return whether OTLP/gRPC goes without TLS, as the SDK specification says it.

    The endpoint's scheme decides (``http://`` plain, ``https://`` TLS; no endpoint is the
    specification's default, plain); without a scheme,
    ``OTEL_EXPORTER_OTLP_TRACES_INSECURE``, else ``OTEL_EXPORTER_OTLP_INSECURE`` (``true``:
    plain; unset: TLS).
    """
    endpoint = endpoint or GRPC_DEFAULT_ENDPOINT
    if endpoint.startswith(("http://", "https://")):
        return endpoint.startswith("http://")
    said = env.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE") or env.get("OTEL_EXPORTER_OTLP_INSECURE")
    return (said or "").strip().lower() == "true"


def exporter_for(config: TracingConfig, env: Mapping[str, str]) -> SpanExporter:
    """Return the OTLP exporter: HTTP/protobuf unless the map or the environment says gRPC.

    The route map's ``endpoint`` is a base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is (for
    HTTP, ``/v1/traces`` is added); ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is the whole URL.
    The exporter reads its other variables (headers, timeout, certificates) itself.
    """
    protocol = (
        config.protocol
        or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcExporter,
        )

        endpoint = (
            config.endpoint
            or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        )
        return GrpcExporter(endpoint=endpoint, insecure=grpc_insecure(endpoint, env))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter as HttpExporter,
    )

    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = config.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if config.endpoint is not None or (endpoint is None and base is not None):
        endpoint = f"{base.rstrip('/')}/v1/traces" if base else None
    return HttpExporter(endpoint=endpoint)


def _resource(config: TracingConfig, env: Mapping[str, str], version: str) -> Resource:
    """Return the resource: ``OTEL_RESOURCE_ATTRIBUTES``, the service's name and version.

    The name: ``OTEL_SERVICE_NAME``, else the variable's ``service.name``, else the route
    map's ``service_name``, else ``acemq-sidecar``.
    """
    named = dict(
        pair.strip().split("=", 1)
        for pair in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
        if "=" in pair
    ).get("service.name")
    name = env.get("OTEL_SERVICE_NAME") or named or config.service_name or DEFAULT_SERVICE_NAME
    return Resource.create({"service.name": name, "service.version": version})


class _Counted(SpanExporter):
    """The exporter, counting the spans it could not deliver and those it took off the queue."""

    def __init__(self, inner: SpanExporter, queue: _CountedQueue) -> None:
        self._inner = inner
        self._queue = queue

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._queue.taken(len(spans))
        try:
            result = self._inner.export(spans)
        except Exception:  # noqa: BLE001 - the exporter's bug loses its batch, never the relay
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._queue.dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountedQueue(SpanProcessor):
    """The SDK's batch processor, counting what its bounded queue drops when it is full."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int,
        dropped: Callable[[str, int], None],
    ) -> None:
        self._lock = threading.Lock()
        self._queued = 0  # ended spans not yet taken by the exporter's thread
        self._max = max_queue_size
        self.dropped = dropped
        self._batch = BatchSpanProcessor(
            _Counted(exporter, self),
            max_queue_size=max_queue_size,
            max_export_batch_size=min(512, max_queue_size),
        )

    def taken(self, count: int) -> None:
        with self._lock:
            self._queued = max(0, self._queued - count)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            full = self._queued >= self._max
            if not full:
                self._queued += 1
        if full:  # the queue drops its oldest span to take this one
            self.dropped("queue_full", 1)
        self._batch.on_end(span)

    def shutdown(self) -> None:
        self._batch.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


class SdkTracing:
    """The process's tracer provider and its export; a ``SpanRouteTracer`` per route."""

    def __init__(
        self,
        config: TracingConfig,
        *,
        env: Mapping[str, str],
        version: str,
        invalid: Callable[[str], None],
        dropped: Callable[[str, int], None],
        exporter: SpanExporter | None = None,
    ) -> None:
        self.config = config
        self._invalid = invalid
        self.faults = TraceFaults(dropped=dropped)  # what a span raised: counted, logged
        self.sampling = sampling_for(config, env)
        self.provider = TracerProvider(
            sampler=ALWAYS_ON,  # the decision is Sampling's, made before a span is asked for
            resource=_resource(config, env, version),
            shutdown_on_exit=False,
        )
        self.provider.add_span_processor(
            _CountedQueue(
                exporter_for(config, env) if exporter is None else exporter,
                max_queue_size=queue_size(config, env),
                dropped=dropped,
            )
        )
        self.tracer = self.provider.get_tracer(SCOPE, version)

    def for_route(self, route: Route, *, quarantine_exchange: str) -> SampledTracer:
        """Return the tracer of ``route``."""
        spans = SpanRouteTracer(
            route,
            tracer=self.tracer,
            quarantine_exchange=quarantine_exchange,
            link=self.config.link,
            traceparent=self.config.traceparent,
        )
        return SampledTracer(
            route.name,
            sampling=self.sampling,
            follows=self.config.link is TraceLink.PARENT,
            invalid=self._invalid,
            begin=guarded(spans.begin, self.faults),
        )

    def _shutdown(self) -> None:
        self.provider.shutdown()

    def shutdown(self, *, timeout_s: float) -> None:
        """Export what is queued, waiting at most ``timeout_s`` (the export thread is a daemon)."""
        done = threading.Thread(target=self._shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(timeout_s)
