"""The route map: YAML text parsed once into immutable, validated config objects.

This module owns the route map's schema, its ``${VAR}`` interpolation and every message a
bad route map produces (``FILE:LINE: key.path: what is wrong and what is allowed``). It is
pure: no environment reads (the caller passes ``env``), no logging, no clock, no network.
``load_route_map`` reads the one file it is given; nothing else here touches the disk.

Parsing runs in four steps, each reporting errors against the YAML node tree's lines:

1. ``yaml.compose`` builds the node tree (syntax errors keep pyyaml's mark).
2. The tree becomes plain data: duplicate keys are refused (pyyaml keeps the last one
   silently), string scalars are interpolated, line numbers are recorded per path.
3. pydantic validates the data against the file schema (unknown keys, types, enums,
   ranges); its error locations map back to lines.
4. Checks that span routes (unique names and queues, no route into the quarantine
   exchange), then conversion into the frozen objects the relay uses.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union, get_args, get_origin
from urllib.parse import unquote, urlsplit

import annotated_types
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from sidecar.contract import Publishers
from sidecar.errors import ConfigError

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping

    from pydantic_core import ErrorDetails

__all__ = [
    "BrokerConfig",
    "HttpConfig",
    "LogLevel",
    "Mode",
    "Publishers",
    "Route",
    "RouteMap",
    "TlsConfig",
    "describe",
    "load_route_map",
    "parse_route_map",
    "route_map_json_schema",
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


# --- the objects the relay uses ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """Client TLS files; each is a path or None."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """The broker connection; ``url`` may hold a password, so log ``masked_url`` only."""

    url: str = field(repr=False)  # a repr ends up in logs and tracebacks
    tls: TlsConfig
    prefetch: int
    heartbeat_s: int
    connect_timeout_s: float

    @property
    def login(self) -> str:
        """Return the user name the client logs in with, decoded; "guest" when the URL has none.

        Mirrors aiormq (``url.user or "guest"``): RabbitMQ checks ``user_id`` against it.
        """
        return unquote(urlsplit(self.url).username or "") or "guest"

    @property
    def masked_url(self) -> str:
        """Return the URL with its password, if any, replaced by ``***``."""
        return _mask_password(self.url)


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """Where /metrics, /healthz and /readyz listen; port 0 asks the OS for a free port."""

    host: str
    port: int

    @property
    def listen(self) -> str:
        """Return ``host:port``, with an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteMap:
    """The whole validated route map."""

    broker: BrokerConfig
    http: HttpConfig
    mode: Mode
    quarantine_exchange: str
    shutdown_grace_s: float
    routes: tuple[Route, ...]
    log_level: LogLevel | None = None  # None: the command line's, else INFO

    def route(self, name: str) -> Route:
        """Return the route called ``name``; raise ``KeyError`` naming the known routes."""
        for route in self.routes:
            if route.name == name:
                return route
        known = ", ".join(route.name for route in self.routes)
        raise KeyError(f"no route named {name!r}; the routes are: {known}")


# --- interpolation -----------------------------------------------------------------------

_DEFAULT_BROKER_URL = "${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"

# One pass, left to right: "$$", "${NAME}", "${NAME:-default}", or a "${" that is none of
# these (refused rather than kept, so a typo cannot leak a literal "${" into a queue name).
# A "$" before anything else is kept as it is.
_REFERENCE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<bad>\{))"
)


class _ProblemError(Exception):
    """A problem found while reading the node tree; the caller adds file, line and path."""


def _interpolate(text: str, *, env: Mapping[str, str]) -> str:
    """Replace each ``${VAR}``, ``${VAR:-default}`` and ``$$`` in one pass (no re-expansion)."""

    def replace(match: re.Match[str]) -> str:
        if match["dollar"] is not None:
            return "$"
        name = match["name"]
        if name is None:
            raise _ProblemError(
                f"invalid reference in {json.dumps(text)}: write ${{VAR}} or"
                " ${VAR:-default} (VAR is letters, digits and _), or $$ for a literal $"
            )
        default = match["default"]
        if default is None:
            if name not in env:
                raise _ProblemError(
                    f"environment variable {name} is not set; set it or write ${{{name}:-default}}"
                )
            return env[name]
        return env.get(name) or default

    return _REFERENCE.sub(replace, text)


# --- step 2: node tree -> plain data, with lines ----------------------------------------

_Path: TypeAlias = tuple[str | int, ...]

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _format_path(path: _Path) -> str | None:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text or None


MAX_VALUES = 100_000  # values in a route map once aliases are expanded
MAX_DEPTH = 32  # levels of nesting in a route map
_SHOW_MAX = 60  # characters of a value quoted in an error


class _TreeReader:
    """Turns a composed node tree into plain data, recording the line of every path."""

    def __init__(self, *, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.value_lines: dict[_Path, int] = {}
        self.key_lines: dict[_Path, int] = {}
        self._constructor = yaml.SafeLoader("")
        self._open: set[int] = set()
        self._values = 0

    def error(self, message: str, *, path: _Path, line: int) -> ConfigError:
        return ConfigError(message, source=self.source, line=line, key=_format_path(path))

    def read(self, node: yaml.Node, path: _Path) -> object:
        self.value_lines[path] = _line(node)
        self._values += 1
        if self._values > MAX_VALUES:
            # Aliases are references in the node tree; read out, each is a copy, and a few
            # nested ones (a "billion laughs") would fill memory.
            raise self.error(
                f"the file holds more than {MAX_VALUES:,} values once its YAML aliases are"
                " expanded; a route map needs far fewer",
                path=path,
                line=_line(node),
            )
        if len(path) > MAX_DEPTH:
            raise self.error(
                f"nested deeper than {MAX_DEPTH} levels; a route map needs four",
                path=path[:3],
                line=_line(node),
            )
        if id(node) in self._open:
            # An alias inside its own anchor: the data would be infinite.
            raise self.error(
                "an alias refers to a node that contains it", path=path, line=_line(node)
            )
        if isinstance(node, yaml.ScalarNode):
            return self._read_scalar(node, path)
        if node.tag not in (_MAP_TAG, _SEQ_TAG):
            raise self.error(f"unsupported YAML tag {node.tag}", path=path, line=_line(node))
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._read_mapping(node, path)
            return [self.read(item, (*path, index)) for index, item in enumerate(node.value)]
        finally:
            self._open.discard(id(node))

    def _read_scalar(self, node: yaml.ScalarNode, path: _Path) -> object:
        if node.tag == _STR_TAG:
            try:
                return _interpolate(node.value, env=self.env)
            except _ProblemError as e:
                raise self.error(str(e), path=path, line=_line(node)) from None
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as e:
            raise self.error(f"invalid value: {e.problem}", path=path, line=_line(node)) from None

    def _read_mapping(self, node: yaml.MappingNode, path: _Path) -> dict[str, object]:
        data: dict[str, object] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.error("expected a plain key", path=path, line=_line(key_node))
            # Keys are taken as written: never interpolated, and `1:` or `on:` stay strings
            # so they are reported as unknown keys rather than as puzzling types.
            key = key_node.value
            key_path = (*path, key)
            if key in data:
                raise self.error(
                    f"duplicate key; first defined on line {self.key_lines[key_path]};"
                    " each key may appear once",
                    path=key_path,
                    line=_line(key_node),
                )
            self.key_lines[key_path] = _line(key_node)
            data[key] = self.read(value_node, key_path)
        return data


# --- step 3: the file schema ----------------------------------------------------------------


def _refuse_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; no reader counts with booleans.
    if isinstance(value, bool):
        raise PydanticCustomError(
            "config_bool", "expected a number, got {got}", {"got": _show(value)}
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
            {"got": _show(value)},
        )
    return value


def _amqp_url(value: str) -> str:
    problem = _url_problem(value)
    if problem:
        raise PydanticCustomError(
            "config_url",
            "{problem}; expected amqp://[user[:password]@]host[:port][/vhost] or amqps://...,"
            " got {got}",
            {"problem": problem, "got": _show(_mask_password(value))},
        )
    return value


def _url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"the URL does not parse ({e})"
    if parts.scheme not in ("amqp", "amqps"):
        return "the scheme must be amqp or amqps"
    if not parts.hostname:
        return "the host is missing"
    if port == 0:
        return "port 0 is not a broker port"
    return None


def _listen(value: str) -> str:
    try:
        _split_listen(value)
    except _ProblemError as e:
        raise PydanticCustomError(
            "config_listen",
            '{problem}; expected host:port with port 0..65535, e.g. "0.0.0.0:9090" or "[::]:9090",'
            " got {got}",
            {"problem": str(e), "got": _show(value)},
        ) from None
    return value


def _split_listen(listen: str) -> tuple[str, int]:
    if listen.startswith("["):
        host, bracket, port = listen[1:].partition("]:")
        if not bracket or not host:
            raise _ProblemError("an IPv6 host needs the form [address]:port")
    else:
        host, colon, port = listen.rpartition(":")
        if not colon or not host:
            raise _ProblemError("host and port are both required")
        if ":" in host:
            raise _ProblemError("an IPv6 host must be in brackets")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise _ProblemError(f"the port {json.dumps(port)} is not a number from 0 to 65535")
    return host, int(port)


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


_Prefetch = Annotated[int, Field(ge=1, le=65535), BeforeValidator(_refuse_bool)]
_AmqpName = Annotated[str, AfterValidator(_amqp_name)]
_NonEmptyAmqpName = Annotated[str, AfterValidator(_non_empty), AfterValidator(_amqp_name)]
_OptionalPath = Annotated[str | None, AfterValidator(_optional_non_empty)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _TlsFile(_Strict):
    ca_file: _OptionalPath = None
    cert_file: _OptionalPath = None
    key_file: _OptionalPath = None


class _BrokerFile(_Strict):
    # parse_route_map fills in this default interpolated; it is here for the JSON Schema.
    url: Annotated[str, AfterValidator(_amqp_url)] = _DEFAULT_BROKER_URL
    url_file: _OptionalPath = None  # read into url by parse_route_map
    tls: _TlsFile = _TlsFile()
    prefetch: _Prefetch = 512
    heartbeat_s: Annotated[int, Field(ge=0, le=3600), BeforeValidator(_refuse_bool)] = 30
    connect_timeout_s: Annotated[
        float, Field(gt=0, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = 10.0


class _HttpFile(_Strict):
    listen: Annotated[str, AfterValidator(_listen)] = "0.0.0.0:9090"


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


def _at_least_one(routes: tuple[_RouteFile, ...]) -> tuple[_RouteFile, ...]:
    if not routes:
        raise PydanticCustomError(
            "config_no_routes", "expected at least one route (a list item with name, from and to)"
        )
    return routes


class _RouteMapFile(_Strict):
    broker: _BrokerFile = _BrokerFile()
    http: _HttpFile = _HttpFile()
    mode: Mode = Mode.ENFORCE
    quarantine: _QuarantineFile = _QuarantineFile()
    shutdown_grace_s: Annotated[
        float, Field(ge=0, allow_inf_nan=False), BeforeValidator(_refuse_bool)
    ] = 30.0
    routes: Annotated[tuple[_RouteFile, ...], AfterValidator(_at_least_one)]
    log_level: Annotated[LogLevel | None, BeforeValidator(_upper)] = None


def route_map_json_schema() -> dict[str, Any]:
    """Return the route map's JSON Schema (for the Helm chart's values.schema.json).

    String values may also hold ``${VAR}`` references, which the schema cannot express.
    """
    return _RouteMapFile.model_json_schema()


# --- pydantic errors -> our messages -------------------------------------------------------


def _show(value: object) -> str:
    """Render a value from the file the way YAML would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    if isinstance(value, str) and len(value) > _SHOW_MAX:
        return f'{json.dumps(value[:_SHOW_MAX])[:-1]}..." ({len(value):,} characters)'
    if isinstance(value, str | int | float):
        shown = json.dumps(value)
        return (
            shown if len(shown) <= _SHOW_MAX else f"{shown[:_SHOW_MAX]}... ({len(shown):,} digits)"
        )
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return json.dumps(str(value))


def _strip(annotation: object) -> tuple[object, list[object]]:
    """Unwrap ``Annotated`` and ``X | None``, collecting the constraints met on the way."""
    constraints: list[object] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *metadata = get_args(annotation)
            for item in metadata:
                constraints.extend(item.metadata if isinstance(item, FieldInfo) else [item])
        elif origin in (Union, UnionType):
            args = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(args) != 1:
                return annotation, constraints
            annotation = args[0]
        else:
            return annotation, constraints


def _schema_at(loc: _Path) -> tuple[object, list[object]]:
    """Return the declared type at a validation path, and its constraints."""
    annotation: object = _RouteMapFile
    constraints: list[object] = []
    for part in loc:
        annotation, _ = _strip(annotation)
        if isinstance(part, int):
            annotation, constraints = (get_args(annotation) or (None,))[0], []
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = _fields_by_key(annotation).get(part)
            if info is None:
                return None, []
            annotation, constraints = info.annotation, list(info.metadata)
        else:
            return None, []
    annotation, more = _strip(annotation)
    return annotation, constraints + more


def _fields_by_key(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _describe_error(error: ErrorDetails) -> str:
    kind, loc, value = error["type"], tuple(error["loc"]), error["input"]
    got = _show(value)
    match kind:
        case "missing":
            return "this key is required"
        case "extra_forbidden":
            parent, _ = _schema_at(loc[:-1])
            allowed = (
                list(_fields_by_key(parent))
                if isinstance(parent, type) and issubclass(parent, BaseModel)
                else []
            )
            hint = get_close_matches(str(loc[-1]), allowed, n=1)
            did_you_mean = f'did you mean "{hint[0]}"? ' if hint else ""
            if not allowed:
                return "unknown key"
            return f"unknown key; {did_you_mean}allowed keys are: {', '.join(allowed)}"
        case "enum":
            annotation, _ = _schema_at(loc)
            if isinstance(annotation, type) and issubclass(annotation, StrEnum):
                expected = " or ".join(f'"{member.value}"' for member in annotation)
                return f"expected {expected}, got {got}"
        case "string_type":
            quote = "; quote it to make it a string" if isinstance(value, int | float) else ""
            return f"expected a string, got {got}{quote}"
        case "int_type" | "int_parsing" | "int_from_float":
            return f"expected an integer, got {got}"
        case "float_type" | "float_parsing":
            return f"expected a number, got {got}"
        case "finite_number":
            return f"expected a finite number, got {got}"
        case "model_type" | "model_attributes_type" | "dict_type":
            return f"expected a mapping, got {got}"
        case "tuple_type" | "list_type":
            return f"expected a list, got {got}"
        case "greater_than" | "greater_than_equal" | "less_than" | "less_than_equal":
            annotation, constraints = _schema_at(loc)
            number = "an integer" if annotation is int else "a number"
            return f"expected {number} {_describe_bounds(constraints)}, got {got}"
        case _ if kind.startswith("config_"):
            return error["msg"]
    return f"{error['msg']}, got {got}"


def _describe_bounds(constraints: list[object]) -> str:
    bounds: dict[str, object] = {}
    for item in constraints:
        if isinstance(item, annotated_types.Ge):
            bounds["ge"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            bounds["gt"] = item.gt
        elif isinstance(item, annotated_types.Le):
            bounds["le"] = item.le
    if "ge" in bounds and "le" in bounds:
        return f"from {bounds['ge']} to {bounds['le']}"
    if "gt" in bounds:
        return f"greater than {bounds['gt']}"
    return f"of at least {bounds.get('ge')}"


def _line_for(loc: _Path, reader: _TreeReader, *, kind: str) -> int:
    """Return the line of a path, or of its nearest ancestor that is in the file."""
    if kind == "extra_forbidden" and loc in reader.key_lines:
        return reader.key_lines[loc]
    for end in range(len(loc), 0, -1):
        if loc[:end] in reader.value_lines:
            return reader.value_lines[loc[:end]]
    return reader.value_lines.get((), 1)


def _translate(e: ValidationError, reader: _TreeReader) -> ConfigError:
    """Report the error that comes first in the file, a missing key only when nothing else.

    A missing key is often the other half of a misspelt one, and "unknown key "rout";
    did you mean "routes"?" is the message that helps.
    """
    located = [
        (
            error["type"] == "missing",
            _line_for(tuple(error["loc"]), reader, kind=error["type"]),
            index,
            error,
        )
        for index, error in enumerate(e.errors())
    ]
    _, line, _, error = min(located, key=lambda item: item[:3])
    return ConfigError(
        _describe_error(error),
        source=reader.source,
        line=line,
        key=_format_path(tuple(error["loc"])),
    )


# --- step 4: checks across routes, then the objects -----------------------------------------


def _check_across(file: _RouteMapFile, reader: _TreeReader) -> None:
    """Refuse what each key allows alone but the map as a whole does not."""

    def fail(message: str, path: _Path) -> ConfigError:
        return reader.error(message, path=path, line=_line_for(path, reader, kind=""))

    tls, url = file.broker.tls, file.broker.url
    if (tls.cert_file is None) != (tls.key_file is None):
        raise fail("cert_file and key_file go together; set both or neither", ("broker", "tls"))
    if any((tls.ca_file, tls.cert_file, tls.key_file)) and urlsplit(url).scheme != "amqps":
        raise fail(
            "TLS files are set but broker.url is not amqps://; use amqps:// or drop them",
            ("broker", "tls"),
        )

    names: dict[str, int] = {}
    queues: dict[str, tuple[str, int]] = {}
    quarantine = file.quarantine.exchange
    for index, route in enumerate(file.routes):
        path: _Path = ("routes", index)
        name_line = _line_for((*path, "name"), reader, kind="")
        queue_line = _line_for((*path, "from"), reader, kind="")
        if route.name in names:
            raise fail(
                f"duplicate route name {_show(route.name)}; first defined on line"
                f" {names[route.name]}; route names must be unique",
                (*path, "name"),
            )
        if route.queue in queues:
            first, first_line = queues[route.queue]
            raise fail(
                f"queue {_show(route.queue)} is already consumed by route {_show(first)}"
                f" (line {first_line}); two routes may not consume the same queue",
                (*path, "from"),
            )
        if route.to.exchange == quarantine:
            raise fail(
                f"{_show(quarantine)} is the quarantine exchange (quarantine.exchange);"
                " a route may not publish to it",
                (*path, "to", "exchange"),
            )
        if route.to.exchange == "" and route.to.routing_key == route.queue:
            raise fail(
                f"the default exchange with routing key {_show(route.queue)} publishes back"
                " into the route's own queue, a loop",
                (*path, "to", "routing_key"),
            )
        names[route.name] = name_line
        queues[route.queue] = (route.name, queue_line)


def _build(file: _RouteMapFile) -> RouteMap:
    broker = file.broker
    host, port = _split_listen(file.http.listen)
    return RouteMap(
        broker=BrokerConfig(
            url=broker.url,
            tls=TlsConfig(
                ca_file=broker.tls.ca_file,
                cert_file=broker.tls.cert_file,
                key_file=broker.tls.key_file,
            ),
            prefetch=broker.prefetch,
            heartbeat_s=broker.heartbeat_s,
            connect_timeout_s=broker.connect_timeout_s,
        ),
        http=HttpConfig(host=host, port=port),
        mode=file.mode,
        quarantine_exchange=file.quarantine.exchange,
        shutdown_grace_s=file.shutdown_grace_s,
        log_level=file.log_level,
        routes=tuple(
            Route(
                name=route.name,
                queue=route.queue,
                exchange=route.to.exchange,
                routing_key=None if route.to.routing_key == "keep" else route.to.routing_key,
                publishers=route.publishers,
                origin=route.origin,
                mode=file.mode if route.mode is None else route.mode,
                prefetch=broker.prefetch if route.prefetch is None else route.prefetch,
            )
            for route in file.routes
        ),
    )


# --- the API ---------------------------------------------------------------------------------


def parse_route_map(
    text: str,
    *,
    source: str,
    env: Mapping[str, str],
    read_file: Callable[[str], str] | None = None,
) -> RouteMap:
    """Parse route-map YAML into a ``RouteMap``; raise ``ConfigError`` on the first problem.

    ``source`` names the file in messages; ``env`` resolves ``${VAR}`` references;
    ``read_file`` reads ``broker.url_file`` (a mounted secret), and without it that key
    is refused.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ConfigError(
            f"the YAML nests deeper than {MAX_DEPTH} levels; a route map needs four",
            source=source,
            line=None,
            key=None,
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        context = (
            f"{e.context} (line {e.context_mark.line + 1}), "
            if e.context and e.context_mark
            else ""
        )
        raise ConfigError(
            f"invalid YAML: {context}{e.problem}",
            source=source,
            line=mark.line + 1 if mark else None,
            key=None,
        ) from None
    except yaml.reader.ReaderError as e:
        code = f"U+{e.character:04X}" if isinstance(e.character, int) else _show(e.character)
        raise ConfigError(
            f"invalid YAML: character {code}: {e.reason}",
            source=source,
            line=text.count("\n", 0, e.position) + 1,
            key=None,
        ) from None
    if root is None:
        raise ConfigError(
            "the file is empty; expected a mapping with at least a routes list",
            source=source,
            line=1,
            key=None,
        )
    reader = _TreeReader(source=source, env=env)
    data = reader.read(root, ())
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level (broker, http, mode, quarantine,"
            f" shutdown_grace_s, routes), got {_show(data)}",
            source=source,
            line=_line(root),
            key=None,
        )
    broker = data.setdefault("broker", {})
    if isinstance(broker, dict):
        if broker.get("url_file") is not None:
            _url_from_file(broker, reader, read_file)
        # The default URL is itself a reference, so AMQP_URL works without a broker block.
        broker.setdefault("url", _interpolate(_DEFAULT_BROKER_URL, env=env))
    try:
        file = _RouteMapFile.model_validate(data)
    except ValidationError as e:
        raise _translate(e, reader) from None
    _check_across(file, reader)
    return _build(file)


def load_route_map(path: str | os.PathLike[str], *, env: Mapping[str, str]) -> RouteMap:
    """Read and parse the route map at ``path``; an unreadable file is a ``ConfigError``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read the route map: {e}", source=str(path), line=None, key=None
        ) from e
    return parse_route_map(
        text, source=str(path), env=env, read_file=lambda p: Path(p).read_text(encoding="utf-8")
    )


def _url_from_file(
    broker: dict[str, object], reader: _TreeReader, read_file: Callable[[str], str] | None
) -> None:
    """Replace ``broker.url_file`` by ``broker.url``, read from that file (a mounted secret).

    A problem with the URL it holds is reported on the url_file line, the password masked.
    """
    path, line = broker.pop("url_file"), reader.value_lines[("broker", "url_file")]
    if "url" in broker:
        raise reader.error(
            "set broker.url or broker.url_file, not both", path=("broker", "url_file"), line=line
        )
    if not isinstance(path, str) or not path:
        raise reader.error(
            f"expected the path of a file holding the broker URL, got {_show(path)}",
            path=("broker", "url_file"),
            line=line,
        )
    if read_file is None:
        raise reader.error(
            "only a route map read from a file can use url_file",
            path=("broker", "url_file"),
            line=line,
        )
    try:
        broker["url"] = read_file(path).strip()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise reader.error(
            f"cannot read {path}: {reason}; mount the secret there or set broker.url",
            path=("broker", "url_file"),
            line=line,
        ) from None
    reader.value_lines[("broker", "url")] = line


def describe(route_map: RouteMap) -> str:
    """Return a multi-line summary for ``acemq-sidecar check``; the password is masked."""
    broker = route_map.broker
    lines = [
        (
            f"broker: {broker.masked_url} (login {broker.login}, prefetch {broker.prefetch},"
            f" heartbeat {broker.heartbeat_s} s, connect timeout {broker.connect_timeout_s:g} s)"
        ),
        f"mode: {route_map.mode}",
        f"quarantine exchange: {route_map.quarantine_exchange}",
        f"http: {route_map.http.listen}",
        f"shutdown grace: {route_map.shutdown_grace_s:g} s",
        f"routes ({len(route_map.routes)}):",
    ]
    for route in route_map.routes:
        exchange = route.exchange or "(default exchange)"
        key = "(original routing key)" if route.routing_key is None else _show(route.routing_key)
        lines.append(
            f"  {route.name}: {route.queue} -> {exchange} / {key};"
            f" publishers {route.publishers}, origin {route.origin or '-'},"
            f" mode {route.mode}, prefetch {route.prefetch}"
        )
    return "\n".join(lines)


def _mask_password(url: str) -> str:
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:
        return "<unparsable URL>"
    if not has_password:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostport}").geturl()
