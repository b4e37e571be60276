"""What one route's relay runs with: the route, the map-wide settings, the process's services.

One value handed from the fleet to a route's ``RouteWorker``, and on to its ``Settler`` and
``PlanPublisher``, instead of the same half-dozen arguments at each step. It holds
nothing per connection or per delivery, and decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from sidecar.clock import Clock
    from sidecar.observe import Metrics, RouteTracer
    from sidecar.routemap import Route

__all__ = ["RouteContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteContext:
    """One route and what its worker, settler and plan publisher share."""

    route: Route
    quarantine_exchange: str
    # What the broker checks user_id against: the name it knows the connection by (None:
    # not known, an EXTERNAL login with no user in the URL; every user_id is then moved).
    login: str | None
    metrics: Metrics
    clock: Clock
    new_id: Callable[[], str]
    rng: random.Random  # backoff jitter, not security
    tracer: RouteTracer | None = None  # None: tracing off (one attribute check per delivery)
