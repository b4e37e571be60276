"""The HTTP side fed arbitrary request bytes: /metrics and the probes, through h11.

``check`` writes the input to one end of a socket pair, ends it, and lets
``http_exchange.exchange`` read a request from the other and answer it with the sidecar's
own endpoints (a registry with a series, a live probe, a readiness probe with a report).
It must not raise; it answers every client that sent a byte with one whole HTTP/1.1
response that says ``Connection: close``; a request refused by h11 is a 4xx or 5xx of its
own, never a 500 (an endpoint broken by what a client sent), and a HEAD that was read has
no body (one refused as malformed is answered as any refused request is).
"""

from __future__ import annotations

import asyncio
import re
import socket

from prometheus_client import CollectorRegistry, Counter

from sidecar.observe.health import Probe, _Endpoints
from sidecar.observe.http_exchange import exchange

__all__ = ["check"]

_STATUS = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) [^\r\n]*\r\n")
_LOOP = asyncio.new_event_loop()
_REGISTRY = CollectorRegistry()
Counter(
    "acemq_sidecar_fuzz", "A series for /metrics to show.", ["route"], registry=_REGISTRY
).labels("orders").inc()
_ENDPOINTS = _Endpoints(
    registry=_REGISTRY,
    liveness=lambda: Probe(ok=True),
    readiness=lambda: Probe(ok=False, detail="route orders: paused", report={"orders": "paused"}),
)


async def _serve(server: socket.socket) -> None:
    await exchange(
        server,
        respond=_ENDPOINTS.respond,
        request_timeout_s=5.0,
        response_timeout_s=5.0,
        on_answer=lambda: None,
    )


def _response(data: bytes) -> bytes:
    client, server = socket.socketpair()
    with client, server:
        server.setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        _LOOP.run_until_complete(_serve(server))
        server.close()
        chunks = []
        while chunk := client.recv(1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)


def check(data: bytes) -> None:
    """Raise unless the exchange answers as the module docstring says."""
    answer = _response(data)
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
