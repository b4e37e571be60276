"""Whether tracing is on, and starting it: the one place that imports the OpenTelemetry SDK.

On when the route map has a ``tracing`` section (unless ``enabled: false``) or
``OTEL_TRACES_EXPORTER`` names ``otlp`` (a list: ``otlp,console``); off otherwise, and
always with ``OTEL_SDK_DISABLED=true``. Off, nothing of OpenTelemetry is imported and the
relay pays one attribute check per delivery. What the environment asks that the sidecar
does not do (another exporter, a propagator other than W3C trace context, an unknown
sampler) is logged at start (``unhonoured``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from sidecar.errors import SidecarError
from sidecar.observe.tracing.sampling import SAMPLERS
from sidecar.routemap import TracingConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.observe.metrics import Metrics
    from sidecar.observe.tracing.export import SdkTracing

__all__ = ["TracingUnavailableError", "start_tracing", "tracing_wanted", "unhonoured"]

log = logging.getLogger(__name__)

EXPORTERS: Final = frozenset({"otlp", "none"})  # what OTEL_TRACES_EXPORTER may name here
PROPAGATORS: Final = frozenset({"tracecontext", "baggage", "none"})  # W3C: the sidecar's


class TracingUnavailableError(SidecarError):
    """Tracing is asked for, but the OpenTelemetry SDK (the ``otel`` extra) is not installed."""


def tracing_wanted(config: TracingConfig | None, env: Mapping[str, str]) -> bool:
    """Return whether tracing is on for this route map's section and environment."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if config is not None:
        return config.enabled
    return "otlp" in _listed(env, "OTEL_TRACES_EXPORTER")


def _listed(env: Mapping[str, str], name: str) -> list[str]:
    """Return a comma-separated variable's entries, trimmed and in lower case."""
    return [part.strip().lower() for part in env.get(name, "").split(",") if part.strip()]


def unhonoured(env: Mapping[str, str]) -> list[str]:
    """Return what the environment asks of tracing that the sidecar does not do, one line each."""
    said = []
    if others := [e for e in _listed(env, "OTEL_TRACES_EXPORTER") if e not in EXPORTERS]:
        said.append(
            f"OTEL_TRACES_EXPORTER names {', '.join(others)}: the sidecar exports spans by"
            " OTLP only, and not to those"
        )
    if others := [p for p in _listed(env, "OTEL_PROPAGATORS") if p not in PROPAGATORS]:
        said.append(
            f"OTEL_PROPAGATORS names {', '.join(others)}: the sidecar reads and writes W3C"
            " trace context (traceparent) only; a message carrying only those headers starts"
            " a new trace"
        )
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in SAMPLERS:
        said.append(
            f"OTEL_TRACES_SAMPLER={sampler} is not a sampler the sidecar knows"
            f" ({', '.join(sorted(SAMPLERS))}): parentbased_always_on is used"
        )
    return said


def start_tracing(
    config: TracingConfig | None,
    *,
    env: Mapping[str, str],
    metrics: Metrics,
    version: str,
    exporter: object = None,
) -> SdkTracing | None:
    """Start tracing if it is wanted; None when it is off.

    ``exporter``: a ``SpanExporter`` instead of OTLP's (the tests' in-memory one). Raises
    ``TracingUnavailableError`` when tracing is on and the SDK is not installed.
    """
    if not tracing_wanted(config, env):
        return None
    for line in unhonoured(env):
        log.warning("tracing: %s", line)
    try:
        from opentelemetry.sdk.trace.export import SpanExporter  # noqa: PLC0415

        from sidecar.observe.tracing.export import SdkTracing  # noqa: PLC0415
    except ImportError as e:
        raise TracingUnavailableError(
            "tracing is on (the route map's tracing section or OTEL_TRACES_EXPORTER=otlp) but"
            f" the OpenTelemetry SDK is not installed ({e}): pip install 'acemq-sidecar[otel]'"
        ) from None
    if exporter is not None and not isinstance(exporter, SpanExporter):
        raise TypeError(f"expected a SpanExporter, got {exporter!r}")
    return SdkTracing(
        config or TracingConfig(),
        env=env,
        version=version,
        invalid=metrics.count_trace_context_invalid,
        dropped=metrics.count_spans_dropped,
        exporter=exporter,
    )
