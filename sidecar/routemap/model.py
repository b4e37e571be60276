"""The route map as the running sidecar sees it: immutable objects, every default resolved.

This module owns the runtime model that ``relay``, ``service`` and ``cli`` use: the
modes, the broker, HTTP and TLS settings, and one ``Route`` per staging queue. It is
pure: no parsing, no I/O. ``sidecar.routemap.parse`` builds these objects from a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from sidecar.broker import host_port
from sidecar.contract import Publishers

if TYPE_CHECKING:
    from sidecar.broker import BrokerAddress

__all__ = [
    "BrokerConfig",
    "HttpConfig",
    "LogLevel",
    "MetricsConfig",
    "Mode",
    "Publishers",
    "Route",
    "RouteLimits",
    "RouteMap",
    "TlsConfig",
    "TraceLink",
    "TraceParent",
    "TracingConfig",
]


class Mode(StrEnum):
    """What a route does with a message that breaks the contract."""

    ENFORCE = "enforce"  # repair or quarantine
    AUDIT = "audit"  # count and log violations, relay the original unchanged


class LogLevel(StrEnum):
    """How much the sidecar logs (``log_level``; any case in the file)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class TraceLink(StrEnum):
    """How a delivery's process span relates to the producer's context in its headers."""

    PARENT = "parent"  # the producer's span is its parent: one trace, producer to consumer
    LINKS = "links"  # a trace of its own, with a link to the producer's span


class TraceParent(StrEnum):
    """The ``traceparent`` a relayed copy carries."""

    KEEP = "keep"  # as the producer wrote it: an intermediary does not rewrite it
    SEND_SPAN = "send_span"  # the sidecar's send span: consumers see the hop in their trace


# --- the objects the relay uses ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """Client TLS files; each is a path or None."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """The broker connection: one address, or the nodes of a cluster to fail over between.

    ``addresses`` are in the file's order (``sidecar.dialer`` shuffles them once per process);
    each holds its own scheme and login, its password a ``Secret``, so a repr or a log
    line of this object never shows one. ``tls`` applies to every ``amqps://`` address.
    """

    addresses: tuple[BrokerAddress, ...]  # at least one
    tls: TlsConfig
    prefetch: int
    heartbeat_s: int
    connect_timeout_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """Where /metrics, /healthz and /readyz listen; port 0 asks the OS for a free port."""

    host: str
    port: int

    @property
    def listen(self) -> str:
        """Return ``host:port``, with an IPv6 host in brackets."""
        return host_port(self.host, self.port)


# RabbitMQ's own default consumer_timeout: 30 minutes.
DEFAULT_CONSUMER_TIMEOUT_S = 1800.0
DEFAULT_NACK_MAX_ATTEMPTS = 10
DEFAULT_NACK_MAX_S = 300.0
# A quorum queue's x-delivery-limit when none is set, from RabbitMQ 4.0 (settle.Target's).
DEFAULT_STAGING_DELIVERY_LIMIT = 20
# A returned copy is published again (after 0.2 s, then 0.4 s...), at most 10 a second a
# route: a binding a Khepri node has not seen yet (settle.returns). Off by default: the
# wait holds a delivery longer, and a partition may orphan what is held (docs/decisions/0071).
DEFAULT_RETURN_MAX_ATTEMPTS = 0
DEFAULT_RETURN_DELAY_S = 0.2
DEFAULT_RETURN_MAX_PER_S = 10.0
# The chart's memory limit is 256 MiB; a message in flight costs about twice its size in
# the process (the delivery and its copy's frames), and the rest is the sidecar itself.
DEFAULT_MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteLimits:
    """How long and how often a route retries a delivery the broker will not take, and bytes.

    ``consumer_timeout_s`` is the broker's delivery-acknowledgement timeout as the route map
    says it is (the broker does not tell its clients): a delivery held this long would be
    taken back by the broker, so the route settles it well before. ``nack_max_attempts`` and
    ``nack_max_s`` bound the retries of a copy the broker nacks (each may duplicate it).
    ``max_in_flight_bytes`` bounds the bodies in flight on one route; a body over
    ``max_body_bytes`` (None: no limit) is not held but passed through to quarantine.
    ``return_*``: a returned copy is published again at most ``return_max_attempts``
    times, first after ``return_delay_s`` (then doubled), at most ``return_max_per_s``
    a second on the route.
    """

    consumer_timeout_s: float = DEFAULT_CONSUMER_TIMEOUT_S
    nack_max_attempts: int = DEFAULT_NACK_MAX_ATTEMPTS
    nack_max_s: float = DEFAULT_NACK_MAX_S
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    max_body_bytes: int | None = None
    return_max_attempts: int = DEFAULT_RETURN_MAX_ATTEMPTS
    return_delay_s: float = DEFAULT_RETURN_DELAY_S
    return_max_per_s: float = DEFAULT_RETURN_MAX_PER_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One staging queue relayed to one exchange, with the per-route overrides resolved."""

    name: str
    queue: str
    exchange: str  # "" is the default exchange
    routing_key: str | None  # None: keep the message's original routing key
    publishers: Publishers
    origin: str | None
    mode: Mode
    prefetch: int
    limits: RouteLimits = field(default_factory=RouteLimits)
    # The staging queue has x-single-active-consumer (the platform's): the consumer is
    # never re-consumed, as a cancel would hand the active role to another replica.
    single_active_consumer: bool = False
    # A violation's span event may carry the header's value as received (tracing only).
    trace_header_values: bool = False
    # The staging queue's x-delivery-limit (0: none): a delivery one return from it goes to
    # quarantine rather than be dropped or dead-lettered by the broker at the next return.
    delivery_limit: int = DEFAULT_STAGING_DELIVERY_LIMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    """How /metrics bounds its labels."""

    producers_per_route: int  # distinct producer labels per route; the rest count as other


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingConfig:
    """The route map's ``tracing`` section; None in a field: the OTEL_* variable, else the SDK's.

    Its spans and exporter are ``sidecar.observe.tracing``'s; this is only what the file says.
    """

    enabled: bool = True
    endpoint: str | None = None  # the collector's base URL (OTEL_EXPORTER_OTLP_ENDPOINT)
    protocol: str | None = None  # "http/protobuf" or "grpc" (OTEL_EXPORTER_OTLP_PROTOCOL)
    sampler_ratio: float | None = None  # parent-based ratio (OTEL_TRACES_SAMPLER_ARG)
    service_name: str | None = None  # OTEL_SERVICE_NAME wins over it
    link: TraceLink = TraceLink.PARENT
    traceparent: TraceParent = TraceParent.KEEP
    # Spans waiting for export; more are dropped and counted (OTEL_BSP_MAX_QUEUE_SIZE).
    max_queue_size: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteMap:
    """The whole validated route map."""

    broker: BrokerConfig
    http: HttpConfig
    metrics: MetricsConfig
    mode: Mode
    quarantine_exchange: str
    shutdown_grace_s: float
    routes: tuple[Route, ...]
    log_level: LogLevel | None = None  # None: the command line's, else INFO
    tracing: TracingConfig | None = None  # None: no tracing section (OTEL_* may still turn it on)

    def route(self, name: str) -> Route:
        """Return the route called ``name``; raise ``KeyError`` naming the known routes."""
        for route in self.routes:
            if route.name == name:
                return route
        known = ", ".join(route.name for route in self.routes)
        raise KeyError(f"no route named {name!r}; the routes are: {known}")
