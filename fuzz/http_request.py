"""The HTTP side fed arbitrary request bytes: the request parsing for /metrics and probes.

``check`` writes the input to one end of a socket pair, ends it, and lets
``http_exchange.exchange`` read a request from the other (through h11) and answer it. It
must not raise; the request it hands on has a method that is a token and a target that
is a URI (what the endpoints split their path from); it answers every client that sent a
byte with one whole HTTP/1.1 response that says ``Connection: close``, never a 500 (what
a client sent broke the server), with the body its Content-Length says, none for a HEAD
that was read (one refused as malformed is answered as any refused request is).

The target answers with a responder of its own that holds the request to those rules
and answers as the endpoints do by path and method; ``ENDPOINTS`` are the sidecar's own
(``observe.health``), which tests/unit/fuzz runs the inputs found through.
"""

from __future__ import annotations

import asyncio
import re
import socket
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from sidecar.observe.health import Probe, _Endpoints
from sidecar.observe.http_exchange import Reply, Request, exchange

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ENDPOINTS", "check", "response"]

_STATUS = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) [^\r\n]*\r\n")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LOOP = asyncio.new_event_loop()
_REGISTRY = CollectorRegistry()
Counter(
    "acemq_sidecar_fuzz", "A series for /metrics to show.", ["route"], registry=_REGISTRY
).labels("orders").inc()
ENDPOINTS = _Endpoints(
    registry=_REGISTRY,
    liveness=lambda: Probe(ok=True),
    readiness=lambda: Probe(ok=False, detail="route orders: paused", report={"orders": "paused"}),
)
_PATHS = {"/metrics", "/healthz", "/readyz"}


def _respond(request: Request) -> Reply:
    """Answer as the endpoints do; raise (a 500) for a request the exchange should refuse."""
    if not _TOKEN.fullmatch(request.method):
        raise AssertionError(f"a method that is not a token: {request.method!r}")
    path = urlsplit(request.target).path  # raises for a target that is not a URI
    if request.method not in {"GET", "HEAD"}:
        return Reply(status=HTTPStatus.NOT_IMPLEMENTED, content_type="text/plain", body=b"no\n")
    status = HTTPStatus.OK if path in _PATHS else HTTPStatus.NOT_FOUND
    return Reply(status=status, content_type="text/plain", body=path.encode(errors="replace"))


async def _serve(server: socket.socket, respond: Callable[[Request], Reply]) -> None:
    await exchange(
        server,
        respond=respond,
        request_timeout_s=5.0,
        response_timeout_s=5.0,
        on_answer=lambda: None,
    )


def response(data: bytes, respond: Callable[[Request], Reply] = _respond) -> bytes:
    """Return the bytes the exchange answers ``data`` with, ``respond`` answering a request."""
    client, server = socket.socketpair()
    with client, server:
        server.setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        _LOOP.run_until_complete(_serve(server, respond))
        server.close()
        chunks = []
        while chunk := client.recv(1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)


def check(data: bytes) -> None:
    """Raise unless the exchange answers as the module docstring says."""
    verify(data, response(data))


def verify(data: bytes, answer: bytes) -> None:
    """Raise unless ``answer`` is what the module docstring says ``data`` must get."""
    if not data:
        if answer:
            raise AssertionError(f"an answer to no request: {answer!r}")
        return
    status = _STATUS.match(answer)
    if status is None:
        raise AssertionError(f"not an HTTP/1.1 response to {data[:200]!r}: {answer[:200]!r}")
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"\r\nconnection: close" not in head.lower():
        raise AssertionError(f"no Connection: close in {head!r}")
    if status.group(1) == b"500":
        raise AssertionError(f"500 for {data[:200]!r}: {body[:400]!r}")
    length = re.search(rb"(?i)\r\ncontent-length: ([0-9]+)", head)
    if length is None:
        raise AssertionError(f"no Content-Length in {head!r}")
    if len(body) not in {0, int(length.group(1))}:
        raise AssertionError(f"a body of {len(body)} bytes, Content-Length {length.group(1)!r}")
    if data.startswith(b"HEAD ") and body and not body.startswith(b"bad request: "):
        raise AssertionError(f"a body for HEAD: {data[:200]!r}")
