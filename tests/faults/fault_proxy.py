"""A TCP proxy of the tests' own between the sidecar and its broker: lag, loss, silence.

It forwards each connection to the broker and tells the sidecar's two apart by the name
its client properties carry (``acemq-sidecar`` consumes, ``acemq-sidecar publish``
publishes). A test can then, for the connections open now:

- ``silence(kind)``: stop forwarding either way and stop reading, without closing: a
  half-open connection on one side only. What the sidecar writes fills the proxy's socket
  and then its own; nothing more arrives. Connections made afterwards are not silenced.
- ``lag(delay_s, loss)``: hold everything ``delay_s`` each way, in order. TCP repairs a
  lost segment by sending it again, so a proxy of whole bytes cannot drop one; ``loss`` is
  the share of reads that wait a retransmission timeout more (from 200 ms, doubled at
  random up to three times), and everything behind them waits too, as it would.

Each direction keeps its order. Closing either side closes the other, as a proxy does.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Self
from urllib.parse import urlsplit

from tests.lag_proxy import via_proxy

CHUNK = 65536
HEADER_BYTES = 4096  # the client's first bytes: its protocol header and start-ok
RTO_S = 0.2  # Linux's least retransmission timeout


class Kind(StrEnum):
    """Which of the sidecar's connections."""

    CONSUMING = "consuming"
    PUBLISHING = "publishing"
    OTHER = "other"


@dataclass
class _Pipe:
    """One proxied connection: its kind and whether it is silenced."""

    kind: Kind = Kind.OTHER
    silenced: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to the broker of ``url``."""

    url: str
    delay_s: float = 0.0
    loss: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    port: int = 0
    _server: asyncio.Server | None = None
    _pipes: list[_Pipe] = field(default_factory=list)
    _serving: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def proxied_url(self) -> str:
        """The broker's URL with this proxy's host and port in it."""
        return via_proxy(self.url, self.port)

    def kinds(self) -> list[Kind]:
        """The kinds of the connections proxied so far, in order."""
        return [pipe.kind for pipe in self._pipes]

    def silence(self, kind: Kind) -> int:
        """Silence every open connection of ``kind``; return how many."""
        pipes = [pipe for pipe in self._pipes if pipe.kind is kind]
        for pipe in pipes:
            pipe.silenced.set()
        return len(pipes)

    def lag(self, delay_s: float, *, loss: float = 0.0) -> None:
        """Hold what crosses from now on ``delay_s`` each way, ``loss`` of it longer."""
        self.delay_s, self.loss = delay_s, loss

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._serving:
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            self._serving.add(task)
        pipe = _Pipe()
        self._pipes.append(pipe)
        parts = urlsplit(self.url)
        try:
            broker_r, broker_w = await asyncio.open_connection(parts.hostname, parts.port)
        except OSError:
            client_w.close()
            return
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._forward(client_r, broker_w, pipe, first=True))
                tasks.create_task(self._forward(broker_r, client_w, pipe, first=False))
        except* (ConnectionError, OSError):  # a socket closed under a write
            pass
        finally:
            for writer in (client_w, broker_w):
                writer.close()

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pipe: _Pipe,
        *,
        first: bool,
    ) -> None:
        """Copy one direction, lagged as set, until the reader ends or the pipe is silenced."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._read(reader, held, pipe, first=first))
            tasks.create_task(self._write(writer, held, pipe))

    async def _read(
        self,
        reader: asyncio.StreamReader,
        held: asyncio.Queue[tuple[float, bytes]],
        pipe: _Pipe,
        *,
        first: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        due_last = 0.0
        seen = b""
        while not pipe.silenced.is_set():
            data = await _unless_silenced(reader.read(CHUNK), pipe)
            if data is None:
                break
            if first and pipe.kind is Kind.OTHER and len(seen) < HEADER_BYTES:
                seen += data
                if b"acemq-sidecar publish" in seen:
                    pipe.kind = Kind.PUBLISHING
                elif b"acemq-sidecar" in seen:
                    pipe.kind = Kind.CONSUMING
            due = loop.time() + self.delay_s
            if self.loss and data and self.rng.random() < self.loss:
                due += RTO_S * 2 ** self.rng.randrange(3)  # 200, 400 or 800 ms more
            due_last = max(due_last, due)  # in order: nothing overtakes what waits
            held.put_nowait((due_last, data))
            if not data:
                return
        await asyncio.Event().wait()  # silenced: reads nothing more, closes nothing

    @staticmethod
    async def _write(
        writer: asyncio.StreamWriter, held: asyncio.Queue[tuple[float, bytes]], pipe: _Pipe
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await held.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if pipe.silenced.is_set():
                await asyncio.Event().wait()  # writes nothing more, closes nothing
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()


async def _unless_silenced(read: Coroutine[Any, Any, bytes], pipe: _Pipe) -> bytes | None:
    """Return what ``read`` read, or None once the pipe is silenced first."""
    reading = asyncio.ensure_future(read)
    silenced = asyncio.ensure_future(pipe.silenced.wait())
    try:
        await asyncio.wait({reading, silenced}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        silenced.cancel()
    if pipe.silenced.is_set():
        reading.cancel()
        return None
    return reading.result()
