"""The route map's broker limits: consumer_timeout_s, nack_retry, return_retry, bytes."""

from __future__ import annotations

import pytest

from sidecar.errors import ConfigError
from sidecar.routemap import RouteLimits, parse_route_map

ROUTES = "routes:\n  - {name: orders, from: staging.orders, to: {exchange: orders}}\n"


def parse(broker: str) -> RouteLimits:
    text = f"broker:\n  url: amqp://127.0.0.1/\n{broker}{ROUTES}"
    return parse_route_map(text, source="routes.yaml", env={}).routes[0].limits


def test_the_defaults_are_rabbitmqs_timeout_and_the_charts_memory() -> None:
    assert parse("") == RouteLimits(
        consumer_timeout_s=1800.0,
        nack_max_attempts=10,
        nack_max_s=300.0,
        max_in_flight_bytes=64 * 2**20,
        max_body_bytes=None,
        return_max_attempts=0,
        return_delay_s=0.2,
        return_max_per_s=10.0,
    )


def test_every_route_takes_the_brokers_limits() -> None:
    limits = parse(
        "  consumer_timeout_s: 5\n"
        "  nack_retry: {max_attempts: 3, max_s: 60}\n"
        "  max_in_flight_bytes: 1048576\n"
        "  max_body_bytes: 134217728\n"
        "  return_retry: {max_attempts: 0, delay_s: 0.5, max_per_s: 0}\n"
    )
    assert limits == RouteLimits(
        consumer_timeout_s=5.0,
        nack_max_attempts=3,
        nack_max_s=60.0,
        max_in_flight_bytes=2**20,
        max_body_bytes=128 * 2**20,
        return_max_attempts=0,
        return_delay_s=0.5,
        return_max_per_s=0.0,
    )


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        (
            "  nack_retry: {max_attempts: 0}\n",
            "routes.yaml:3: broker.nack_retry.max_attempts:",
        ),
        ("  nack_retry: {tries: 3}\n", "routes.yaml:3: broker.nack_retry.tries:"),
        (
            "  return_retry: {max_attempts: 11}\n",
            "routes.yaml:3: broker.return_retry.max_attempts:",
        ),
        ("  return_retry: {delay_s: 0}\n", "routes.yaml:3: broker.return_retry.delay_s:"),
        ("  return_retry: {max_per_s: -1}\n", "routes.yaml:3: broker.return_retry.max_per_s:"),
        ("  consumer_timeout_s: true\n", "routes.yaml:3: broker.consumer_timeout_s:"),
        ("  max_in_flight_bytes: 1000\n", "routes.yaml:3: broker.max_in_flight_bytes:"),
        ("  max_body_bytes: 1000\n", "routes.yaml:3: broker.max_body_bytes:"),
        ("  max_body_bytes: true\n", "routes.yaml:3: broker.max_body_bytes:"),
    ],
)
def test_a_bad_limit_is_refused_with_file_and_line(broker: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(broker)
    assert str(caught.value).startswith(expected), str(caught.value)


def test_a_routes_delivery_limit_defaults_to_rabbitmq_4s_and_is_its_own() -> None:
    text = (
        "broker:\n  url: amqp://127.0.0.1/\nroutes:\n"
        "  - {name: a, from: staging.a, to: {exchange: a}}\n"
        "  - {name: b, from: staging.b, to: {exchange: b}, delivery_limit: 0}\n"
        "  - {name: c, from: staging.c, to: {exchange: c}, delivery_limit: 5}\n"
    )
    routes = parse_route_map(text, source="routes.yaml", env={}).routes
    assert [route.delivery_limit for route in routes] == [20, 0, 5]


def test_a_bad_delivery_limit_is_refused_with_file_and_line() -> None:
    text = (
        "broker:\n  url: amqp://127.0.0.1/\nroutes:\n"
        "  - {name: a, from: staging.a, to: {exchange: a}, delivery_limit: -1}\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_route_map(text, source="routes.yaml", env={})
    assert str(caught.value).startswith("routes.yaml:4: routes[0].delivery_limit:"), caught.value


@pytest.mark.parametrize("value", [512 * 2**20 + 1, 2**40])
def test_max_body_bytes_stops_at_rabbitmqs_largest_message(value: int) -> None:
    """No broker delivers a body over 512 MiB, its max_message_size's ceiling."""
    with pytest.raises(ConfigError) as caught:
        parse(f"  max_body_bytes: {value}\n")
    assert str(caught.value) == (
        "routes.yaml:3: broker.max_body_bytes: expected an integer from 65536 to 536870912"
        f" (512 MiB, RabbitMQ's largest max_message_size), got {value}"
    )


def test_max_body_bytes_may_be_the_ceiling_and_over_the_in_flight_budget() -> None:
    """The budget holds one message past it, whatever its size: no order between the two."""
    limits = parse("  max_in_flight_bytes: 65536\n  max_body_bytes: 536870912\n")
    assert (limits.max_in_flight_bytes, limits.max_body_bytes) == (65536, 512 * 2**20)
