"""/metrics, /healthz and /readyz over HTTP, served from a daemon thread.

This module owns the HTTP endpoint and nothing else: it knows no metric names (those are
``sidecar.metrics``) and decides nothing about health (the probes are injected). It uses
the standard library's ``ThreadingHTTPServer`` in its own thread, so a slow scrape never
blocks the sidecar's event loop, and it writes nothing to stderr per request.

``/metrics`` answers in the Prometheus text format, or in OpenMetrics when the scraper's
``Accept`` header asks for ``application/openmetrics-text`` (prometheus_client chooses).
A probe answers 200 or 503 with its report as JSON when it has one, else with plain text.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from sidecar.errors import SidecarError

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


class HealthBindError(SidecarError, OSError):
    """The HTTP endpoint could not listen on ``host:port``; ``errno`` is the OS's."""

    def __init__(self, *, host: str, port: int, cause: OSError) -> None:
        self.host = host
        self.port = port
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        super().__init__(
            cause.errno,
            f"cannot listen for /metrics, /healthz and /readyz on {listen}: "
            f"{cause.strerror or cause}; choose a free port or another http.listen address",
        )

    def __str__(self) -> str:
        return str(self.strerror)


class _Server(ThreadingHTTPServer):
    """The HTTP server, carrying what the handler serves."""

    # Request threads are daemons and are not joined on close: a probe stuck in a
    # request thread must not hold up shutdown.
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        *,
        family: socket.AddressFamily,
        registry: CollectorRegistry,
        liveness: Callable[[], Probe],
        readiness: Callable[[], Probe],
    ) -> None:
        self.address_family = family
        self.registry = registry
        self.liveness = liveness
        self.readiness = readiness
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        """Bind without ``HTTPServer``'s reverse DNS look-up, which can hang start-up."""
        # HTTPServer.server_bind calls socket.getfqdn(host); a probe endpoint has no use
        # for the name, and a slow resolver would delay the sidecar's start.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """Log a failed request at DEBUG instead of printing a traceback to stderr."""
        # A scraper that hangs up mid-response is routine, not an error worth stderr.
        # socketserver calls this from its except clause, so exc_info is the request's.
        del request
        logger.debug("HTTP request from %s failed", client_address, exc_info=True)  # noqa: LOG014


class _Handler(BaseHTTPRequestHandler):
    """Answer GET and HEAD on /metrics, /healthz and /readyz; 404 elsewhere."""

    server: _Server
    # A client that opens a connection and sends nothing must not hold a thread forever.
    timeout = 10

    def do_GET(self) -> None:
        """Serve the endpoint with its body."""
        self._respond(with_body=True)

    def do_HEAD(self) -> None:
        """Serve the endpoint's status and headers only."""
        self._respond(with_body=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401
        """Drop per-request logging: scrapes every few seconds would flood stderr."""

    def _respond(self, *, with_body: bool) -> None:
        status, content_type, body = self._route(urlsplit(self.path).path)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def _route(self, path: str) -> tuple[HTTPStatus, str, bytes]:
        match path:
            case "/metrics":
                return self._metrics(self.headers.get("Accept", ""))
            case "/healthz":
                return _probe(self.server.liveness)
            case "/readyz":
                return _probe(self.server.readiness)
            case _:
                return HTTPStatus.NOT_FOUND, _TEXT, b"not found: try /metrics, /healthz, /readyz\n"

    def _metrics(self, accept: str) -> tuple[HTTPStatus, str, bytes]:
        encode, content_type = choose_encoder(accept)
        try:
            body = encode(self.server.registry)
        except Exception as e:  # a broken collector must not kill the thread
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
    """Serve /metrics, /healthz and /readyz from a daemon thread.

    ``liveness`` and ``readiness`` are called from the HTTP thread, once per request,
    concurrently with the event loop: they must only read simple state the loop keeps up
    to date (attributes, a dict snapshot), never await, touch the loop or do I/O, and
    return promptly. One that raises is reported as 503 with the exception's text.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        liveness: Callable[[], Probe],
        readiness: Callable[[], Probe],
    ) -> None:
        self._host = host
        self._requested_port = port
        self._registry = registry
        self._liveness = liveness
        self._readiness = readiness
        self._server: _Server | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind ``host:port`` (port 0: an ephemeral port) and serve in a daemon thread.

        Raises ``HealthBindError`` (an ``OSError``) naming the address if it cannot listen.
        """
        if self._server is not None:
            raise RuntimeError("HealthServer.start() called twice")
        try:
            family = _address_family(self._host, self._requested_port)
            server = _Server(
                (self._host, self._requested_port),
                family=family,
                registry=self._registry,
                liveness=self._liveness,
                readiness=self._readiness,
            )
        except OSError as e:
            raise HealthBindError(host=self._host, port=self._requested_port, cause=e) from e
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="acemq-sidecar-http",
            daemon=True,
        )
        self._server, self._thread, self._port = server, thread, server.server_port
        thread.start()
        logger.info("serving /metrics, /healthz and /readyz", extra={"port": self.port})

    @property
    def port(self) -> int:
        """Return the bound port (the OS's choice when started with port 0), also after stop."""
        if self._port is None:
            raise RuntimeError("HealthServer.port read before start()")
        return self._port

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop serving, close the socket and join the thread, waiting at most ``timeout_s``.

        Requests already being answered finish in their own daemon threads. Idempotent; a
        server never started is a no-op.
        """
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        # shutdown() returns within serve_forever's poll interval: requests run in their
        # own threads, never in the serving loop.
        server.shutdown()
        server.server_close()
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("HTTP thread still running after %.1f s", timeout_s)


def _address_family(host: str, port: int) -> socket.AddressFamily:
    """Return the address family ``host`` binds with: IPv6 for an IPv6 literal or name."""
    if not host:
        return socket.AF_INET  # "" is every IPv4 address, as socketserver reads it
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]
