"""What a reload changes: the old and the new route map compared, route by route.

This module owns the decision; ``sidecar.relay.fleet`` carries it out (stopping and
starting workers, adding and removing a route's metrics). Pure: two maps in, one plan out.

A route is restarted, not changed in place, whenever anything it runs with differs: its
own settings, or the map-wide ones its worker was started with (the quarantine exchange
and the shutdown grace). Broker and HTTP settings restart nothing: they apply at the next
reconnect and the next start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.routemap.model import Route, RouteMap

__all__ = ["ReloadPlan", "plan_reload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadPlan:
    """The routes to stop, start and restart, each in the order of its map; the rest run on."""

    stop: tuple[str, ...]  # in the old map only: drain the worker, then drop the series
    start: tuple[Route, ...]  # in the new map only: add the series, start a worker
    restart: tuple[Route, ...]  # in both but different: drain the old worker, start the new
    broker_changed: bool  # applies at the next reconnect
    http_changed: bool  # http, metrics or tracing settings: apply at the next start


def plan_reload(old: RouteMap, new: RouteMap) -> ReloadPlan:
    """Return what replacing ``old`` by ``new`` does to each route."""
    everything = (
        new.quarantine_exchange != old.quarantine_exchange
        or new.shutdown_grace_s != old.shutdown_grace_s
    )
    old_routes = {route.name: route for route in old.routes}
    new_names = {route.name for route in new.routes}
    return ReloadPlan(
        stop=tuple(route.name for route in old.routes if route.name not in new_names),
        start=tuple(route for route in new.routes if route.name not in old_routes),
        restart=tuple(
            route
            for route in new.routes
            if route.name in old_routes and (everything or old_routes[route.name] != route)
        ),
        broker_changed=new.broker != old.broker,
        http_changed=new.http != old.http
        or new.metrics != old.metrics
        or new.tracing != old.tracing,
    )
