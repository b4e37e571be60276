"""Whether tracing is on, and starting it: the one place that imports the OpenTelemetry SDK.

On when the route map has a ``tracing`` section (unless ``enabled: false``) or
``OTEL_TRACES_EXPORTER=otlp`` is set; off otherwise, and always with
``OTEL_SDK_DISABLED=true``. Off, nothing of OpenTelemetry is imported and the relay pays
one attribute check per delivery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.errors import SidecarError
from sidecar.routemap import TracingConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.observe.metrics import Metrics
    from sidecar.observe.tracing.export import SdkTracing

__all__ = ["TracingUnavailableError", "start_tracing", "tracing_wanted"]


class TracingUnavailableError(SidecarError):
    """Tracing is asked for, but the OpenTelemetry SDK (the ``otel`` extra) is not installed."""


def tracing_wanted(config: TracingConfig | None, env: Mapping[str, str]) -> bool:
    """Return whether tracing is on for this route map's section and environment."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if config is not None:
        return config.enabled
    return env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "otlp"


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
