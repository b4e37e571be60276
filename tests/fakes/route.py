"""Route ``orders`` as the settler's tests run it: its context, state, log and metrics."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.observe.route_log import RouteLog
from sidecar.relay.context import RouteContext
from sidecar.relay.settler import Settler
from sidecar.relay.state import RouteState
from sidecar.routemap import Mode, Publishers, Route, RouteLimits
from sidecar.wire import Int32, Int64

QUARANTINE = "acemq.quarantine"
CANONICAL: dict[str, Any] = {  # the headers of a canonical delivery, m-1
    "x-acemq-id": "m-1",
    "x-acemq-type": "order.placed",
    "x-acemq-version": Int32(1),
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
}


@dataclass(frozen=True)
class OrdersRoute:
    """What a settler of route orders is made from, and its metrics' registry."""

    context: RouteContext
    state: RouteState
    log: RouteLog
    registry: CollectorRegistry


def orders_route(
    *,
    publishers: Publishers = Publishers.ACEMQ,
    mode: Mode = Mode.ENFORCE,
    limits: RouteLimits | None = None,
    monotonic: Callable[[], float] = lambda: 0.0,
    delivery_limit: int = 20,
) -> OrdersRoute:
    """Route orders (staging.orders to exchange orders), consuming, on a fixed clock."""
    route = Route(
        name="orders",
        queue="staging.orders",
        exchange="orders",
        routing_key=None,
        publishers=publishers,
        origin=None,
        mode=mode,
        prefetch=8,
        limits=limits or RouteLimits(),
        delivery_limit=delivery_limit,
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="test", contract="1.1")
    metrics.add_route("orders")
    clock = Clock(now_ms=lambda: 1_790_000_000_000, monotonic=monotonic)
    log = RouteLog("orders")
    state = RouteState("orders", metrics=metrics, log=log, clock=clock)
    state.consuming(queue=route.queue, exchange=route.exchange)
    context = RouteContext(
        route=route,
        quarantine_exchange=QUARANTINE,
        login="sidecar",
        metrics=metrics,
        clock=clock,
        new_id=lambda: "00000000-0000-4000-8000-000000000000",
        rng=random.Random(1),
    )
    return OrdersRoute(context, state, log, registry)


async def settle_one(settler: Settler, state: RouteState, consumer: Any, delivery: Any) -> None:
    """Hand the settler one delivery; return once the route has nothing in flight.

    Settled from the frame handler or in a task of the route's: this waits for either.
    """
    settler.offer(consumer, delivery)
    await state.idle.wait()
