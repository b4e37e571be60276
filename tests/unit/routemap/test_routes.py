"""The route map: parsing, defaults, interpolation, and every error with its exact line."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.broker import BrokerAddress
from sidecar.errors import ConfigError
from sidecar.route_files import load_route_map
from sidecar.routemap import (
    BrokerConfig,
    HttpConfig,
    LogLevel,
    MetricsConfig,
    Mode,
    Publishers,
    Route,
    RouteMap,
    TlsConfig,
    describe,
    parse_route_map,
    route_map_json_schema,
)

if TYPE_CHECKING:
    from pathlib import Path

SOURCE = "routes.yaml"


def _yaml(*lines: str) -> str:
    """Join lines, so that a line's position in the call is its line number in the file."""
    return "\n".join(lines) + "\n"


# A minimal valid route, lines 1-4 when it opens the file.
ROUTE = ("routes:", "  - name: a", "    from: q", "    to: {exchange: x}")


def _parse(text: str, env: dict[str, str] | None = None) -> RouteMap:
    return parse_route_map(text, source=SOURCE, env=env or {})


FULL = _yaml(
    "broker:",
    "  url: ${AMQP_URL}",
    "  tls: {ca_file: /tls/ca.pem, cert_file: /tls/cert.pem, key_file: /tls/key.pem}",
    "  prefetch: 256",
    "  heartbeat_s: 15",
    "  connect_timeout_s: 2.5",
    "http: {listen: '127.0.0.1:9191'}",
    "mode: audit",
    "quarantine: {exchange: ops.quarantine}",
    "shutdown_grace_s: 12",
    "routes:",
    "  - name: orders",
    "    from: staging.orders",
    "    to: {exchange: orders, routing_key: keep}",
    "  - name: billing.v2",
    "    from: staging.billing",
    "    to: {exchange: '', routing_key: billing.inbox}",
    "    publishers: apps",
    "    origin: billing-service",
    "    mode: enforce",
    "    prefetch: 8",
    "    single_active_consumer: true",
)


def test_full_file_parses_into_objects() -> None:
    """Every key is read, per-route overrides win, and routing_key keep becomes None."""
    route_map = _parse(FULL, {"AMQP_URL": "amqps://svc:pw@mq.example:5671/prod"})
    assert route_map == RouteMap(
        broker=BrokerConfig(
            addresses=(BrokerAddress.parse("amqps://svc:pw@mq.example:5671/prod"),),
            tls=TlsConfig(
                ca_file="/tls/ca.pem", cert_file="/tls/cert.pem", key_file="/tls/key.pem"
            ),
            prefetch=256,
            heartbeat_s=15,
            connect_timeout_s=2.5,
        ),
        http=HttpConfig(host="127.0.0.1", port=9191),
        metrics=MetricsConfig(producers_per_route=20),
        mode=Mode.AUDIT,
        quarantine_exchange="ops.quarantine",
        shutdown_grace_s=12.0,
        routes=(
            Route(
                name="orders",
                queue="staging.orders",
                exchange="orders",
                routing_key=None,
                publishers=Publishers.ACEMQ,
                origin=None,
                mode=Mode.AUDIT,
                prefetch=256,
            ),
            Route(
                name="billing.v2",
                queue="staging.billing",
                exchange="",
                routing_key="billing.inbox",
                publishers=Publishers.APPS,
                origin="billing-service",
                mode=Mode.ENFORCE,
                prefetch=8,
                single_active_consumer=True,
            ),
        ),
    )
    assert route_map.route("billing.v2").prefetch == 8
    assert not route_map.route("orders").single_active_consumer


def test_defaults_fill_everything_but_the_routes() -> None:
    """A file with one bare route gets the documented defaults everywhere else."""
    route_map = _parse(_yaml(*ROUTE))
    assert route_map == RouteMap(
        broker=BrokerConfig(
            addresses=(BrokerAddress.parse("amqp://guest:guest@127.0.0.1:5672/"),),
            tls=TlsConfig(ca_file=None, cert_file=None, key_file=None),
            prefetch=512,
            heartbeat_s=30,
            connect_timeout_s=10.0,
        ),
        http=HttpConfig(host="0.0.0.0", port=9090),  # noqa: S104 -- the documented default
        metrics=MetricsConfig(producers_per_route=20),
        mode=Mode.ENFORCE,
        quarantine_exchange="acemq.quarantine",
        shutdown_grace_s=30.0,
        routes=(
            Route(
                name="a",
                queue="q",
                exchange="x",
                routing_key=None,
                publishers=Publishers.ACEMQ,
                origin=None,
                mode=Mode.ENFORCE,
                prefetch=512,
            ),
        ),
    )


@pytest.mark.parametrize("broker", ["", "broker: {prefetch: 1}\n"], ids=["no-broker", "no-url"])
def test_default_url_comes_from_amqp_url(broker: str) -> None:
    """Without broker.url the default is ${AMQP_URL:-...}, so the environment still decides."""
    route_map = _parse(broker + _yaml(*ROUTE), {"AMQP_URL": "amqp://u:p@rabbit:5672/v"})
    assert route_map.broker.addresses == (BrokerAddress.parse("amqp://u:p@rabbit:5672/v"),)


def test_objects_are_frozen() -> None:
    """The relay shares one route map between tasks; nobody may change it underneath."""
    route_map = _parse(_yaml(*ROUTE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        route_map.routes[0].prefetch = 1  # type: ignore[misc]


def test_repr_hides_the_url() -> None:
    """A route map that reaches a log or a traceback must not carry the broker password."""
    route_map = _parse(FULL, {"AMQP_URL": "amqps://svc:hunter2@mq:5671/prod"})
    assert "hunter2" not in repr(route_map)


def test_route_lookup_by_name() -> None:
    """route(name) finds a route; an unknown name is a KeyError naming the known ones."""
    route_map = _parse(_yaml(*ROUTE))
    assert route_map.route("a").queue == "q"
    with pytest.raises(KeyError, match="the routes are: a"):
        route_map.route("b")


# --- interpolation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        pytest.param("${Q}", {"Q": "orders"}, "orders", id="set"),
        pytest.param("${Q:-fallback}", {}, "fallback", id="unset-with-default"),
        pytest.param("${Q:-fallback}", {"Q": ""}, "fallback", id="empty-takes-default"),
        pytest.param("${Q:-fallback}", {"Q": "orders"}, "orders", id="set-beats-default"),
        pytest.param("${Q:-amqp://h:5672/v}", {}, "amqp://h:5672/v", id="default-with-colon-slash"),
        pytest.param("pre.${A}.${B:-b}", {"A": "a"}, "pre.a.b", id="several-references"),
        pytest.param("cost$$5", {}, "cost$5", id="double-dollar"),
        pytest.param("$${Q}", {"Q": "no"}, "${Q}", id="escaped-reference"),
        pytest.param("cost$5", {}, "cost$5", id="lone-dollar-kept"),
        pytest.param("${Q}", {"Q": "${R}"}, "${R}", id="no-re-expansion"),
        pytest.param("'${Q}'", {"Q": "quoted"}, "quoted", id="quoted-scalar"),
    ],
)
def test_interpolation(value: str, env: dict[str, str], expected: str) -> None:
    """${VAR}, ${VAR:-default} and $$ are replaced once, left to right, in string scalars."""
    route_map = _parse(
        _yaml("routes:", "  - name: a", f"    from: {value}", "    to: {exchange: x}"), env
    )
    assert route_map.routes[0].queue == expected


def test_interpolation_may_yield_an_empty_string() -> None:
    """An empty default is allowed: here it makes a literal empty routing key."""
    route_map = _parse(_yaml(*ROUTE[:3], "    to: {exchange: x, routing_key: '${RK:-}'}"))
    assert route_map.routes[0].routing_key == ""


@pytest.mark.parametrize("value", ["${PREFETCH:-64}", "'64'", "64"])
def test_numbers_may_come_from_strings(value: str) -> None:
    """Interpolation yields strings; a number field still reads "64" as 64."""
    route_map = _parse(_yaml("broker:", f"  prefetch: {value}", *ROUTE))
    assert route_map.broker.prefetch == 64


# --- errors -------------------------------------------------------------------------------

# (yaml text, env, expected substring of str(ConfigError)), one row per kind of mistake.
ERRORS = [
    # The document itself.
    pytest.param("", {}, "routes.yaml:1: the file is empty", id="empty-file"),
    pytest.param("# only a comment\n", {}, "routes.yaml:1: the file is empty", id="comment-only"),
    pytest.param(
        _yaml("# a list", "- a"),
        {},
        "routes.yaml:2: expected a mapping at the top level",
        id="top-level-list",
    ),
    pytest.param("hello\n", {}, "routes.yaml:1: expected a mapping at the top level", id="scalar"),
    pytest.param(
        _yaml("routes:", "  - name: a", "    from: [q", "mode: audit"),
        {},
        "routes.yaml:4: invalid YAML: while parsing a flow sequence (line 3), expected ','",
        id="yaml-syntax",
    ),
    pytest.param(
        _yaml("mode: audit", "  http: x"),
        {},
        "routes.yaml:2: invalid YAML: mapping values are not allowed here",
        id="yaml-indentation",
    ),
    pytest.param(
        _yaml(*ROUTE, "---", *ROUTE),
        {},
        "routes.yaml:5: invalid YAML: expected a single document in the stream",
        id="two-documents",
    ),
    pytest.param(
        _yaml(*ROUTE, "mode: \x07"),
        {},
        "routes.yaml:5: invalid YAML: character U+0007",
        id="control-character",
    ),
    pytest.param(
        _yaml("x: &a [*a]", *ROUTE),
        {},
        "routes.yaml:1: x[0]: an alias refers to a node that contains it",
        id="recursive-alias",
    ),
    pytest.param(
        _yaml("routes:", "  - !route {name: a}"),
        {},
        "routes.yaml:2: routes[0]: unsupported YAML tag !route",
        id="custom-tag",
    ),
    # Duplicate keys: pyyaml would silently keep the last one.
    pytest.param(
        _yaml("mode: audit", *ROUTE, "mode: enforce"),
        {},
        "routes.yaml:6: mode: duplicate key; first defined on line 1",
        id="duplicate-top-level-key",
    ),
    pytest.param(
        _yaml(*ROUTE, "    from: q2"),
        {},
        "routes.yaml:5: routes[0].from: duplicate key; first defined on line 3",
        id="duplicate-route-key",
    ),
    # Unknown keys name the allowed ones.
    pytest.param(
        _yaml("mode: audit", "routs: []"),
        {},
        'routes.yaml:2: routs: unknown key; did you mean "routes"? allowed keys are: broker, http,'
        " metrics, mode, quarantine, shutdown_grace_s, routes",
        id="unknown-top-level-key",
    ),
    pytest.param(
        _yaml("broker:", "  prefech: 10", *ROUTE),
        {},
        'routes.yaml:2: broker.prefech: unknown key; did you mean "prefetch"? allowed keys are:'
        " url, urls, url_file, username_file, password_file, tls, prefetch, heartbeat_s,"
        " connect_timeout_s",
        id="unknown-broker-key",
    ),
    pytest.param(
        _yaml(*ROUTE, "    to_exchange: y"),
        {},
        "routes.yaml:5: routes[0].to_exchange: unknown key; allowed keys are: name, from, to,"
        " publishers, origin, mode, prefetch",
        id="unknown-route-key",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: {exchange: x, key: y}"),
        {},
        "routes.yaml:4: routes[0].to.key: unknown key; allowed keys are: exchange, routing_key",
        id="unknown-target-key",
    ),
    pytest.param(
        _yaml("broker:", "  tls:", "    ca: /ca.pem", *ROUTE),
        {},
        "routes.yaml:3: broker.tls.ca: unknown key; allowed keys are: ca_file, cert_file, key_file",
        id="unknown-tls-key",
    ),
    pytest.param(
        _yaml("${KEY}: 1", *ROUTE),
        {},
        "routes.yaml:1: ${KEY}: unknown key",
        id="keys-are-not-interpolated",
    ),
    # Missing required keys point at the mapping that lacks them.
    pytest.param(
        _yaml("mode: audit"), {}, "routes.yaml:1: routes: this key is required", id="no-routes"
    ),
    pytest.param(
        _yaml("mode: audit", "routes:", "  - name: a", "    to: {exchange: x}"),
        {},
        "routes.yaml:3: routes[0].from: this key is required",
        id="route-without-from",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: {routing_key: k}"),
        {},
        "routes.yaml:4: routes[0].to.exchange: this key is required",
        id="target-without-exchange",
    ),
    # Types.
    pytest.param(
        _yaml("broker: amqp://h/", *ROUTE),
        {},
        'routes.yaml:1: broker: expected a mapping, got "amqp://h/"',
        id="broker-not-a-mapping",
    ),
    pytest.param(
        _yaml("routes: {name: a}"),
        {},
        "routes.yaml:1: routes: expected a list, got a mapping",
        id="routes-not-a-list",
    ),
    pytest.param(
        _yaml("routes:"), {}, "routes.yaml:1: routes: expected a list, got null", id="routes-null"
    ),
    pytest.param(
        _yaml("routes:", "  - orders"),
        {},
        'routes.yaml:2: routes[0]: expected a mapping, got "orders"',
        id="route-not-a-mapping",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: orders"),
        {},
        'routes.yaml:4: routes[0].to: expected a mapping, got "orders"',
        id="target-not-a-mapping",
    ),
    pytest.param(
        _yaml("broker:", "  prefetch: many", *ROUTE),
        {},
        'routes.yaml:2: broker.prefetch: expected an integer, got "many"',
        id="prefetch-not-a-number",
    ),
    pytest.param(
        _yaml("broker:", "  prefetch: ${PREFETCH}", *ROUTE),
        {"PREFETCH": "lots"},
        'routes.yaml:2: broker.prefetch: expected an integer, got "lots"',
        id="interpolated-prefetch-not-a-number",
    ),
    pytest.param(
        _yaml("broker:", "  prefetch: true", *ROUTE),
        {},
        "routes.yaml:2: broker.prefetch: expected a number, got true",
        id="prefetch-bool",
    ),
    pytest.param(
        _yaml("broker:", "  heartbeat_s: 1.5", *ROUTE),
        {},
        "routes.yaml:2: broker.heartbeat_s: expected an integer, got 1.5",
        id="heartbeat-fraction",
    ),
    pytest.param(
        _yaml("broker:", "  connect_timeout_s: soon", *ROUTE),
        {},
        'routes.yaml:2: broker.connect_timeout_s: expected a number, got "soon"',
        id="timeout-not-a-number",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: {exchange: x, routing_key: 5}"),
        {},
        "routes.yaml:4: routes[0].to.routing_key: expected a string, got 5; quote it",
        id="routing-key-number",
    ),
    pytest.param(
        _yaml(*ROUTE[:2], "    from:", ROUTE[3]),
        {},
        "routes.yaml:3: routes[0].from: expected a string, got null",
        id="from-null",
    ),
    # Ranges.
    pytest.param(
        _yaml("broker:", "  prefetch: 0", *ROUTE),
        {},
        "routes.yaml:2: broker.prefetch: expected an integer from 1 to 65535, got 0",
        id="prefetch-zero",
    ),
    pytest.param(
        _yaml(*ROUTE, "    prefetch: 65536"),
        {},
        "routes.yaml:5: routes[0].prefetch: expected an integer from 1 to 65535, got 65536",
        id="route-prefetch-too-big",
    ),
    pytest.param(
        _yaml("broker:", "  heartbeat_s: 3601", *ROUTE),
        {},
        "routes.yaml:2: broker.heartbeat_s: expected an integer from 0 to 3600, got 3601",
        id="heartbeat-too-big",
    ),
    pytest.param(
        _yaml("broker:", "  connect_timeout_s: 0", *ROUTE),
        {},
        "routes.yaml:2: broker.connect_timeout_s: expected a number greater than 0, got 0",
        id="timeout-zero",
    ),
    pytest.param(
        _yaml("broker:", "  connect_timeout_s: .inf", *ROUTE),
        {},
        "routes.yaml:2: broker.connect_timeout_s: expected a finite number, got .inf",
        id="timeout-infinite",
    ),
    pytest.param(
        _yaml(*ROUTE, "shutdown_grace_s: -1"),
        {},
        "routes.yaml:5: shutdown_grace_s: expected a number of at least 0, got -1",
        id="grace-negative",
    ),
    # Closed sets.
    pytest.param(
        _yaml(
            "broker:",
            "  url: amqp://guest:guest@127.0.0.1:5672/",
            "mode: enforce",
            "quarantine: {exchange: acemq.quarantine}",
            "routes:",
            "  - name: orders",
            "    from: staging.orders",
            "    to: {exchange: orders, routing_key: keep}",
            "    publishers: acemq",
            "  - name: payments",
            "    from: staging.payments",
            "    to: {exchange: payments, routing_key: keep}",
            "    origin: null",
            "    publishers: app",
        ),
        {},
        'routes.yaml:14: routes[1].publishers: expected "acemq" or "apps", got "app"',
        id="publishers-enum",
    ),
    pytest.param(
        _yaml("mode: strict", *ROUTE),
        {},
        'routes.yaml:1: mode: expected "enforce" or "audit", got "strict"',
        id="mode-enum",
    ),
    pytest.param(
        _yaml(*ROUTE, "    mode: on"),
        {},
        'routes.yaml:5: routes[0].mode: expected "enforce" or "audit", got true',
        id="route-mode-yaml-bool",
    ),
    # Strings with a shape.
    pytest.param(
        _yaml("broker:", "  url: http://u:secret@h/", *ROUTE),
        {},
        "routes.yaml:2: broker.url: the broker URL must start with amqp:// or amqps://",
        id="url-scheme",
    ),
    pytest.param(
        _yaml("broker:", "  url: amqp:///vhost", *ROUTE),
        {},
        "routes.yaml:2: broker.url: the broker URL has no host",
        id="url-without-host",
    ),
    pytest.param(
        _yaml("broker:", "  url: amqp://h:99999/", *ROUTE),
        {},
        "routes.yaml:2: broker.url: the broker URL's host or port does not parse",
        id="url-bad-port",
    ),
    pytest.param(
        _yaml("http: {listen: '9090'}", *ROUTE),
        {},
        "routes.yaml:1: http.listen: host and port are both required",
        id="listen-no-host",
    ),
    pytest.param(
        _yaml("http: {listen: ':::9090'}", *ROUTE),
        {},
        "routes.yaml:1: http.listen: an IPv6 host must be in brackets",
        id="listen-bare-ipv6",
    ),
    pytest.param(
        _yaml("http: {listen: 'localhost:70000'}", *ROUTE),
        {},
        'routes.yaml:1: http.listen: the port "70000" is not a number from 0 to 65535',
        id="listen-port-range",
    ),
    pytest.param(
        _yaml("quarantine: {exchange: ''}", *ROUTE),
        {},
        'routes.yaml:1: quarantine.exchange: expected a non-empty string, got ""',
        id="quarantine-empty",
    ),
    pytest.param(
        _yaml("routes:", "  - name: my orders", *ROUTE[2:]),
        {},
        'routes.yaml:2: routes[0].name: expected 1 to 200 letters, digits, "_", "." or "-",'
        ' got "my orders"',
        id="route-name-charset",
    ),
    pytest.param(
        _yaml(*ROUTE[:2], "    from: ''", ROUTE[3]),
        {},
        'routes.yaml:3: routes[0].from: expected a non-empty string, got ""',
        id="from-empty",
    ),
    pytest.param(
        _yaml(*ROUTE[:2], f"    from: {'q' * 256}", ROUTE[3]),
        {},
        "routes.yaml:3: routes[0].from: expected at most 255 bytes (an AMQP short string), got 256",
        id="from-too-long",
    ),
    pytest.param(
        _yaml(*ROUTE, "    origin: ''"),
        {},
        'routes.yaml:5: routes[0].origin: expected a non-empty string or null, got ""',
        id="origin-empty",
    ),
    # TLS.
    pytest.param(
        _yaml("broker:", "  url: amqps://h/", "  tls: {cert_file: /c.pem}", *ROUTE),
        {},
        "routes.yaml:3: broker.tls: cert_file and key_file go together",
        id="tls-cert-without-key",
    ),
    pytest.param(
        _yaml("broker:", "  url: amqp://h/", "  tls: {ca_file: /ca.pem}", *ROUTE),
        {},
        "routes.yaml:3: broker.tls: TLS files are set but no broker URL is amqps://",
        id="tls-without-amqps",
    ),
    # Across routes.
    pytest.param(
        _yaml(*ROUTE, "  - name: a", "    from: q2", "    to: {exchange: x}"),
        {},
        'routes.yaml:5: routes[1].name: duplicate route name "a"; first defined on line 2',
        id="duplicate-route-name",
    ),
    pytest.param(
        _yaml(*ROUTE, "  - name: b", "    from: q", "    to: {exchange: y}"),
        {},
        'routes.yaml:6: routes[1].from: queue "q" is already consumed by route "a" (line 3)',
        id="duplicate-queue",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: {exchange: acemq.quarantine}"),
        {},
        'routes.yaml:4: routes[0].to.exchange: "acemq.quarantine" is the quarantine exchange',
        id="route-into-quarantine",
    ),
    pytest.param(
        _yaml("quarantine: {exchange: x}", *ROUTE),
        {},
        'routes.yaml:5: routes[0].to.exchange: "x" is the quarantine exchange',
        id="route-into-custom-quarantine",
    ),
    pytest.param(
        _yaml(*ROUTE[:3], "    to: {exchange: '', routing_key: q}"),
        {},
        "routes.yaml:4: routes[0].to.routing_key: the default exchange with routing key"
        ' "q" publishes back into the route\'s own queue',
        id="route-into-its-own-queue",
    ),
    pytest.param(
        _yaml("routes: []"),
        {},
        "routes.yaml:1: routes: expected at least one route",
        id="no-route",
    ),
    # Interpolation.
    pytest.param(
        _yaml(*ROUTE[:2], "    from: staging.${TEAM}", ROUTE[3]),
        {},
        "routes.yaml:3: routes[0].from: environment variable TEAM is not set;"
        " set it or write ${TEAM:-default}",
        id="env-unset",
    ),
    pytest.param(
        _yaml(*ROUTE[:2], "    from: ${TEAM", ROUTE[3]),
        {},
        'routes.yaml:3: routes[0].from: invalid reference in "${TEAM"',
        id="env-unclosed",
    ),
    pytest.param(
        _yaml(*ROUTE[:2], "    from: ${TEAM:?required}", ROUTE[3]),
        {},
        'routes.yaml:3: routes[0].from: invalid reference in "${TEAM:?required}"',
        id="env-unsupported-form",
    ),
    # Only the first error in the file is reported, whatever pydantic's order.
    pytest.param(
        _yaml(*ROUTE, "    publishers: app", "mode: strict"),
        {},
        "routes.yaml:5: routes[0].publishers:",
        id="first-error-in-file-order",
    ),
]


@pytest.mark.parametrize(("text", "env", "expected"), ERRORS)
def test_error(text: str, env: dict[str, str], expected: str) -> None:
    """Each mistake is a ConfigError naming file, line, key path, what is wrong and allowed."""
    with pytest.raises(ConfigError) as raised:
        _parse(text, env)
    assert expected in str(raised.value)


def test_error_carries_its_parts_as_attributes() -> None:
    """The CLI and the reloader read source, line and key without parsing the message."""
    with pytest.raises(ConfigError) as raised:
        _parse(_yaml(*ROUTE, "    publishers: app"))
    assert (raised.value.source, raised.value.line, raised.value.key) == (
        SOURCE,
        5,
        "routes[0].publishers",
    )


def test_url_error_never_shows_the_password() -> None:
    """A bad URL is reported, but its password must not reach the log."""
    env = {"AMQP_URL": "amqpx://svc:hunter2@h/"}
    with pytest.raises(ConfigError) as raised:
        _parse(_yaml("broker:", "  url: ${AMQP_URL}", *ROUTE), env)
    assert "hunter2" not in str(raised.value)
    assert "svc" not in str(raised.value)  # nothing of the URL is quoted: it may hold a secret


def _parse_or_error(text: str) -> RouteMap | ConfigError:
    try:
        return _parse(text)
    except ConfigError as e:
        return e


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_text_parses_or_raises_config_error(text: str) -> None:
    """Whatever the file holds, the caller sees a RouteMap or a ConfigError, nothing else."""
    assert isinstance(_parse_or_error(text), RouteMap | ConfigError)


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 70000), st.floats(), st.text(max_size=8)
)
_keys = st.sampled_from(
    ["broker", "url", "tls", "prefetch", "routes", "name", "from", "to", "exchange", "mode", "x"]
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(_keys, _values, max_size=5))
@settings(max_examples=300, deadline=None)
def test_any_yaml_shape_parses_or_raises_config_error(document: dict[str, object]) -> None:
    """Schema-shaped nonsense still yields a ConfigError, never a stray exception."""
    result = _parse_or_error(yaml.safe_dump(document))
    assert isinstance(result, RouteMap) or result.line is not None


# --- broker and http helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("0.0.0.0:9090", "0.0.0.0", 9090),  # noqa: S104 -- parsed, not bound
        ("localhost:0", "localhost", 0),
        ("[::]:9090", "::", 9090),
        ("[::1]:8080", "::1", 8080),
    ],
)
def test_http_listen(listen: str, host: str, port: int) -> None:
    """host:port splits into host and port; IPv6 loses its brackets; port 0 is ephemeral."""
    http = _parse(_yaml(f"http: {{listen: '{listen}'}}", *ROUTE)).http
    assert (http.host, http.port, http.listen) == (host, port, listen)


# --- describe, load, schema -------------------------------------------------------------------


def test_describe_summarises_every_route_and_masks_the_password() -> None:
    """`acemq-sidecar check` prints this; an operator reads it, a password must not be in it."""
    text = describe(_parse(FULL, {"AMQP_URL": "amqps://svc:hunter2@mq:5671/prod"}))
    assert "hunter2" not in text
    lines = text.splitlines()
    assert lines[:3] == [
        (
            "broker: amqps://svc:***@mq:5671/prod (login svc, prefetch 256, heartbeat 15 s,"
            " connect timeout 2.5 s)"
        ),
        "mode: audit",
        "quarantine exchange: ops.quarantine",
    ]
    assert (
        "  orders: staging.orders -> orders / (original routing key); publishers acemq,"
        " origin -, mode audit, prefetch 256"
    ) in lines
    assert (
        '  billing.v2: staging.billing -> (default exchange) / "billing.inbox"; publishers apps,'
        " origin billing-service, mode enforce, prefetch 8"
    ) in lines


def test_describe_says_an_amqps_url_with_no_user_logs_in_by_certificate() -> None:
    """With no user over amqps:// the client offers EXTERNAL first: "login guest" would mislead."""
    text = describe(_parse(FULL, {"AMQP_URL": "amqps://mq:5671/prod"}))
    assert text.splitlines()[0] == (
        "broker: amqps://guest:***@mq:5671/prod (login by client certificate (EXTERNAL) where"
        " offered, else guest, prefetch 256, heartbeat 15 s, connect timeout 2.5 s)"
    )


def test_describe_follows_the_urls_own_auth_mechanism() -> None:
    """The URL's auth_mechanism decides, as at the handshake: PLAIN is a login as guest."""
    text = describe(_parse(FULL, {"AMQP_URL": "amqps://mq:5671/prod?auth_mechanism=plain"}))
    assert "(login guest, prefetch 256" in text.splitlines()[0]


def test_load_route_map_reads_the_file(tmp_path: Path) -> None:
    """load_route_map names the file it read in every error."""
    path = tmp_path / "routes.yaml"
    path.write_text(_yaml(*ROUTE, "    publishers: app"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"routes\.yaml:5: routes\[0\]\.publishers:") as raised:
        load_route_map(path, env={})
    assert raised.value.source == str(path)
    path.write_text(_yaml(*ROUTE), encoding="utf-8")
    assert load_route_map(str(path), env={}).routes[0].name == "a"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing route map stops start-up like any other config error, not with a traceback."""
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read the route map") as raised:
        load_route_map(path, env={})
    assert raised.value.source == str(path)


def test_json_schema_uses_the_file_keys() -> None:
    """The Helm values schema comes from the same model, spelled as the YAML is."""
    schema = route_map_json_schema()
    assert schema["required"] == ["routes"]
    route = schema["$defs"]["_RouteFile"]
    assert set(route["properties"]) == {
        "name",
        "from",
        "to",
        "publishers",
        "origin",
        "mode",
        "prefetch",
        "single_active_consumer",
        "trace_header_values",
        "delivery_limit",
    }
    assert route["additionalProperties"] is False


def test_the_json_schema_states_numeric_bounds_as_json_schema_does() -> None:
    """Validators ignore pydantic's own ge/le words; the bounds must read minimum/maximum."""
    schema = route_map_json_schema()
    prefetch = schema["$defs"]["_BrokerFile"]["properties"]["prefetch"]
    assert (prefetch["minimum"], prefetch["maximum"]) == (1, 65535)
    assert (
        schema["$defs"]["_BrokerFile"]["properties"]["connect_timeout_s"]["exclusiveMinimum"] == 0
    )
    assert schema["properties"]["shutdown_grace_s"]["minimum"] == 0
    assert not {"ge", "le", "gt", "lt"} & set(json.dumps(schema).replace('"', " ").split())


@pytest.mark.parametrize(
    ("written", "level"), [("debug", LogLevel.DEBUG), ("Warning", LogLevel.WARNING)]
)
def test_log_level_is_read_in_any_case(written: str, level: LogLevel) -> None:
    text = f"log_level: {written}\nroutes:\n  - {{name: a, from: q, to: {{exchange: x}}}}\n"
    assert parse_route_map(text, source="r.yaml", env={}).log_level is level


def test_an_unknown_log_level_names_the_choices() -> None:
    text = "log_level: loud\nroutes:\n  - {name: a, from: q, to: {exchange: x}}\n"
    with pytest.raises(ConfigError, match=r'r.yaml:1: log_level: expected "DEBUG" or "INFO"'):
        parse_route_map(text, source="r.yaml", env={})


URL_FILE_MAP = (
    "broker:\n  url_file: /run/secrets/amqp-url\nroutes:\n"
    "  - {name: a, from: q, to: {exchange: x}}\n"
)


def test_the_broker_url_can_come_from_a_mounted_file() -> None:
    files = {"/run/secrets/amqp-url": "amqps://relay:s3cret@rabbit:5671/prod\n"}
    route_map = parse_route_map(URL_FILE_MAP, source="r.yaml", env={}, read_file=files.__getitem__)
    assert route_map.broker.addresses == (
        BrokerAddress.parse("amqps://relay:s3cret@rabbit:5671/prod"),
    )
    assert "s3cret" not in describe(route_map)


def test_a_url_file_that_cannot_be_read_names_its_line_and_what_to_do() -> None:
    def missing(path: str) -> str:
        raise FileNotFoundError(2, "No such file or directory", path)

    with pytest.raises(ConfigError) as caught:
        parse_route_map(URL_FILE_MAP, source="r.yaml", env={}, read_file=missing)
    assert str(caught.value) == (
        "r.yaml:2: broker.url_file: cannot read /run/secrets/amqp-url: No such file or"
        " directory; mount the secret there or set broker.url"
    )


def test_a_bad_url_in_the_file_is_reported_on_the_url_file_line_without_its_password() -> None:
    files = {"/run/secrets/amqp-url": "http://relay:s3cret@rabbit/"}
    with pytest.raises(
        ConfigError, match=r"^r\.yaml:2: broker\.url: the broker URL must start"
    ) as caught:
        parse_route_map(URL_FILE_MAP, source="r.yaml", env={}, read_file=files.__getitem__)
    assert "s3cret" not in str(caught.value)


def test_url_and_url_file_together_are_refused() -> None:
    text = URL_FILE_MAP.replace("broker:\n", "broker:\n  url: amqp://h/\n")
    with pytest.raises(ConfigError, match=r"r\.yaml:3: broker\.url_file: set broker\.url or"):
        parse_route_map(text, source="r.yaml", env={}, read_file=lambda _: "amqp://h/")


def test_load_route_map_reads_the_url_file(tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("amqp://relay:pw@rabbit/\n", encoding="utf-8")
    config = tmp_path / "routes.yaml"
    config.write_text(URL_FILE_MAP.replace("/run/secrets/amqp-url", str(secret)), encoding="utf-8")
    assert load_route_map(config, env={}).broker.addresses == (
        BrokerAddress.parse("amqp://relay:pw@rabbit/"),
    )
