"""The sidecar's Prometheus metrics: with ``process_series``, the one place of metric names.

Everything is registered on the ``CollectorRegistry`` handed to ``Metrics``, never at
import time and never on the global registry; every series exists at zero from the first
scrape (process-wide at start, a route's in ``add_route``). ``Metrics`` is the one face:
it owns each route's settlement series and hands the drift series (``_Violations``) and
the process-wide ones (``observe.process_series``) to a class each.

Labels are bounded: never a message id, a raw unknown header name or a hostname. Writes
come from the event loop only; a scrape on the HTTP thread reads through
prometheus_client's locks and, for the hot path's series (``observe.series``), plain
numbers copied under the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from sidecar.contract import (
    APP_LABEL,
    DEFAULT_PRODUCERS_PER_ROUTE,
    LEGACY_NAMES,
    UNKNOWN,
    UNKNOWN_RESERVED_LABEL,
    Kind,
    ProducerLabels,
)
from sidecar.observe.process_series import PREFIX, ProcessSeries, ReloadResult
from sidecar.observe.series import Cell, PlainCounters, SettledSeries, Tally
from sidecar.settle import Outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client import CollectorRegistry

__all__ = ["DRIFT_VIOLATIONS", "RELAY_SECONDS_BUCKETS", "Metrics", "Outcome", "ReloadResult"]

# Consume -> confirm: a local broker confirms in well under a millisecond, a loaded or
# remote one in tens of milliseconds, and anything past 10 s is an incident, not a latency.
RELAY_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# The (kind, header) pairs the Helm chart's drift alert watches (docs/contract.md sections 4, 5
# and 7); created at zero per route so that `increase(...) > 0` fires on the first violation
# rather than on the second.
DRIFT_VIOLATIONS: tuple[tuple[str, str], ...] = (
    (Kind.APP_RESERVED, UNKNOWN_RESERVED_LABEL),
    (Kind.UNKNOWN_RESERVED, UNKNOWN_RESERVED_LABEL),
    *((Kind.LEGACY_NAME, legacy) for legacy in LEGACY_NAMES),
    (Kind.UNPORTABLE, APP_LABEL),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class _RouteSeries:
    """One route's labelled children, resolved once so the hot path skips ``.labels``."""

    settled: Tally  # messages_total and relay_seconds
    route_up: Gauge
    retried_copies: Counter
    returns_sent: Counter  # return_retries_total{result="sent"}
    returns_routed: Counter  # return_retries_total{result="routed"}
    dead_lettered: Counter
    trace_context_invalid: Counter


class Metrics:
    """The sidecar's collectors, registered on an injected registry.

    Per-route children are cached in dicts, so a message costs dictionary look-ups, not
    label validation and locking.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        version: str,
        contract: str,
        producers_per_route: int = DEFAULT_PRODUCERS_PER_ROUTE,
    ) -> None:
        self._settled = SettledSeries(
            registry,
            messages=(
                f"{PREFIX}messages",
                (
                    "Staging messages settled (acked after a confirmed copy), by outcome: relayed"
                    " = normalised copy on the target; quarantined = original on the quarantine"
                    " exchange (rejected, unroutable or unwritable); audited = original relayed"
                    " unchanged in audit mode."
                ),
            ),
            seconds=(
                f"{PREFIX}relay_seconds",
                (
                    "Seconds from receiving a staging message to acking it after the broker"
                    " confirmed its copy (target or quarantine); includes any time it was held"
                    " by a pause."
                ),
            ),
            buckets=RELAY_SECONDS_BUCKETS,
        )
        self._drift = _Violations(registry, producers_per_route=producers_per_route)
        self._in_flight = Gauge(
            f"{PREFIX}in_flight",
            "Messages received from the staging queue and not yet acked; at most the route's"
            " prefetch. Stuck near prefetch: confirms are slow or the route is held.",
            ["route"],
            registry=registry,
        )
        self._route_up = Gauge(
            f"{PREFIX}route_up",
            "1 while the route consumes its staging queue; 0 while it is paused (a missing"
            " queue or exchange, a refused publish, no connection): /readyz says why.",
            ["route"],
            registry=registry,
        )
        self._counters = _RouteCounters(registry)
        self._process = ProcessSeries(registry, version=version, contract=contract)
        self._routes: dict[str, _RouteSeries] = {}
        # Messages in flight per route: a plain int the in_flight gauge reads at scrape
        # time, so a delivery costs two integer additions, not two locked gauge updates.
        self._in_flight_counts: dict[str, int] = {}

    def add_route(self, route: str) -> None:
        """Create every series of ``route`` at zero; a route already present is left as is."""
        self._series(route)

    def remove_route(self, route: str) -> None:
        """Remove every series of ``route``, for a route a reload deleted; unknown: no-op.

        Call it once the route has drained: a later observation for the route recreates
        its series (at zero, apart from that observation).
        """
        series = self._routes.pop(route, None)
        if series is None:
            return
        self._settled.remove_route(route)
        self._in_flight.remove(route)
        del self._in_flight_counts[route]
        self._route_up.remove(route)
        self._counters.remove(route)
        self._drift.remove_route(route)

    def observe_message(self, route: str, outcome: Outcome, seconds: float) -> None:
        """Count one settled message and observe its consume-to-confirm time in seconds."""
        series = self._routes.get(route)
        if series is None:
            series = self._series(route)
        series.settled.observe(outcome, seconds)

    def count_violations(
        self, route: str, violations: Iterable[tuple[str, str]], *, producer: str = UNKNOWN
    ) -> None:
        """Count each ``(kind, header)`` pair once; called per message, usually with none.

        The caller guarantees both strings come from the contract's closed sets, and that
        ``producer`` comes from ``producers.producer_of``; it is bounded here per route.
        """
        self._drift.count(route, violations, producer=producer)

    def add_in_flight(self, route: str, delta: int) -> None:
        """Add ``delta`` (negative to subtract) to the messages of ``route`` in flight."""
        counts = self._in_flight_counts
        if route not in counts:
            self._series(route)
        counts[route] += delta

    def set_route_up(self, route: str, *, up: bool) -> None:
        """Record whether ``route`` is consuming."""
        series = self._routes.get(route)
        if series is None:
            series = self._series(route)
        series.route_up.set(1 if up else 0)

    def set_broker_connected(self, *, connected: bool) -> None:
        """Record whether the AMQP connection is open."""
        self._process.set_broker_connected(connected=connected)

    def count_retried_copy(self, route: str) -> None:
        """Count one copy published again after a nack or a lost channel (a maybe-duplicate)."""
        series = self._routes.get(route) or self._series(route)
        series.retried_copies.inc()

    def count_return_retry(self, route: str, *, routed: bool) -> None:
        """Count a returned copy published again, or (``routed``) such a copy then taken."""
        series = self._routes.get(route) or self._series(route)
        (series.returns_routed if routed else series.returns_sent).inc()

    def count_dead_lettered(self, route: str) -> None:
        """Count one staging message rejected to its queue's dead-letter exchange."""
        series = self._routes.get(route) or self._series(route)
        series.dead_lettered.inc()

    def watch_broker_blocked(self, is_blocked: Callable[[], bool]) -> None:
        """Read ``broker_blocked`` from ``is_blocked`` at every scrape (from any thread)."""
        self._process.watch_broker_blocked(is_blocked)

    def count_trace_context_invalid(self, route: str) -> None:
        """Count one message of ``route`` whose traceparent is not trace context."""
        series = self._routes.get(route) or self._series(route)
        series.trace_context_invalid.inc()

    def count_spans_dropped(self, reason: str, count: int) -> None:
        """Count spans not exported, by ``reason`` (from the export thread too: locked)."""
        self._process.count_spans_dropped(reason, count)

    def count_reconnect(self) -> None:
        """Count one connection re-established after a loss."""
        self._process.count_reconnect()

    def count_reload(self, result: ReloadResult) -> None:
        """Count one route map reload with its result."""
        self._process.count_reload(result)

    def _series(self, route: str) -> _RouteSeries:
        """Return the children of ``route``, creating them (and its drift series) at zero."""
        series = self._routes.get(route)
        if series is not None:
            return series
        counters = self._counters
        series = _RouteSeries(
            settled=self._settled.add_route(route),
            route_up=self._route_up.labels(route),
            retried_copies=counters.retried_copies.labels(route),
            returns_sent=counters.return_retries.labels(route, "sent"),
            returns_routed=counters.return_retries.labels(route, "routed"),
            dead_lettered=counters.dead_lettered.labels(route),
            trace_context_invalid=counters.trace_context_invalid.labels(route),
        )
        counts = self._in_flight_counts
        counts[route] = 0
        self._in_flight.labels(route).set_function(lambda: counts.get(route, 0))
        self._routes[route] = series
        self._drift.add_route(route)
        return series


class _RouteCounters:
    """A route's counters of copies sent again or not at all, and of bad trace context."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.retried_copies = Counter(
            f"{PREFIX}retried_copies_total",
            "Copies published again after the broker nacked one or lost it with its channel"
            " before the confirm: each may have reached some queues already, so each may be"
            " a duplicate downstream (same x-acemq-id). Bounded per message by"
            " broker.nack_retry.",
            ["route"],
            registry=registry,
        )
        self.return_retries = Counter(
            f"{PREFIX}return_retries_total",
            "Copies the broker returned as unroutable and the sidecar published again"
            " (result=sent), and those of them a binding then took (result=routed): a"
            " binding one cluster node had not yet seen (Khepri). Bounded by"
            " broker.return_retry; after that the message goes to quarantine as unroutable.",
            ["route", "result"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            f"{PREFIX}dead_lettered_total",
            "Staging messages rejected (requeue=false) because neither the target nor the"
            " quarantine exchange took them before the broker's consumer_timeout: the broker"
            " dead-letters them to the staging queue's dead-letter exchange, or drops them"
            " when it has none. Any rise needs an operator (see the log).",
            ["route"],
            registry=registry,
        )
        self.trace_context_invalid = Counter(
            f"{PREFIX}trace_context_invalid_total",
            "Staging messages whose traceparent header is not W3C trace context (tracing"
            " on only): the header is ignored and relayed as it came, the message's span"
            " starts a trace of its own. A rise names a producer writing it wrong.",
            ["route"],
            registry=registry,
        )

    def remove(self, route: str) -> None:
        """Remove the series of ``route``."""
        self.retried_copies.remove(route)
        for result in ("sent", "routed"):
            self.return_retries.remove(route, result)
        self.dead_lettered.remove(route)
        self.trace_context_invalid.remove(route)


class _Violations:
    """The drift series of every route: by ``(kind, header)``, and by producer and kind.

    Children are cached per label triple, so a message costs dictionary look-ups, not
    label validation and locking; the producer label is bounded per route.
    """

    def __init__(self, registry: CollectorRegistry, *, producers_per_route: int) -> None:
        self._violations = PlainCounters(
            registry,
            f"{PREFIX}violations_total",
            "Envelope rules that fired on consumed messages, by kind (docs/contract.md section 6)"
            " and header (the contract name; x-acemq-* for any unknown reserved name, app for"
            " an application header). A rise means a publisher drifts from the contract.",
            ("route", "kind", "header"),
        )
        self._producer_violations = PlainCounters(
            registry,
            f"{PREFIX}producer_violations_total",
            "Envelope rules that fired, by the service that produced the message: the part of"
            " x-acemq-origin before '@' (app_id on a publishers: apps route); unknown when it"
            " names none; other past the route's limit of distinct producers or for a name"
            " that looks like an id or a host. Which service to fix when drift rises.",
            ("route", "producer", "kind"),
        )
        self._producers = ProducerLabels(producers_per_route)
        self._producer_children: dict[tuple[str, str, str], Cell] = {}
        self._violation_children: dict[tuple[str, str, str], Cell] = {}

    def add_route(self, route: str) -> None:
        """Create the series the drift alert watches (``DRIFT_VIOLATIONS``) at zero."""
        for kind, header in DRIFT_VIOLATIONS:
            self._violation_child(route, kind, header)

    def remove_route(self, route: str) -> None:
        """Remove every drift series of ``route`` and forget its producers."""
        for key in [key for key in self._violation_children if key[0] == route]:
            del self._violation_children[key]
            self._violations.remove(*key)
        for key in [key for key in self._producer_children if key[0] == route]:
            del self._producer_children[key]
            self._producer_violations.remove(*key)
        self._producers.forget(route)

    def count(self, route: str, violations: Iterable[tuple[str, str]], *, producer: str) -> None:
        """Count each ``(kind, header)`` pair once, and once more under its producer."""
        # The loop over an empty iterable is the whole cost of the common case.
        producer_label: str | None = None
        for kind, header in violations:
            key = (route, kind, header)
            child = self._violation_children.get(key)
            if child is None:
                child = self._violation_child(route, kind, header)
            child.value += 1
            if producer_label is None:
                producer_label = self._producers.label(route, producer)
            by_producer = (route, producer_label, str(kind))
            producer_child = self._producer_children.get(by_producer)
            if producer_child is None:
                producer_child = self._producer_violations.labels(*by_producer)
                self._producer_children[by_producer] = producer_child
            producer_child.value += 1

    def _violation_child(self, route: str, kind: str, header: str) -> Cell:
        """Create, cache and return the ``violations_total`` child of one triple."""
        # str() so that a StrEnum kind and its plain string value share one cache entry
        # and one label value.
        key = (route, str(kind), header)
        child = self._violation_children.get(key)
        if child is None:
            child = self._violations.labels(*key)
            self._violation_children[key] = child
        return child
