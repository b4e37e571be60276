"""One HTTP/1.1 request and its answer on one accepted connection, through h11.

``sidecar.observe.http_server`` accepts connections and bounds how many are open; this module
serves one of them: it reads a request head (at most ``MAX_REQUEST_HEAD_BYTES``, within
the request deadline), turns it into a ``Request``, writes the ``Reply`` the caller's
``respond`` gives (within the response deadline), and shuts the writing side. h11 parses
and writes HTTP, so no HTTP syntax is handled here but the request target, which h11
takes as any bytes but spaces: one that is not a URI is answered 400 here, never handed
to ``respond``. A body is never read, and every response says ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["MAX_REQUEST_HEAD_BYTES", "Reply", "Request", "exchange"]

logger = logging.getLogger(__name__)

MAX_REQUEST_HEAD_BYTES = 16 * 1024
"""Request line plus headers; more is answered 431 (h11's own default)."""

_RECV_BYTES = 4096
_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What a client asked: the method, the request target, and headers by lower-case name.

    A header sent more than once keeps its last value.
    """

    method: str
    target: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """What to answer: the body is sent for every method but HEAD."""

    status: HTTPStatus
    content_type: str
    body: bytes


async def exchange(
    sock: socket.socket,
    *,
    respond: Callable[[Request], Reply],
    request_timeout_s: float,
    response_timeout_s: float,
    on_answer: Callable[[], None],
) -> None:
    """Read one request within the deadline, answer it, close the writing side.

    ``on_answer`` is called once the reply is decided, before it is written: from then on
    the connection is answering, no longer reading. A client that leaves, a deadline
    passed or a broken connection ends the exchange quietly (a debug line).
    """
    loop = asyncio.get_running_loop()
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)
    try:
        try:
            async with asyncio.timeout(request_timeout_s):
                request = await _read_request(parser, sock, loop)
        except h11.RemoteProtocolError as e:
            status = HTTPStatus(e.error_status_hint)
            reply, head_only = (
                Reply(status=status, content_type=_TEXT, body=_bad(status)),
                False,
            )
        else:
            if request is None:  # the client closed without a request
                return
            reply, head_only = _answer(respond, request), request.method == "HEAD"
        on_answer()
        data = _encode(parser, reply, head_only=head_only)
        async with asyncio.timeout(response_timeout_s):
            await loop.sock_sendall(sock, data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
    except TimeoutError:
        logger.debug("HTTP connection cut at its deadline")
    except (OSError, h11.ProtocolError):
        logger.debug("HTTP connection failed", exc_info=True)


def _answer(respond: Callable[[Request], Reply], request: Request) -> Reply:
    try:
        return respond(request)
    except Exception as e:  # a task boundary: a broken endpoint answers 500
        logger.warning("answering %s %s failed", request.method, request.target, exc_info=True)
        return Reply(
            status=HTTPStatus.INTERNAL_SERVER_ERROR,
            content_type=_TEXT,
            body=f"{type(e).__name__}: {e}\n".encode(errors="replace"),
        )


async def _read_request(
    parser: h11.Connection, sock: socket.socket, loop: asyncio.AbstractEventLoop
) -> Request | None:
    """Feed ``parser`` from ``sock`` until it has a request head; None if the client left."""
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            parser.receive_data(await loop.sock_recv(sock, _RECV_BYTES))
            continue
        if isinstance(event, h11.Request):
            headers = {
                name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers
            }
            target = event.target.decode("ascii", errors="replace")
            try:
                urlsplit(target)  # what an endpoint reads its path with
            except ValueError:  # a bracket left open: "http://[::1/metrics", "//["
                raise h11.RemoteProtocolError(
                    "the request target is not a URI", error_status_hint=400
                ) from None
            return Request(method=event.method.decode("ascii"), target=target, headers=headers)
        return None  # ConnectionClosed: nothing else comes before a request


def _encode(parser: h11.Connection, reply: Reply, *, head_only: bool) -> bytes:
    """Return the response's bytes: status, headers, and the body unless ``head_only``."""
    headers = [
        ("Content-Type", reply.content_type),
        ("Content-Length", str(len(reply.body))),
        ("Cache-Control", "no-store"),
        ("Date", formatdate(usegmt=True)),
        ("Connection", "close"),
    ]
    status = reply.status
    data = parser.send(
        h11.Response(status_code=int(status), headers=headers, reason=status.phrase.encode())
    )
    if not head_only:
        data = (data or b"") + (parser.send(h11.Data(data=reply.body)) or b"")
    return (data or b"") + (parser.send(h11.EndOfMessage()) or b"")


def _bad(status: HTTPStatus) -> bytes:
    # Not h11's message: it quotes the client's bytes, which are not ours to echo.
    return f"bad request: {status.phrase.lower()}\n".encode()
