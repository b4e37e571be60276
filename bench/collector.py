"""An OTLP/HTTP collector for the benchmarks: it answers every export and counts it.

The standard library's threading HTTP server, in a thread of the bench's process, on a
free port of 127.0.0.1: every ``POST`` is read whole and answered 200 with an empty
``ExportTraceServiceResponse`` (an empty protobuf message is zero bytes). Down, the
endpoint is a free port nobody listens on. A benchmark's tool, never a test.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@contextmanager
def collector(*, up: bool) -> Iterator[tuple[str, Callable[..., int]]]:
    """Yield the endpoint's base URL and what counts the exports (``bytes_=True``: bytes)."""
    counts = {"exports": 0, "bytes": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(size)
            with lock:
                counts["exports"] += 1
                counts["bytes"] += size
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:  # the bench prints its own figures
            return

    def received(*, bytes_: bool = False) -> int:
        with lock:
            return counts["bytes" if bytes_ else "exports"]

    if not up:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        yield f"http://127.0.0.1:{port}", received
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="bench-collector", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
