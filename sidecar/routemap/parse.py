"""The route map: YAML text parsed once into the immutable objects of ``model``.

This module owns the order of parsing and every check that spans keys or routes. Each
step reports errors against the YAML node tree's lines (``FILE:LINE: key.path: what is
wrong and what is allowed``):

1. ``yaml.compose`` builds the node tree (``yaml_source``; syntax errors keep pyyaml's mark).
2. The tree becomes plain data: duplicate keys are refused, string scalars are
   interpolated, line numbers are recorded per path (``yaml_source``).
3. pydantic validates the data against the file schema (``schema``); its error
   locations map back to lines (``diagnostics``).
4. Checks that span routes (unique names and queues, no route into the quarantine
   exchange), then conversion into the frozen objects the relay uses (here).

It is pure: no environment reads (the caller passes ``env``), no logging, no clock, no
network. It reads no file: ``sidecar.route_files.load_route_map`` reads the map's file and
passes its text in, and the files the map names (``broker.url_file``, ``username_file``
and ``password_file``, the TLS files) are read only through the functions the caller
passes in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from pydantic import ValidationError

from sidecar.errors import ConfigError, TlsFileError
from sidecar.routemap.diagnostics import line_for, translate
from sidecar.routemap.model import (
    BrokerConfig,
    HttpConfig,
    MetricsConfig,
    Route,
    RouteLimits,
    RouteMap,
    TlsConfig,
    TracingConfig,
)
from sidecar.routemap.schema import DEFAULT_BROKER_URL, RouteMapFile, split_listen
from sidecar.routemap.text import show
from sidecar.routemap.yaml_source import format_path, interpolate, read_yaml

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.broker import BrokerAddress
    from sidecar.routemap.yaml_source import KeyPath, TreeReader

__all__ = ["parse_route_map"]


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
        if "url" in broker and "urls" in broker:
            raise reader.error(
                "set broker.url (one address) or broker.urls (the nodes of a cluster), not both",
                path=("broker", "urls"),
                line=line_for(("broker", "urls"), reader, kind=""),
            )
        if "urls" not in broker:
            # The default URL is itself a reference, so AMQP_URL works without a broker block.
            broker.setdefault("url", interpolate(DEFAULT_BROKER_URL, env=env))
        if any(broker.get(key) is not None for key in _LOGIN_FILES):
            _login_from_files(broker, reader, read_file)
        for key in _LOGIN_FILES:
            broker.pop(key, None)
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


def _url_from_file(
    broker: dict[str, object], reader: TreeReader, read_file: Callable[[str], str] | None
) -> None:
    """Replace ``broker.url_file`` by ``broker.url``, read from that file (a mounted secret).

    The file holds one URL, or several one per line (blank lines and ``#`` comments
    skipped), which then count as ``broker.urls``. A problem with a URL it holds is
    reported on the url_file line, the password never shown.
    """
    path, line = broker.pop("url_file"), reader.value_lines[("broker", "url_file")]
    for key in ("url", "urls"):
        if key in broker:
            raise reader.error(
                f"set broker.{key} or broker.url_file, not both",
                path=("broker", "url_file"),
                line=line,
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
        text = read_file(path)
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise reader.error(
            f"cannot read {path}: {reason}; mount the secret there or set broker.url",
            path=("broker", "url_file"),
            line=line,
        ) from None
    urls = [
        stripped
        for stripped in (raw.strip() for raw in text.splitlines())
        if stripped and not stripped.startswith("#")
    ]
    if len(urls) == 1:
        broker["url"] = urls[0]
        reader.value_lines[("broker", "url")] = line
        return
    broker["urls"] = urls  # none: refused as an empty list, on this line
    reader.value_lines[("broker", "urls")] = line
    for index in range(len(urls)):
        reader.value_lines[("broker", "urls", index)] = line


_LOGIN_FILES = ("username_file", "password_file")


def _login_from_files(
    broker: dict[str, object], reader: TreeReader, read_file: Callable[[str], str] | None
) -> None:
    """Put the login of ``username_file`` and ``password_file`` into every broker URL.

    The files are a mounted Secret's keys (the RabbitMQ operators' ``username`` and
    ``password``); one line break at the end of either is not part of it. Both are
    percent-encoded into the URLs, which must name no user of their own. Problems are
    reported on the key's line; neither file's content is ever shown.
    """
    login: dict[str, str] = {}
    for key in _LOGIN_FILES:
        other = _LOGIN_FILES[1 - _LOGIN_FILES.index(key)]
        where: KeyPath = ("broker", key)
        line = reader.value_lines.get(where) or reader.value_lines[("broker", other)]
        login[key] = quote(_read_login_file(key, broker.get(key), reader, read_file, line), safe="")
    userinfo = f"{login['username_file']}:{login['password_file']}@"
    fallback = reader.value_lines[("broker", "username_file")]
    urls = broker.get("urls")
    if isinstance(urls, list):
        for index, url in enumerate(urls):
            urls[index] = _with_login(url, userinfo, reader, ("broker", "urls", index), fallback)
    elif "url" in broker:
        broker["url"] = _with_login(broker["url"], userinfo, reader, ("broker", "url"), fallback)


def _read_login_file(
    key: str,
    path: object,
    reader: TreeReader,
    read_file: Callable[[str], str] | None,
    line: int,
) -> str:
    where: KeyPath = ("broker", key)
    what = key.removesuffix("_file")
    if path is None:
        raise reader.error(
            "set broker.username_file and broker.password_file together", path=where, line=line
        )
    if not isinstance(path, str) or not path:
        raise reader.error(
            f"expected the path of a file holding the broker {what}, got {show(path)}",
            path=where,
            line=line,
        )
    if read_file is None:
        raise reader.error(
            f"only a route map read from a file can use {key}", path=where, line=line
        )
    try:
        text = read_file(path)
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise reader.error(
            f"cannot read {path}: {reason}; mount the secret there", path=where, line=line
        ) from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value:
        raise reader.error(
            f"{path} is empty; it must hold the broker {what}", path=where, line=line
        )
    return value


def _with_login(
    url: object, userinfo: str, reader: TreeReader, path: KeyPath, fallback: int
) -> object:
    """Return ``url`` with ``userinfo`` after its scheme; anything but a URL as it came."""
    if not isinstance(url, str) or "://" not in url:
        return url  # the schema refuses it, with its own message
    scheme, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if "@" in authority:
        raise reader.error(
            "the URL names a user, and broker.username_file and broker.password_file name"
            " one too: write the URL without it (amqp://host:port/vhost)",
            path=path,
            line=reader.value_lines.get(path, fallback),
        )
    return f"{scheme}://{userinfo}{rest}"


def _check_across(file: RouteMapFile, reader: TreeReader) -> None:
    """Refuse what each key allows alone but the map as a whole does not."""

    def fail(message: str, path: KeyPath) -> ConfigError:
        return reader.error(message, path=path, line=line_for(path, reader, kind=""))

    _check_broker(file, reader)
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


def _addresses(file: RouteMapFile) -> tuple[tuple[KeyPath, BrokerAddress], ...]:
    """Return the broker addresses with the key path each came from."""
    broker = file.broker
    if broker.urls is not None:
        return tuple((("broker", "urls", i), a) for i, a in enumerate(broker.urls))
    return () if broker.url is None else ((("broker", "url"), broker.url),)


def _check_broker(file: RouteMapFile, reader: TreeReader) -> None:
    """Refuse broker settings that each parse but do not fit together."""

    def fail(message: str, path: KeyPath) -> ConfigError:
        return reader.error(message, path=path, line=line_for(path, reader, kind=""))

    broker, tls = file.broker, file.broker.tls
    addresses = _addresses(file)
    if not addresses:
        raise fail("expected a broker URL (amqp://user:password@host/vhost)", ("broker", "url"))
    if (tls.cert_file is None) != (tls.key_file is None):
        raise fail("cert_file and key_file go together; set both or neither", ("broker", "tls"))
    if any((tls.ca_file, tls.cert_file, tls.key_file)) and not any(a.tls for _, a in addresses):
        raise fail(
            "TLS files are set but no broker URL is amqps://; use amqps:// or drop them",
            ("broker", "tls"),
        )
    explicit = broker.model_fields_set
    seen: dict[str, KeyPath] = {}
    first_vhost = addresses[0][1].vhost
    for path, address in addresses:
        if address.endpoint in seen:
            first = format_path(seen[address.endpoint])
            raise fail(
                f"{address.endpoint} is listed twice (first as {first}); list each once", path
            )
        seen[address.endpoint] = path
        if address.vhost != first_vhost:
            raise fail(
                f"the vhost {show(address.vhost)} differs from the first URL's"
                f" {show(first_vhost)}; every address must be a node of the same cluster"
                " and vhost",
                path,
            )
        if (
            "heartbeat_s" in explicit
            and address.heartbeat_s is not None
            and address.heartbeat_s != broker.heartbeat_s
        ):
            raise fail(
                f"the URL's heartbeat={address.heartbeat_s} contradicts broker.heartbeat_s"
                f" ({broker.heartbeat_s}); set it in one place",
                path,
            )
        if (
            "connect_timeout_s" in explicit
            and address.connect_timeout_s is not None
            and address.connect_timeout_s != broker.connect_timeout_s
        ):
            raise fail(
                f"the URL's connection_timeout={round(address.connect_timeout_s * 1000)} (ms)"
                f" contradicts broker.connect_timeout_s ({broker.connect_timeout_s:g} s);"
                " set it in one place",
                path,
            )


def _build(file: RouteMapFile) -> RouteMap:
    broker = file.broker
    host, port = split_listen(file.http.listen)
    limits = RouteLimits(
        consumer_timeout_s=broker.consumer_timeout_s,
        nack_max_attempts=broker.nack_retry.max_attempts,
        nack_max_s=broker.nack_retry.max_s,
        return_max_attempts=broker.return_retry.max_attempts,
        return_delay_s=broker.return_retry.delay_s,
        return_max_per_s=broker.return_retry.max_per_s,
        max_in_flight_bytes=broker.max_in_flight_bytes,
        max_body_bytes=broker.max_body_bytes,
    )
    return RouteMap(
        broker=BrokerConfig(
            addresses=tuple(address for _, address in _addresses(file)),
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
        tracing=None
        if file.tracing is None
        else TracingConfig(
            enabled=file.tracing.enabled,
            endpoint=file.tracing.endpoint,
            protocol=file.tracing.protocol,
            sampler_ratio=file.tracing.sampler_ratio,
            service_name=file.tracing.service_name,
            link=file.tracing.link,
            traceparent=file.tracing.traceparent,
            max_queue_size=(
                file.tracing.max_queue_size
                if "max_queue_size" in file.tracing.model_fields_set
                else None
            ),
        ),
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
                single_active_consumer=route.single_active_consumer,
                trace_header_values=route.trace_header_values,
                delivery_limit=route.delivery_limit,
            )
            for route in file.routes
        ),
    )
