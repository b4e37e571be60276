"""/metrics, /healthz and /readyz: what each path answers, served by ``http_server``.

This module owns the endpoints and nothing else: it knows no metric names (those are
``sidecar.observe.metrics``) and decides nothing about health (the probes are injected). The
server (``sidecar.observe.http_server``) runs in a thread of its own, so a slow scrape never
blocks the sidecar's event loop and a stuck loop can still be reported; it bounds
connections, descriptors and time per request, and writes nothing to stderr per request.

``/metrics`` answers in the Prometheus text format, or in OpenMetrics when the scraper's
``Accept`` header asks for ``application/openmetrics-text`` (prometheus_client chooses).
A probe answers 200 or 503 with its report as JSON when it has one, else with plain text.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from sidecar.broker import host_port
from sidecar.errors import HealthBindError
from sidecar.observe.http_exchange import Reply, Request
from sidecar.observe.http_server import HttpServer, Limits, listen

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from prometheus_client import CollectorRegistry

__all__ = ["HealthBindError", "HealthServer", "Probe"]

logger = logging.getLogger(__name__)

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Probe:
    """What a liveness or readiness probe reports.

    ``detail`` holds one line per reason when ``ok`` is false, for example
    ``route orders: exchange "orders" does not exist``; it is the 503 response body unless
    there is a ``report``. A ``report`` (JSON-serialisable) is the response body whatever the
    status, for a client that wants to read which part is down and why.
    """

    ok: bool
    detail: str = ""
    report: Mapping[str, object] | None = None


class _Endpoints:
    """Answer GET and HEAD on /metrics, /healthz and /readyz; 404 elsewhere."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        liveness: Callable[[], Probe],
        readiness: Callable[[], Probe],
    ) -> None:
        self._registry = registry
        self._liveness = liveness
        self._readiness = readiness

    def respond(self, request: Request) -> Reply:
        """Answer one request (the server leaves the body out for HEAD)."""
        if request.method not in {"GET", "HEAD"}:
            return Reply(
                status=HTTPStatus.NOT_IMPLEMENTED,
                content_type=_TEXT,
                body=_line(f"unsupported method {request.method}: use GET or HEAD"),
            )
        status, content_type, body = self._route(urlsplit(request.target).path, request)
        return Reply(status=status, content_type=content_type, body=body)

    def _route(self, path: str, request: Request) -> tuple[HTTPStatus, str, bytes]:
        match path:
            case "/metrics":
                return self._metrics(request.headers.get("accept", ""))
            case "/healthz":
                return _probe(self._liveness)
            case "/readyz":
                return _probe(self._readiness)
            case _:
                return HTTPStatus.NOT_FOUND, _TEXT, b"not found: try /metrics, /healthz, /readyz\n"

    def _metrics(self, accept: str) -> tuple[HTTPStatus, str, bytes]:
        try:
            encode, content_type = choose_encoder(accept)
        except (TypeError, ValueError):
            # prometheus_client cannot read this Accept header (an openmetrics version that
            # is not all numbers): the text format, which every scraper takes.
            encode, content_type = choose_encoder("")
        try:
            body = encode(self._registry)
        except Exception as e:  # a broken collector must not break the endpoint
            logger.warning("collecting metrics failed", exc_info=True)
            return HTTPStatus.INTERNAL_SERVER_ERROR, _TEXT, _line(f"{type(e).__name__}: {e}")
        return HTTPStatus.OK, content_type, body


def _probe(probe: Callable[[], Probe]) -> tuple[HTTPStatus, str, bytes]:
    """Run ``probe``: 200 or 503 with its report, else "ok" or its detail; 503 if it raises."""
    try:
        result = probe()
        status = HTTPStatus.OK if result.ok else HTTPStatus.SERVICE_UNAVAILABLE
        if result.report is not None:
            return status, _JSON, _line(json.dumps(result.report, ensure_ascii=False))
    except Exception as e:  # noqa: BLE001 - a probe that raises means "not healthy"
        return HTTPStatus.SERVICE_UNAVAILABLE, _TEXT, _line(f"{type(e).__name__}: {e}")
    if result.ok:
        return status, _TEXT, b"ok\n"
    return status, _TEXT, _line(result.detail or "not ok")


def _line(text: str) -> bytes:
    """Encode ``text`` as the body, ending in exactly one newline."""
    return (text.rstrip("\n") + "\n").encode("utf-8", errors="replace")


class HealthServer:
    """Serve /metrics, /healthz and /readyz from a thread of their own, within ``limits``.

    ``liveness`` and ``readiness`` are called from the HTTP thread, once per request,
    concurrently with the event loop: they must only read simple state the loop keeps up
    to date (attributes, a dict snapshot), never await, touch the loop or do I/O, and
    return promptly. One that raises is reported as 503 with the exception's text.
    ``limits`` bound connections and time per request (``sidecar.observe.http_server.Limits``;
    its constants by default).
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        liveness: Callable[[], Probe],
        readiness: Callable[[], Probe],
        limits: Limits | None = None,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._endpoints = _Endpoints(registry=registry, liveness=liveness, readiness=readiness)
        self._limits = limits or Limits()
        self._server: HttpServer | None = None
        self._port: int | None = None

    def start(self) -> None:
        """Listen on ``host:port`` (port 0: an ephemeral port) and serve from a thread.

        Raises ``HealthBindError`` (an ``OSError``) naming the address if it cannot listen.
        """
        if self._server is not None:
            raise RuntimeError("HealthServer.start() called twice")
        try:
            listener = listen(self._host, self._requested_port)
        except OSError as e:
            raise HealthBindError(
                host=self._host,
                port=self._requested_port,
                listen=host_port(self._host, self._requested_port),
                cause=e,
            ) from e
        self._port = int(listener.getsockname()[1])
        self._server = HttpServer(
            listener,
            respond=self._endpoints.respond,
            limits=self._limits,
            name="acemq-sidecar-http",
        )
        self._server.start()
        logger.info(
            "serving /metrics, /healthz and /readyz",
            extra={"port": self.port, "max_connections": self._server.max_connections},
        )

    @property
    def port(self) -> int:
        """Return the bound port (the OS's choice when started with port 0), also after stop."""
        if self._port is None:
            raise RuntimeError("HealthServer.port read before start()")
        return self._port

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop serving: close every connection and the socket, join the thread.

        Waits at most ``timeout_s``. A response being written is cut. Idempotent; a server
        never started is a no-op.
        """
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout_s=timeout_s)
