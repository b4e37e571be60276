"""Tracing the relay hop: OpenTelemetry spans per the messaging conventions, exported by OTLP.

The face the relay and the service see. ``start_tracing`` reads the route map's ``tracing``
section and the standard ``OTEL_*`` variables and, when tracing is on, imports the
OpenTelemetry SDK (the ``otel`` extra) and starts its batch export on a thread of its own;
when it is off, nothing of OpenTelemetry is imported. The relay holds a ``RouteTracer``
per route (None: off) and asks it for a ``DeliveryTrace`` per delivery (None: not sampled),
through the Protocols of ``hooks``, so that it never imports the SDK itself.
"""

from __future__ import annotations

from sidecar.observe.tracing.hooks import DeliveryTrace, RouteTracer, SendTrace, Tracing
from sidecar.observe.tracing.setup import TracingUnavailableError, start_tracing, tracing_wanted

__all__ = [
    "DeliveryTrace",
    "RouteTracer",
    "SendTrace",
    "Tracing",
    "TracingUnavailableError",
    "start_tracing",
    "tracing_wanted",
]
