"""A TCP proxy that can hold back what the broker sends: a slow broker, without patching.

Everything from the broker reaches the client ``lag_s`` late (0 until a test sets it),
in order; what the client sends passes at once. A confirm the broker sends at once then
arrives late, as it would from a broker under an alarm.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Self
from urllib.parse import urlsplit


def via_proxy(url: str, port: int) -> str:
    """``url`` with a proxy on 127.0.0.1:``port`` for its host and port (its login kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


@dataclass
class LagProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to the broker of ``url``."""

    url: str
    lag_s: float = 0.0
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def proxied_url(self) -> str:
        """The broker's URL with this proxy's host and port in it."""
        return via_proxy(self.url, self.port)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:  # the forwarding ends with its sockets
            writer.close()

    async def _serve(  # noqa: C901 - the three forwarding loops of one connection
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        parts = urlsplit(self.url)
        broker_r, broker_w = await asyncio.open_connection(parts.hostname, parts.port or 5672)
        self._writers += (client_w, broker_w)
        lagged: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                broker_w.write(data)
            broker_w.close()

        async def from_broker() -> None:
            while data := await broker_r.read(65536):
                lagged.put_nowait((loop.time() + self.lag_s, data))
            lagged.put_nowait((loop.time() + self.lag_s, b""))

        async def downstream() -> None:
            while True:
                due, data = await lagged.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    break
                client_w.write(data)
            client_w.close()

        try:
            async with asyncio.TaskGroup() as tasks:
                for work in (upstream, from_broker, downstream):
                    tasks.create_task(work())
        except* (ConnectionError, RuntimeError):  # a socket closed under a write
            pass
        finally:
            for writer in (client_w, broker_w):
                writer.close()
