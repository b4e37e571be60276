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

__all__ = [
    "LEVELS",
    "HealthServer",
    "Metrics",
    "Probe",
    "ReloadResult",
    "RouteLog",
    "configure",
    "liveness",
    "parse_level",
    "readiness",
]
