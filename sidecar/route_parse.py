"""The route map: YAML text parsed once into the immutable objects of ``route_map``.

This module owns the order of parsing and every check that spans keys or routes. Each
step reports errors against the YAML node tree's lines (``FILE:LINE: key.path: what is
wrong and what is allowed``):

1. ``yaml.compose`` builds the node tree (``route_yaml``; syntax errors keep pyyaml's mark).
2. The tree becomes plain data: duplicate keys are refused, string scalars are
   interpolated, line numbers are recorded per path (``route_yaml``).
3. pydantic validates the data against the file schema (``route_schema``); its error
   locations map back to lines (``route_errors``).
4. Checks that span routes (unique names and queues, no route into the quarantine
   exchange), then conversion into the frozen objects the relay uses (here).

It is pure: no environment reads (the caller passes ``env``), no logging, no clock, no
network. ``load_route_map`` reads the one file it is given; the files the map names
(``broker.url_file``, the TLS files) are read only through the functions the caller
passes in.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import ValidationError

from sidecar.errors import ConfigError, TlsFileError
from sidecar.route_errors import line_for, translate
from sidecar.route_map import (
    BrokerConfig,
    HttpConfig,
    MetricsConfig,
    Route,
    RouteLimits,
    RouteMap,
    TlsConfig,
)
from sidecar.route_schema import DEFAULT_BROKER_URL, RouteMapFile, split_listen
from sidecar.route_text import show
from sidecar.route_yaml import interpolate, read_yaml

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping

    from sidecar.route_yaml import KeyPath, TreeReader

__all__ = ["load_route_map", "parse_route_map"]


def parse_route_map(
    text: str,
    *,
    source: str,
    env: Mapping[str, str],
    read_file: Callable[[str], str] | None = None,
    check_tls: Callable[[TlsConfig], None] | None = None,
) -> RouteMap:
    """Parse route-map YAML into a ``RouteMap``; raise ``ConfigError`` on the first problem.

    ``source`` names the file in messages; ``env`` resolves ``${VAR}`` references;
    ``read_file`` reads ``broker.url_file`` (a mounted secret), and without it that key
    is refused. ``check_tls``, when given, is called with ``broker.tls`` if it names a
    file; the ``TlsFileError`` it raises is reported at that key's line.
    """
    data, reader = read_yaml(text, source=source, env=env)
    broker = data.setdefault("broker", {})
    if isinstance(broker, dict):
        if broker.get("url_file") is not None:
            _url_from_file(broker, reader, read_file)
        # The default URL is itself a reference, so AMQP_URL works without a broker block.
        broker.setdefault("url", interpolate(DEFAULT_BROKER_URL, env=env))
    try:
        file = RouteMapFile.model_validate(data)
    except ValidationError as e:
        raise translate(e, reader) from None
    _check_across(file, reader)
    route_map = _build(file)
    tls = route_map.broker.tls
    if check_tls is not None and any((tls.ca_file, tls.cert_file, tls.key_file)):
        try:
            check_tls(tls)
        except TlsFileError as e:
            path: KeyPath = ("broker", "tls", e.key)
            raise reader.error(e.detail, path=path, line=line_for(path, reader, kind="")) from None
    return route_map


def load_route_map(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str],
    check_tls: Callable[[TlsConfig], None] | None = None,
) -> RouteMap:
    """Read and parse the route map at ``path``; an unreadable file is a ``ConfigError``.

    ``check_tls`` is as for ``parse_route_map``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read the route map: {e}", source=str(path), line=None, key=None
        ) from e
    return parse_route_map(
        text,
        source=str(path),
        env=env,
        read_file=lambda p: Path(p).read_text(encoding="utf-8"),
        check_tls=check_tls,
    )


def _url_from_file(
    broker: dict[str, object], reader: TreeReader, read_file: Callable[[str], str] | None
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
            f"expected the path of a file holding the broker URL, got {show(path)}",
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


def _check_across(file: RouteMapFile, reader: TreeReader) -> None:
    """Refuse what each key allows alone but the map as a whole does not."""

    def fail(message: str, path: KeyPath) -> ConfigError:
        return reader.error(message, path=path, line=line_for(path, reader, kind=""))

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
        path: KeyPath = ("routes", index)
        name_line = line_for((*path, "name"), reader, kind="")
        queue_line = line_for((*path, "from"), reader, kind="")
        if route.name in names:
            raise fail(
                f"duplicate route name {show(route.name)}; first defined on line"
                f" {names[route.name]}; route names must be unique",
                (*path, "name"),
            )
        if route.queue in queues:
            first, first_line = queues[route.queue]
            raise fail(
                f"queue {show(route.queue)} is already consumed by route {show(first)}"
                f" (line {first_line}); two routes may not consume the same queue",
                (*path, "from"),
            )
        if route.to.exchange == quarantine:
            raise fail(
                f"{show(quarantine)} is the quarantine exchange (quarantine.exchange);"
                " a route may not publish to it",
                (*path, "to", "exchange"),
            )
        if route.to.exchange == "" and route.to.routing_key == route.queue:
            raise fail(
                f"the default exchange with routing key {show(route.queue)} publishes back"
                " into the route's own queue, a loop",
                (*path, "to", "routing_key"),
            )
        names[route.name] = name_line
        queues[route.queue] = (route.name, queue_line)


def _build(file: RouteMapFile) -> RouteMap:
    broker = file.broker
    host, port = split_listen(file.http.listen)
    limits = RouteLimits(
        consumer_timeout_s=broker.consumer_timeout_s,
        nack_max_attempts=broker.nack_retry.max_attempts,
        nack_max_s=broker.nack_retry.max_s,
        max_in_flight_bytes=broker.max_in_flight_bytes,
    )
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
        metrics=MetricsConfig(producers_per_route=file.metrics.producers_per_route),
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
                limits=limits,
            )
            for route in file.routes
        ),
    )
