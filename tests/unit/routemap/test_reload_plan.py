"""plan_reload: which routes a reload stops, starts and restarts, branch by branch."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.broker import BrokerAddress
from sidecar.routemap.model import (
    BrokerConfig,
    HttpConfig,
    MetricsConfig,
    Mode,
    Publishers,
    Route,
    RouteMap,
    TlsConfig,
)
from sidecar.routemap.reload_plan import ReloadPlan, plan_reload

BROKER = BrokerConfig(
    addresses=(BrokerAddress.parse("amqp://h/"),),
    tls=TlsConfig(),
    prefetch=64,
    heartbeat_s=30,
    connect_timeout_s=10.0,
)


def route(name: str, **changes: object) -> Route:
    """A route called ``name`` on queue ``q.<name>`` to exchange ``x``, with ``changes``."""
    base = Route(
        name=name,
        queue=f"q.{name}",
        exchange="x",
        routing_key=None,
        publishers=Publishers.ACEMQ,
        origin=None,
        mode=Mode.ENFORCE,
        prefetch=64,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def route_map(*routes: Route, **changes: object) -> RouteMap:
    """A route map of ``routes`` with ``changes`` to its map-wide settings."""
    base = RouteMap(
        broker=BROKER,
        http=HttpConfig(host="127.0.0.1", port=9090),
        metrics=MetricsConfig(producers_per_route=20),
        mode=Mode.ENFORCE,
        quarantine_exchange="acemq.quarantine",
        shutdown_grace_s=30.0,
        routes=routes,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def names(plan: ReloadPlan) -> dict[str, list[str]]:
    """The plan as route names per action, for tables that read like the change."""
    return {
        "stop": list(plan.stop),
        "start": [route.name for route in plan.start],
        "restart": [route.name for route in plan.restart],
    }


A, B, C = route("a"), route("b"), route("c")

CASES = [
    pytest.param(
        route_map(A, B),
        route_map(A, B),
        {"stop": [], "start": [], "restart": []},
        id="nothing-changed",
    ),
    pytest.param(
        route_map(A, B),
        route_map(A),
        {"stop": ["b"], "start": [], "restart": []},
        id="route-removed",
    ),
    pytest.param(
        route_map(A),
        route_map(A, B),
        {"stop": [], "start": ["b"], "restart": []},
        id="route-added",
    ),
    pytest.param(
        route_map(A, B),
        route_map(A, route("b", exchange="y")),
        {"stop": [], "start": [], "restart": ["b"]},
        id="route-retargeted-exchange",
    ),
    pytest.param(
        route_map(A, B),
        route_map(route("a", routing_key="k"), B),
        {"stop": [], "start": [], "restart": ["a"]},
        id="route-retargeted-routing-key",
    ),
    pytest.param(
        route_map(A),
        route_map(route("a", queue="q.other")),
        {"stop": [], "start": [], "restart": ["a"]},
        id="route-reads-another-queue",
    ),
    pytest.param(
        route_map(A),
        route_map(route("a", mode=Mode.AUDIT, prefetch=8, origin="o")),
        {"stop": [], "start": [], "restart": ["a"]},
        id="route-settings-changed",
    ),
    pytest.param(
        route_map(A),
        route_map(route("a", publishers=Publishers.APPS)),
        {"stop": [], "start": [], "restart": ["a"]},
        id="route-publishers-changed",
    ),
    pytest.param(
        route_map(A),
        route_map(route("b", queue="q.a")),
        {"stop": ["a"], "start": ["b"], "restart": []},
        id="route-renamed-is-a-stop-and-a-start",
    ),
    pytest.param(
        route_map(A, B),
        route_map(A, B, quarantine_exchange="other.quarantine"),
        {"stop": [], "start": [], "restart": ["a", "b"]},
        id="quarantine-exchange-restarts-every-route",
    ),
    pytest.param(
        route_map(A, B, C),
        route_map(A, C, route("d"), shutdown_grace_s=5.0),
        {"stop": ["b"], "start": ["d"], "restart": ["a", "c"]},
        id="grace-restarts-the-kept-routes-only",
    ),
    pytest.param(
        route_map(A, B),
        route_map(A, B, mode=Mode.AUDIT),
        {"stop": [], "start": [], "restart": []},
        id="map-mode-alone-changes-no-resolved-route",
    ),
    pytest.param(
        route_map(A, B, C),
        route_map(C, B, A),
        {"stop": [], "start": [], "restart": []},
        id="reordered-routes-restart-none",
    ),
    pytest.param(
        route_map(A, B, C),
        route_map(route("e"), route("c", exchange="y"), route("d"), A),
        {"stop": ["b"], "start": ["e", "d"], "restart": ["c"]},
        id="mixed-each-list-in-its-map-order",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), CASES)
def test_plan_reload_sorts_every_route(
    old: RouteMap, new: RouteMap, expected: dict[str, list[str]]
) -> None:
    """Each route lands in the one action that the change calls for."""
    assert names(plan_reload(old, new)) == expected


def test_restart_and_start_carry_the_new_settings() -> None:
    """A restarted route runs with the new map's route, never the old one's."""
    new_b = route("b", exchange="y")
    plan = plan_reload(route_map(A, B), route_map(new_b, C))
    assert plan.restart == (new_b,)
    assert plan.start == (C,)


@pytest.mark.parametrize(
    ("new", "broker_changed", "http_changed"),
    [
        pytest.param(route_map(A), False, False, id="neither"),
        pytest.param(
            route_map(
                A,
                broker=dataclasses.replace(
                    BROKER, addresses=(BrokerAddress.parse("amqp://other/"),)
                ),
            ),
            True,
            False,
            id="broker-url",
        ),
        pytest.param(
            route_map(A, broker=dataclasses.replace(BROKER, tls=TlsConfig(ca_file="/ca.pem"))),
            True,
            False,
            id="broker-tls",
        ),
        pytest.param(
            route_map(A, http=HttpConfig(host="0.0.0.0", port=9090)),  # noqa: S104
            False,
            True,
            id="http-listen",
        ),
        pytest.param(
            route_map(A, metrics=MetricsConfig(producers_per_route=5)),
            False,
            True,
            id="metrics-producers",
        ),
    ],
)
def test_broker_and_http_changes_are_flagged_and_restart_no_route(
    new: RouteMap, *, broker_changed: bool, http_changed: bool
) -> None:
    """Broker and HTTP settings apply later (reconnect, restart): the routes keep running."""
    plan = plan_reload(route_map(A), new)
    assert (plan.broker_changed, plan.http_changed) == (broker_changed, http_changed)
    assert names(plan) == {"stop": [], "start": [], "restart": []}


_ROUTES = st.lists(
    st.builds(
        route,
        st.sampled_from("abcdef"),
        exchange=st.sampled_from(["x", "y"]),
        prefetch=st.sampled_from([1, 64]),
    ),
    unique_by=lambda item: item.name,
    max_size=6,
)


@given(
    old=_ROUTES,
    new=_ROUTES,
    grace=st.sampled_from([30.0, 5.0]),
)
def test_every_route_of_either_map_gets_exactly_one_action(
    old: list[Route], new: list[Route], grace: float
) -> None:
    """No route is forgotten or handled twice; a route left to run on is unchanged."""
    plan = names(plan_reload(route_map(*old), route_map(*new, shutdown_grace_s=grace)))
    acted = plan["start"] + plan["restart"]
    assert len(set(acted)) == len(acted)
    kept = [r.name for r in new if r.name not in acted]
    assert sorted(plan["stop"] + plan["restart"] + kept) == sorted(r.name for r in old)
    old_routes = {r.name: r for r in old}
    assert all(grace == 30.0 and old_routes[r.name] == r for r in new if r.name in kept)
