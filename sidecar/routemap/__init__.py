"""The route map's public face: the names the rest of the sidecar and its tests import.

The work is done by one module per job, each pure:

- ``model``: the runtime model (``RouteMap``, ``Route``, ``Mode``, ...) the relay uses;
- ``yaml_source``: YAML into plain data with a line per key, ``${VAR}``, the bomb guards;
- ``schema``: the file's pydantic schema and its JSON Schema;
- ``diagnostics``: schema errors as ``FILE:LINE: key: what is allowed`` messages;
- ``parse``: the order of parsing, checks across routes, building the model;
- ``text``: values and the whole map as people read them;
- ``reload_plan``: what a reload changes, route by route.

Import from here. ``model`` itself imports none of the parsing dependencies (pydantic,
pyyaml), but importing it runs this package's ``__init__``, which does.
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
