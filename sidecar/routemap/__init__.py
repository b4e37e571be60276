"""The route map's public face: the names the rest of the sidecar and its tests import.

The work is done by one module per job, each pure:

- ``route_map``: the runtime model (``RouteMap``, ``Route``, ``Mode``, ...) the relay uses;
- ``route_yaml``: YAML into plain data with a line per key, ``${VAR}``, the bomb guards;
- ``route_schema``: the file's pydantic schema and its JSON Schema;
- ``route_errors``: schema errors as ``FILE:LINE: key: what is allowed`` messages;
- ``route_parse``: the order of parsing, checks across routes, building the model;
- ``route_text``: values and the whole map as people read them.

Import from here unless a module needs only the runtime model (``route_map``), which
carries none of the parsing dependencies.
"""

from __future__ import annotations

from sidecar.routemap.model import (
    BrokerConfig,
    HttpConfig,
    LogLevel,
    MetricsConfig,
    Mode,
    Publishers,
    Route,
    RouteLimits,
    RouteMap,
    TlsConfig,
    TraceLink,
    TraceParent,
    TracingConfig,
)
from sidecar.routemap.parse import parse_route_map
from sidecar.routemap.reload_plan import ReloadPlan, plan_reload
from sidecar.routemap.schema import route_map_json_schema
from sidecar.routemap.text import describe
from sidecar.routemap.yaml_source import MAX_DEPTH, MAX_VALUES

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "BrokerConfig",
    "HttpConfig",
    "LogLevel",
    "MetricsConfig",
    "Mode",
    "Publishers",
    "ReloadPlan",
    "Route",
    "RouteLimits",
    "RouteMap",
    "TlsConfig",
    "TraceLink",
    "TraceParent",
    "TracingConfig",
    "describe",
    "parse_route_map",
    "plan_reload",
    "route_map_json_schema",
]
