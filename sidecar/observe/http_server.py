"""A small HTTP/1.1 server with hard bounds, running its own event loop in one thread.

Owns the listener, the serving thread, the open connections and their cap
(:data:`MAX_CONNECTIONS`; at the cap the oldest one without a whole request is closed for
the newcomer), the request and response deadlines, the pause when accepting runs out of
descriptors or memory, and the descriptors left to the rest of the process
(:data:`RESERVED_DESCRIPTORS`).

Must not parse or write HTTP (``http_exchange`` does, through h11), know the endpoints
(the ``respond`` callable turns a ``Request`` into a ``Reply``), or run anything on the
relay's event loop.
Why: docs/decisions/0004-http-server-thread.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.observe.http_exchange import exchange
from sidecar.observe.rate_limit import RateLimit

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.observe.http_exchange import Reply, Request

__all__ = [
    "ACCEPT_RETRY_S",
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT_S",
    "RESERVED_DESCRIPTORS",
    "RESPONSE_TIMEOUT_S",
    "HttpServer",
    "Limits",
    "connection_budget",
    "listen",
]

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
"""Connections open at once. A scraper and two probes need three; 64 leaves room for
several Prometheus replicas and a busy kubelet while keeping the HTTP side's descriptors
(64 + 2) far below the usual RLIMIT_NOFILE of 1,024. Would be ``http.max_connections``."""

REQUEST_TIMEOUT_S = 5.0
"""Time from the accept to a complete request head, however slowly its bytes arrive. A
kubelet or Prometheus sends its request in one segment at once; 5 s is generous for a
slow network and cuts a slowloris client early. Would be ``http.request_timeout_s``."""

RESPONSE_TIMEOUT_S = 10.0
"""Time to hand the whole response to the kernel: a client that stops reading is cut."""

ACCEPT_RETRY_S = 1.0
"""Pause between accept attempts while the process is out of descriptors or memory, the
same pause asyncio's own servers take; the listen backlog keeps connections meanwhile."""

RESERVED_DESCRIPTORS = 32
"""Descriptors the HTTP side leaves to the rest of the process: the broker connection, the
event loops and their wake-up pipes, standard streams, the route map file, a TLS context's
files, with room to spare (the sidecar uses about 15)."""

LISTEN_BACKLOG = 128
"""Connections the kernel completes before they are accepted (socket.listen's default)."""

LOG_INTERVAL_S = 60.0
"""A condition that repeats under load (connections refused, accepts paused) is logged at
most once per interval, with how often it happened since the last line."""

_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_CLIENT_GAVE_UP = frozenset({errno.ECONNABORTED, errno.EPROTO})


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The server's bounds; the defaults are this module's constants."""

    max_connections: int = MAX_CONNECTIONS
    request_timeout_s: float = REQUEST_TIMEOUT_S
    response_timeout_s: float = RESPONSE_TIMEOUT_S
    accept_retry_s: float = ACCEPT_RETRY_S

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        for name in ("request_timeout_s", "response_timeout_s", "accept_retry_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def connection_budget(max_connections: int, *, descriptor_limit: int | None) -> int:
    """Return the connection cap that leaves ``RESERVED_DESCRIPTORS`` to the process.

    ``descriptor_limit`` is the soft RLIMIT_NOFILE (None: unlimited). The HTTP side holds
    the listener, the open connections and one being accepted; the cap is never below 1.
    """
    if descriptor_limit is None:
        return max_connections
    return max(1, min(max_connections, descriptor_limit - RESERVED_DESCRIPTORS - 2))


def _descriptor_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def listen(host: str, port: int) -> socket.socket:
    """Return a non-blocking TCP socket listening on ``host:port`` (port 0: the OS picks).

    ``host`` "" is every IPv4 address; an IPv6 literal or name listens on IPv6. No reverse
    DNS look-up is made. Raises ``OSError`` if it cannot listen.
    """
    family = _address_family(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restart must be able to listen again at once, with old connections in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _address_family(host: str, port: int) -> socket.AddressFamily:
    """Return the address family ``host`` binds with: IPv6 for an IPv6 literal or name."""
    if not host:
        return socket.AF_INET
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


@dataclass(slots=True, eq=False)
class _Connection:
    """One accepted connection; ``reading`` until its whole request head has arrived."""

    sock: socket.socket
    reading: bool = True
    task: asyncio.Task[None] | None = field(default=None)


class HttpServer:
    """Serve ``respond`` on a listening socket from a thread with its own event loop.

    ``respond`` runs on that thread, once per request, and must return promptly: while
    it runs no other request is served. An exception from it is answered 500 with its
    type and text. The server owns the socket from ``start()`` on and closes it at stop.
    """

    def __init__(
        self,
        listener: socket.socket,
        *,
        respond: Callable[[Request], Reply],
        limits: Limits | None = None,
        name: str = "http",
    ) -> None:
        self._listener = listener
        self._respond = respond
        self._limits = limits or Limits()
        self._name = name
        self._max_connections = self._limits.max_connections
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._running = threading.Event()
        self._log_limit = RateLimit[str](LOG_INTERVAL_S)  # "full", "paused"
        self._evicted = self._refused = 0  # since the last "limit reached" line

    @property
    def max_connections(self) -> int:
        """The connection cap in force: the configured one, or lower to fit RLIMIT_NOFILE."""
        return self._max_connections

    def start(self, *, timeout_s: float = 5.0) -> None:
        """Start the serving thread; return once its loop accepts connections."""
        if self._thread is not None:
            raise RuntimeError("HttpServer.start() called twice")
        limit = _descriptor_limit()
        self._max_connections = connection_budget(
            self._limits.max_connections, descriptor_limit=limit
        )
        if self._max_connections < self._limits.max_connections:
            logger.warning(
                "RLIMIT_NOFILE is %s: serving at most %d HTTP connections, not %d, to keep %d"
                " descriptors for the broker connection; raise the limit (ulimit -n) to lift it",
                limit,
                self._max_connections,
                self._limits.max_connections,
                RESERVED_DESCRIPTORS,
            )
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._running.wait(timeout_s):
            logger.warning("HTTP thread did not start within %.1f s", timeout_s)

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Close every connection and the listener, and join the thread (``timeout_s`` at most).

        Idempotent; a server never started only closes its socket.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            self._listener.close()
            return
        self._running.wait(timeout_s)
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already finished
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("HTTP thread still running after %.1f s", timeout_s)

    # --- the serving thread ---

    def _run(self) -> None:
        # A plain selector loop, not the relay's uvloop: its sock_* calls are what this
        # module relies on, and nothing here is hot enough to need more.
        try:
            with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
                runner.run(self._serve())
        except Exception:  # a task boundary: the relay must not die with its HTTP side
            logger.exception("the HTTP server stopped")
        finally:
            self._listener.close()
            self._running.set()  # a thread that failed to start must not hold up stop()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        self._running.set()
        try:
            async with asyncio.TaskGroup() as tasks:
                accepting = tasks.create_task(self._accept(tasks), name=f"{self._name}-accept")
                await stopping.wait()
                accepting.cancel()
                for task in list(self._connections):
                    task.cancel()
        finally:
            self._listener.close()

    async def _accept(self, tasks: asyncio.TaskGroup) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as e:
                if e.errno in _CLIENT_GAVE_UP:
                    continue
                # Out of descriptors the listener stays readable: retrying at once would
                # spin. Pausing leaves the pending connections in the listen backlog.
                held = self._log_limit.admit("paused", loop.time())
                if held is not None:
                    logger.warning(
                        "cannot accept HTTP connections (%s); pausing %.1f s (%d more since)",
                        e,
                        self._limits.accept_retry_s,
                        held,
                    )
                await asyncio.sleep(self._limits.accept_retry_s)
                continue
            if len(self._connections) >= self._max_connections:
                evicted = await self._evict()
                self._note_full(loop.time(), evicted=evicted)
                if not evicted:
                    _close(sock)
                    continue
            connection = _Connection(sock)
            task = tasks.create_task(self._serve_one(connection), name=f"{self._name}-connection")
            connection.task = task
            self._connections[task] = connection
            task.add_done_callback(self._forget)
            # Let the new connection read what it was sent before the next accept.
            await asyncio.sleep(0)

    async def _evict(self) -> bool:
        """Close the oldest connection still reading its request; False if none is."""
        victim = next((c for c in self._connections.values() if c.reading), None)
        if victim is None or victim.task is None:
            return False
        victim.task.cancel()
        await asyncio.wait({victim.task})
        return True

    def _note_full(self, now: float, *, evicted: bool) -> None:
        if evicted:
            self._evicted += 1
        else:
            self._refused += 1
        if self._log_limit.admit("full", now) is None:
            return
        logger.warning(
            "HTTP connection limit (%d) reached: closed %d connections still sending their"
            " request, and %d new ones while every slot was answering",
            self._max_connections,
            self._evicted,
            self._refused,
        )
        self._evicted = self._refused = 0

    def _forget(self, task: asyncio.Task[None]) -> None:
        connection = self._connections.pop(task, None)
        if connection is not None:
            _close(connection.sock)  # also for a task cancelled before it ever ran

    async def _serve_one(self, connection: _Connection) -> None:
        def answering() -> None:
            connection.reading = False

        await exchange(
            connection.sock,
            respond=self._respond,
            request_timeout_s=self._limits.request_timeout_s,
            response_timeout_s=self._limits.response_timeout_s,
            on_answer=answering,
        )


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
