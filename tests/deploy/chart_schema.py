"""The route map's part of the chart's values.schema.json, derived from sidecar.routemap.

``route_map_json_schema()`` is the one schema of the route map (docs/architecture.md); the
chart embeds a copy under ``properties.routeMap`` so that ``helm install`` refuses a bad route map.
``test_schema.py`` fails when the copy and the source drift apart; to refresh the copy:

    .venv/bin/python -m tests.deploy.chart_schema
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from sidecar.routemap import route_map_json_schema

CHART = Path(__file__).resolve().parents[2] / "helm" / "acemq-sidecar"
VALUES_SCHEMA = CHART / "values.schema.json"

_POINTER = "#/properties/routeMap/$defs/"

# One line per route map key, for `helm show values`-style tooling and editors; the README's
# "The route map" is the full text. Keyed by the model ("" for the top level) and the key.
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "": {
        "broker": (
            "Connection settings; the chart sets url (from broker.urlSecret or"
            " broker.credentialsSecret) and tls."
        ),
        "http": "The listener of /metrics, /healthz and /readyz.",
        "metrics": "How /metrics bounds its labels.",
        "mode": "enforce (repair or quarantine) or audit (count, relay unchanged).",
        "quarantine": "Where rejected messages go.",
        "shutdown_grace_s": "Seconds to settle in-flight messages after SIGTERM.",
        "routes": "The routes: staging queue in, target exchange out (at least one).",
        "log_level": "The log level when neither --log-level nor ACEMQ_LOG_LEVEL is set.",
        "tracing": (
            "Tracing's settings beyond the chart's tracing values (which set the OTEL_*"
            " variables); the section alone turns tracing on."
        ),
    },
    "_TracingFile": {
        "enabled": "false turns tracing off even with OTEL_TRACES_EXPORTER=otlp.",
        "endpoint": "The collector's base URL (else OTEL_EXPORTER_OTLP_ENDPOINT).",
        "protocol": "http/protobuf or grpc (else OTEL_EXPORTER_OTLP_PROTOCOL).",
        "sampler_ratio": "Parent-based sampling ratio (else OTEL_TRACES_SAMPLER and _ARG).",
        "service_name": "service.name when OTEL_SERVICE_NAME is not set.",
        "link": "parent (the producer's span is the parent) or links (a trace of its own).",
        "traceparent": "keep (the producer's, as it came) or send_span (the sidecar's).",
        "max_queue_size": "Spans waiting for export; more are dropped and counted.",
    },
    "_BrokerFile": {
        "prefetch": "Unacked deliveries per route (the default of each route's prefetch).",
        "heartbeat_s": "AMQP heartbeat in seconds (0 turns it off).",
        "connect_timeout_s": "Seconds a connection attempt may take.",
        "consumer_timeout_s": (
            "The broker's consumer_timeout in seconds (RabbitMQ's default 1800): a delivery"
            " the broker will not take is quarantined at half of it, dead-lettered at 3/4."
        ),
        "nack_retry": "How often and how long a copy the broker nacks is retried.",
        "return_retry": (
            "How often a copy the broker returns as unroutable is published again before it"
            " goes to quarantine (a binding a Khepri node has not seen yet)."
        ),
        "max_in_flight_bytes": (
            "Bytes of message bodies in flight per route; keep 64Mi + routes x (this + the"
            " largest body) within the memory limit (docs/memory.md)."
        ),
        "max_body_bytes": (
            "A larger body is not held but passed through to quarantine as it arrives"
            " (unset: no limit, every body is held once)."
        ),
    },
    "_NackRetryFile": {
        "max_attempts": "Publishes of a nacked copy before it goes to quarantine.",
        "max_s": "Seconds a nacked copy is retried before it goes to quarantine.",
    },
    "_ReturnRetryFile": {
        "max_attempts": "Publishes again of a returned copy (0: quarantined at once).",
        "delay_s": "Seconds before the first publish again; doubled for each after it.",
        "max_per_s": "Returned copies a route publishes again a second, at most.",
    },
    "_MetricsFile": {
        "producers_per_route": "Distinct producer labels per route (the rest count as other).",
    },
    "_HttpFile": {"listen": "host:port; keep 0.0.0.0 (the kubelet and Prometheus use the pod IP)."},
    "_QuarantineFile": {"exchange": "The quarantine exchange (it must exist)."},
    "_RouteFile": {
        "name": "The route's name: the route label of its metrics, unique in the map.",
        "from": "The staging queue the route consumes (it must exist).",
        "to": "The target exchange and routing key.",
        "publishers": "acemq (AceMQ libraries) or apps (plain applications).",
        "origin": "x-acemq-origin written when a message has none.",
        "mode": "This route's mode, instead of the map's.",
        "prefetch": "This route's prefetch, instead of broker.prefetch.",
        "single_active_consumer": (
            "The staging queue has x-single-active-consumer: consume once, never re-consume."
        ),
        "trace_header_values": "A violation's span event carries the header's value too.",
        "delivery_limit": (
            "The staging queue's x-delivery-limit (20: RabbitMQ 4's quorum default; 0: none):"
            " one return from it, a delivery goes to quarantine instead."
        ),
    },
    "_TargetFile": {
        "exchange": 'The target exchange ("" for the default exchange).',
        "routing_key": "keep (the message's own) or the routing key to publish with.",
    },
}


def _rewrite(node: Any) -> Any:
    if isinstance(node, dict):
        rewritten: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "default", "description"):
                continue  # documentation lives in values.yaml; defaults are the sidecar's
            if key == "$ref" and isinstance(value, str):
                rewritten[key] = value.replace("#/$defs/", _POINTER)
            elif key in ("properties", "$defs"):
                # Names, not keywords: keep every one.
                rewritten[key] = {name: _rewrite(item) for name, item in value.items()}
            else:
                rewritten[key] = _rewrite(value)
        return rewritten
    if isinstance(node, list):
        return [_rewrite(item) for item in node]
    return node


def chart_route_map_schema(source: dict[str, Any]) -> dict[str, Any]:
    """Return the schema of ``routeMap`` in the chart's values, from the route map's schema.

    The chart owns broker.url (``${AMQP_URL}`` from a Secret, or built from the keys of
    broker.credentialsSecret with username_file and password_file; so no urls or url_file
    either: behind one Service, one URL) and broker.tls (the mounted files), so
    values may not set them; and a route map needs a route.
    """
    schema = copy.deepcopy(source)
    broker = schema["$defs"]["_BrokerFile"]
    del broker["properties"]["url"]
    del broker["properties"]["urls"]
    del broker["properties"]["url_file"]
    del broker["properties"]["username_file"]  # from broker.credentialsSecret
    del broker["properties"]["password_file"]
    del broker["properties"]["tls"]
    del schema["$defs"]["_TlsFile"]
    schema["properties"]["routes"]["minItems"] = 1
    rewritten = _rewrite(schema)
    for model, descriptions in DESCRIPTIONS.items():
        target = rewritten["$defs"][model] if model else rewritten
        for key, text in descriptions.items():
            target["properties"][key]["description"] = text
    rewritten["description"] = (
        "The route map (README, The route map), rendered into routes.yaml; the same schema"
        " as acemq-sidecar check."
    )
    return rewritten


def embedded_route_map_schema() -> dict[str, Any]:
    """Return the copy in the chart's values.schema.json."""
    values_schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    embedded: dict[str, Any] = values_schema["properties"]["routeMap"]
    return embedded


def main() -> None:
    """Rewrite the routeMap part of values.schema.json from sidecar.routemap."""
    values_schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    values_schema["properties"]["routeMap"] = chart_route_map_schema(route_map_json_schema())
    VALUES_SCHEMA.write_text(json.dumps(values_schema, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
