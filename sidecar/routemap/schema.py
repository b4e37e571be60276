"""The route map file's schema: what each key accepts, as strict pydantic models.

This module owns step 3 of parsing (see ``parse``): the models validate the plain
data read from the YAML (unknown keys, types, enums, ranges) and are the source of the
JSON Schema the Helm chart's ``values.schema.json`` carries. The models are the file's
shape, not the runtime model (``model``). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from sidecar.broker import BrokerAddress
from sidecar.contract import DEFAULT_PRODUCERS_PER_ROUTE, Publishers
from sidecar.errors import BrokerAddressError
from sidecar.routemap.model import (
    DEFAULT_CONSUMER_TIMEOUT_S,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    DEFAULT_NACK_MAX_ATTEMPTS,
    DEFAULT_NACK_MAX_S,
    DEFAULT_RETURN_DELAY_S,
    DEFAULT_RETURN_MAX_ATTEMPTS,
    DEFAULT_RETURN_MAX_PER_S,
    DEFAULT_STAGING_DELIVERY_LIMIT,
    LogLevel,
    Mode,
    TraceLink,
    TraceParent,
)
from sidecar.routemap.text import masked_url, show
from sidecar.routemap.yaml_source import ProblemError

__all__ = [
    "DEFAULT_BROKER_URL",
    "MAX_MESSAGE_SIZE",
    "BoundReason",
    "RouteMapFile",
    "route_map_json_schema",
    "split_listen",
]

DEFAULT_BROKER_URL = "${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
MAX_MESSAGE_SIZE = 512 * 1024 * 1024  # RabbitMQ's ceiling on its max_message_size, in bytes


@dataclass(frozen=True, slots=True)
class BoundReason:
    """Why a key's bound is what it is: said in the error that refuses a value past it."""

    text: str


def _refuse_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; no reader counts with booleans.
    if isinstance(value, bool):
        raise PydanticCustomError(
            "config_bool", "expected a number, got {got}", {"got": show(value)}
        )
    return value


def _amqp_name(value: str) -> str:
    if len(value.encode()) > 255:
        raise PydanticCustomError(
            "config_amqp_name",
            "expected at most 255 bytes (an AMQP short string), got {size}",
            {"size": len(value.encode())},
        )
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise PydanticCustomError("config_empty", 'expected a non-empty string, got ""')
    return value


def _optional_non_empty(value: str | None) -> str | None:
    if value == "":
        raise PydanticCustomError("config_empty", 'expected a non-empty string or null, got ""')
    return value


_ROUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def _route_name(value: str) -> str:
    # The name is a metric label and the suffix of the consumer tag `acemq-sidecar.<name>`;
    # 200 characters leave room for the prefix within AMQP's 255-byte short string.
    if not _ROUTE_NAME.fullmatch(value):
        raise PydanticCustomError(
            "config_route_name",
            'expected 1 to 200 letters, digits, "_", "." or "-", got {got}',
            {"got": show(value)},
        )
    return value


def _broker_address(value: object) -> BrokerAddress:
    """Parse a broker URL once, at load; the error names the part at fault, never the password."""
    if not isinstance(value, str):
        raise PydanticCustomError(
            "config_url", "expected a broker URL (a string), got {got}", {"got": show(value)}
        )
    try:
        return BrokerAddress.parse(value)
    except BrokerAddressError as e:
        raise PydanticCustomError("config_url", "{problem}", {"problem": str(e)}) from None


def _at_least_one_url(urls: tuple[BrokerAddress, ...]) -> tuple[BrokerAddress, ...]:
    if not urls:
        raise PydanticCustomError(
            "config_no_urls", "expected at least one broker URL; for one, broker.url will do"
        )
    return urls


def _listen(value: str) -> str:
    try:
        split_listen(value)
    except ProblemError as e:
        raise PydanticCustomError(
            "config_listen",
            '{problem}; expected host:port with port 0..65535, e.g. "0.0.0.0:9090" or "[::]:9090",'
            " got {got}",
            {"problem": str(e), "got": show(value)},
        ) from None
    return value


def split_listen(listen: str) -> tuple[str, int]:
    """Return the host and port of ``http.listen``; raise ``ProblemError`` saying what is wrong."""
    if listen.startswith("["):
        host, bracket, port = listen[1:].partition("]:")
        if not bracket or not host:
            raise ProblemError("an IPv6 host needs the form [address]:port")
    else:
        host, colon, port = listen.rpartition(":")
        if not colon or not host:
            raise ProblemError("host and port are both required")
        if ":" in host:
            raise ProblemError("an IPv6 host must be in brackets")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ProblemError(f"the port {json.dumps(port)} is not a number from 0 to 65535")
    return host, int(port)


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


_Prefetch = Annotated[int, Field(ge=1, le=65535), BeforeValidator(_refuse_bool)]
_AmqpName = Annotated[str, AfterValidator(_amqp_name)]
_NonEmptyAmqpName = Annotated[str, AfterValidator(_non_empty), AfterValidator(_amqp_name)]
_OptionalPath = Annotated[str | None, AfterValidator(_optional_non_empty)]
# A URL in the file, a BrokerAddress once validated; the JSON Schema says what the file holds.
_BrokerUrl = Annotated[
    BrokerAddress,
    PlainValidator(_broker_address),
    WithJsonSchema({"type": "string", "pattern": "^(?i:amqps?)://"}),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _TlsFile(_Strict):
    ca_file: _OptionalPath = None
    cert_file: _OptionalPath = None
    key_file: _OptionalPath = None


class _NackRetryFile(_Strict):
    max_attempts: Annotated[int, Field(ge=1, le=1000), BeforeValidator(_refuse_bool)] = (
        DEFAULT_NACK_MAX_ATTEMPTS
    )
    max_s: Annotated[
        float, Field(gt=0, le=86400, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = DEFAULT_NACK_MAX_S


class _ReturnRetryFile(_Strict):
    max_attempts: Annotated[int, Field(ge=0, le=10), BeforeValidator(_refuse_bool)] = (
        DEFAULT_RETURN_MAX_ATTEMPTS
    )
    delay_s: Annotated[
        float, Field(gt=0, le=10, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = DEFAULT_RETURN_DELAY_S
    max_per_s: Annotated[
        float, Field(ge=0, le=100_000, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = DEFAULT_RETURN_MAX_PER_S


class _BrokerFile(_Strict):
    # parse_route_map fills in DEFAULT_BROKER_URL, interpolated, unless urls is set.
    url: _BrokerUrl | None = None
    urls: Annotated[tuple[_BrokerUrl, ...], AfterValidator(_at_least_one_url)] | None = None
    url_file: _OptionalPath = None  # read into url (or urls) by parse_route_map
    # Read into every URL's user info by parse_route_map (the URLs then name no user).
    username_file: _OptionalPath = None
    password_file: _OptionalPath = None
    tls: _TlsFile = _TlsFile()
    prefetch: _Prefetch = 512
    heartbeat_s: Annotated[int, Field(ge=0, le=3600), BeforeValidator(_refuse_bool)] = 30
    connect_timeout_s: Annotated[
        float, Field(gt=0, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = 10.0
    # RabbitMQ's consumer_timeout as the broker is configured (it does not tell clients).
    consumer_timeout_s: Annotated[
        float, Field(ge=1, le=7 * 86400, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = DEFAULT_CONSUMER_TIMEOUT_S
    nack_retry: _NackRetryFile = _NackRetryFile()
    return_retry: _ReturnRetryFile = _ReturnRetryFile()
    max_in_flight_bytes: Annotated[
        int, Field(ge=65536, le=2**40), BeforeValidator(_refuse_bool)
    ] = DEFAULT_MAX_IN_FLIGHT_BYTES
    # A body larger than this is passed through to quarantine in frames, never held; no
    # broker delivers one over its max_message_size, at most 512 MiB.
    max_body_bytes: Annotated[
        int | None,
        Field(ge=65536, le=MAX_MESSAGE_SIZE),
        BoundReason("512 MiB, RabbitMQ's largest max_message_size"),
        BeforeValidator(_refuse_bool),
    ] = None


class _HttpFile(_Strict):
    listen: Annotated[str, AfterValidator(_listen)] = "0.0.0.0:9090"


class _MetricsFile(_Strict):
    producers_per_route: Annotated[int, Field(ge=0, le=1000), BeforeValidator(_refuse_bool)] = (
        DEFAULT_PRODUCERS_PER_ROUTE
    )


class _QuarantineFile(_Strict):
    exchange: _NonEmptyAmqpName = "acemq.quarantine"


class _TargetFile(_Strict):
    exchange: _AmqpName  # "" is the default exchange
    routing_key: _AmqpName = "keep"


class _RouteFile(_Strict):
    name: Annotated[str, AfterValidator(_route_name)]
    queue: _NonEmptyAmqpName = Field(alias="from")
    to: _TargetFile
    publishers: Publishers = Publishers.ACEMQ
    origin: Annotated[str | None, AfterValidator(_optional_non_empty)] = None
    mode: Mode | None = None
    prefetch: _Prefetch | None = None
    single_active_consumer: bool = False
    trace_header_values: bool = False
    delivery_limit: Annotated[int, Field(ge=0, le=1_000_000_000), BeforeValidator(_refuse_bool)] = (
        DEFAULT_STAGING_DELIVERY_LIMIT
    )


def _otlp_endpoint(value: str | None) -> str | None:
    if value is not None and not re.match(r"(?i)https?://[^/\s]", value):
        raise PydanticCustomError(
            "config_endpoint",
            'expected the collector\'s URL, http:// or https://, e.g. "http://otel-collector:4318",'
            " got {got}",
            {"got": show(masked_url(value))},  # interpolated: it may hold a token
        )
    return value


class _TracingFile(_Strict):
    enabled: bool = True
    endpoint: Annotated[
        str | None,
        AfterValidator(_otlp_endpoint),
        WithJsonSchema({"type": ["string", "null"], "pattern": "^(?i:https?)://"}),
    ] = None
    protocol: Literal["http/protobuf", "grpc"] | None = None
    sampler_ratio: Annotated[
        float | None, Field(ge=0, le=1, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = None
    service_name: Annotated[str | None, AfterValidator(_optional_non_empty)] = None
    link: TraceLink = TraceLink.PARENT
    traceparent: TraceParent = TraceParent.KEEP
    max_queue_size: Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_refuse_bool)] = 2048


def _at_least_one(routes: tuple[_RouteFile, ...]) -> tuple[_RouteFile, ...]:
    if not routes:
        raise PydanticCustomError(
            "config_no_routes", "expected at least one route (a list item with name, from and to)"
        )
    return routes


class _RouteMapFile(_Strict):
    broker: _BrokerFile = _BrokerFile()
    http: _HttpFile = _HttpFile()
    metrics: _MetricsFile = _MetricsFile()
    mode: Mode = Mode.ENFORCE
    quarantine: _QuarantineFile = _QuarantineFile()
    shutdown_grace_s: Annotated[
        float, Field(ge=0, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = 30.0
    routes: Annotated[tuple[_RouteFile, ...], AfterValidator(_at_least_one)]
    log_level: Annotated[LogLevel | None, BeforeValidator(_upper)] = None
    tracing: _TracingFile | None = None


# The models keep their private class names: they are the $defs names of the JSON Schema,
# which the Helm chart's values.schema.json embeds. Other modules use this public name.
RouteMapFile = _RouteMapFile


def route_map_json_schema() -> dict[str, Any]:
    """Return the route map's JSON Schema (for the Helm chart's values.schema.json).

    String values may also hold ``${VAR}`` references, which the schema cannot express.
    """
    return _RouteMapFile.model_json_schema()
