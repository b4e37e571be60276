"""What an operator sees: metrics, log lines, the probes and the HTTP side.

The series and their names, the rate-limited log lines, what /healthz and /readyz
answer, and the bounded HTTP server on a thread of its own. Nothing here decides
what becomes of a message.
"""

from __future__ import annotations

from sidecar.observe.health import HealthServer, Probe
from sidecar.observe.logs import LEVELS, configure, parse_level
from sidecar.observe.metrics import Metrics, ReloadResult
from sidecar.observe.probes import liveness, readiness
from sidecar.observe.route_log import RouteLog
from sidecar.observe.tracing import (
    DeliveryTrace,
    RouteTracer,
    SendTrace,
    Tracing,
    TracingUnavailableError,
    start_tracing,
    tracing_wanted,
)

__all__ = [
    "LEVELS",
    "DeliveryTrace",
    "HealthServer",
    "Metrics",
    "Probe",
    "ReloadResult",
    "RouteLog",
    "RouteTracer",
    "SendTrace",
    "Tracing",
    "TracingUnavailableError",
    "configure",
    "liveness",
    "parse_level",
    "readiness",
    "start_tracing",
    "tracing_wanted",
]
