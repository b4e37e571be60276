"""The process-wide series: the connection, the broker's block, reconnects, reloads, spans.

``sidecar.observe.metrics`` owns this as it owns the per-route series; the names and help
texts of these series are here, beside the values of their labels.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client import CollectorRegistry

__all__ = ["PREFIX", "SPAN_DROP_REASONS", "ProcessSeries", "ReloadResult"]

PREFIX = "acemq_sidecar_"

# Why a span was not exported: the ``reason`` label of trace_spans_dropped_total.
SPAN_DROP_REASONS = ("queue_full", "export_failed", "tracer_failed")


class ReloadResult(StrEnum):
    """What a route map reload did; the values are the ``result`` label."""

    APPLIED = "applied"
    REFUSED = "refused"


class ProcessSeries:
    """The process-wide series: the connection, the broker's block, reconnects, reloads."""

    def __init__(self, registry: CollectorRegistry, *, version: str, contract: str) -> None:
        self._broker_connected = Gauge(
            f"{PREFIX}broker_connected",
            "1 while the AMQP connection to the broker is open; 0 while connecting or"
            " reconnecting (every route is stopped then).",
            registry=registry,
        )
        self._broker_blocked = Gauge(
            f"{PREFIX}broker_blocked",
            "1 while the broker blocks the connection (connection.blocked: a memory or disk"
            " alarm): nothing is published, /readyz gives the broker's reason.",
            registry=registry,
        )
        self._broker_blocked.set(0)
        self._reconnects = Counter(
            f"{PREFIX}reconnects_total",
            "AMQP connections re-established after one was lost (the first connect is not"
            " counted); unacked messages are redelivered after each.",
            registry=registry,
        )
        reloads = Counter(
            f"{PREFIX}config_reloads_total",
            "Route map reloads (SIGHUP or a changed file), by result: applied, or refused"
            " because the new map is invalid (the old one keeps running; see the log).",
            ["result"],
            registry=registry,
        )
        build_info = Gauge(
            f"{PREFIX}build_info",
            "Always 1; the labels name the running sidecar version and the AceMQ envelope"
            " contract version it enforces.",
            ["version", "contract"],
            registry=registry,
        )
        build_info.labels(version=version, contract=contract).set(1)
        self._reloads = {result: reloads.labels(result=result) for result in ReloadResult}
        dropped = Counter(
            f"{PREFIX}trace_spans_dropped_total",
            "Spans not exported (tracing on only), by reason: queue_full = the bounded export"
            " queue was full (the collector is slower than the relay, or down), export_failed"
            " = the collector did not take a batch, tracer_failed = the tracing raised (the SDK,"
            " a span processor): that span is lost, the delivery went on. The relay never waits"
            " for the collector.",
            ["reason"],
            registry=registry,
        )
        self._dropped = {reason: dropped.labels(reason=reason) for reason in SPAN_DROP_REASONS}

    def set_broker_connected(self, *, connected: bool) -> None:
        """Record whether the AMQP connection is open."""
        self._broker_connected.set(1 if connected else 0)

    def watch_broker_blocked(self, is_blocked: Callable[[], bool]) -> None:
        """Read ``broker_blocked`` from ``is_blocked`` at every scrape (from any thread)."""
        self._broker_blocked.set_function(lambda: 1.0 if is_blocked() else 0.0)

    def count_reconnect(self) -> None:
        """Count one connection re-established after a loss."""
        self._reconnects.inc()

    def count_reload(self, result: ReloadResult) -> None:
        """Count one route map reload with its result."""
        self._reloads[result].inc()

    def count_spans_dropped(self, reason: str, count: int) -> None:
        """Count ``count`` spans not exported for ``reason``."""
        self._dropped[reason].inc(count)
