"""The shell around each route: worker, consumer, settler, publishers, fleet.

A route's channel and its consumer with its window, the settler that carries out
each delivery's plan, the publish lanes and gates, and the fleet of workers a route
map makes. The decisions are the settle package's; this package carries them out.
"""

from __future__ import annotations

from sidecar.relay.fleet import RouteFleet
from sidecar.relay.waits import first_of, sleep_unless

__all__ = [
    "RouteFleet",
    "first_of",
    "sleep_unless",
]
