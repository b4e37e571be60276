"""How fast the relay may go, decided without I/O: flow control.

A route's in-flight window (slow start, bounded by its prefetch and byte budget, and the
room a re-consume waits for: ``window``), the publish gate that probes a quiet connection
before a copy goes out (``publish_gate``), the backoff between retries (``backoff``), and
a budget of so many a second (``rate_budget``: returned copies published again).
Pure: no asyncio, socket, logging, clock or environment; the relay and the dialer carry
out what these decide.
"""

from __future__ import annotations

from sidecar.flow.backoff import Backoff, backoff_s
from sidecar.flow.publish_gate import (
    PROBE_BODY,
    PROBE_ROUTING_KEY,
    QUIET_S,
    Admit,
    GateState,
    admit,
    probe_again,
)
from sidecar.flow.rate_budget import RateBudget
from sidecar.flow.window import (
    START_WINDOW,
    grows_on,
    in_flight_window,
    next_window,
    refill,
    stops_growing,
)

__all__ = [
    "PROBE_BODY",
    "PROBE_ROUTING_KEY",
    "QUIET_S",
    "START_WINDOW",
    "Admit",
    "Backoff",
    "GateState",
    "RateBudget",
    "admit",
    "backoff_s",
    "grows_on",
    "in_flight_window",
    "next_window",
    "probe_again",
    "refill",
    "stops_growing",
]
