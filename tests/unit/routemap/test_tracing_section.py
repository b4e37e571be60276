"""The route map's ``tracing`` section: defaults, each key's bounds with FILE:LINE, reloads."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.errors import ConfigError
from sidecar.routemap import (
    RouteMap,
    TraceLink,
    TraceParent,
    TracingConfig,
    parse_route_map,
    plan_reload,
)
from sidecar.routemap.text import masked_url

ROUTES = """\
routes:
  - name: orders
    from: staging.orders
    to: {exchange: orders}
"""


def parse(text: str, env: dict[str, str] | None = None) -> RouteMap:
    return parse_route_map(text, source="routes.yaml", env=env or {})


def test_without_a_section_the_map_has_none() -> None:
    route_map = parse(ROUTES)
    assert route_map.tracing is None
    assert route_map.routes[0].trace_header_values is False


def test_an_empty_section_is_tracing_on_with_every_default() -> None:
    assert parse(ROUTES + "tracing: {}\n").tracing == TracingConfig()


def test_every_key_is_read() -> None:
    text = ROUTES.replace(
        "to: {exchange: orders}", "to: {exchange: orders}\n    trace_header_values: true"
    )
    text += """\
tracing:
  enabled: true
  endpoint: ${COLLECTOR}
  protocol: grpc
  sampler_ratio: 0.01
  service_name: orders-relay
  link: links
  traceparent: send_span
  max_queue_size: 512
"""
    route_map = parse(text, {"COLLECTOR": "http://otel-collector:4317"})
    assert route_map.tracing == TracingConfig(
        enabled=True,
        endpoint="http://otel-collector:4317",
        protocol="grpc",
        sampler_ratio=0.01,
        service_name="orders-relay",
        link=TraceLink.LINKS,
        traceparent=TraceParent.SEND_SPAN,
        max_queue_size=512,
    )
    assert route_map.routes[0].trace_header_values is True


@pytest.mark.parametrize(
    ("section", "line", "says"),
    [
        (
            "tracing:\n  endpoint: otel-collector:4318\n",
            6,
            "tracing.endpoint: expected the collector's URL",
        ),
        ("tracing:\n  protocol: http/json\n", 6, "tracing.protocol:"),
        ("tracing:\n  sampler_ratio: 1.5\n", 6, "tracing.sampler_ratio:"),
        ("tracing:\n  sampler_ratio: true\n", 6, "tracing.sampler_ratio: expected a number"),
        ("tracing:\n  link: parents\n", 6, 'tracing.link: expected "parent" or "links"'),
        ("tracing:\n  traceparent: rewrite\n", 6, "tracing.traceparent:"),
        ("tracing:\n  max_queue_size: 0\n", 6, "tracing.max_queue_size:"),
        ("tracing:\n  exporter: jaeger\n", 6, "tracing.exporter:"),
    ],
)
def test_a_bad_key_is_refused_at_its_line(section: str, line: int, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(ROUTES + section)
    assert str(error.value).startswith(f"routes.yaml:{line}: {says}"), str(error.value)


def test_a_changed_section_restarts_no_route_and_applies_at_the_next_start() -> None:
    old = parse(ROUTES + "tracing: {}\n")
    new = dataclasses.replace(old, tracing=TracingConfig(sampler_ratio=0.5))
    plan = plan_reload(old, new)
    assert plan.http_changed
    assert plan.restart == ()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://otel-collector:4318", "http://otel-collector:4318"),
        (
            "https://bob:hunter2@c:4318/v1?token=hunter2&x",
            "https://bob:***@c:4318/v1?token=***&***",
        ),
        ("c:4318/#hunter2", "c:4318/#***"),
        ("bob:hun@ter2@c", "bob:***@c"),  # the user info runs to the last @
        ("hun/ter2@c", "***@c"),  # no user name alone: hidden whole
        ("api-key@c", "api-key@c"),  # a user without a password is shown
    ],
)
def test_an_endpoint_is_shown_with_its_password_query_values_and_fragment_masked(
    url: str, shown: str
) -> None:
    assert masked_url(url) == shown
