"""A scripted AMQP 0-9-1 server: just enough of a broker to drive the client in tests.

It listens on 127.0.0.1 (a free port), speaks the handshake, and answers each channel
method the client sends as a broker would (open-ok, select-ok, qos-ok, consume-ok,
cancel-ok, declare-ok, close-ok) unless the test scripts another answer, or none. It
records every frame it receives, and sends whatever method a test asks for: the frames
RabbitMQ never sends, or sends only under conditions a test cannot make. pamqp builds and
reads its frames, independently of the client's own codec.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from sidecar.amqp import install_codec

Answer = Callable[[int, Any], list[tuple[int, Any]]]  # (channel, method) -> frames to send


def _default_answers() -> dict[str, Answer]:
    def reply(make: Callable[[Any], Any]) -> Answer:
        return lambda channel, method: [(channel, make(method))]

    return {
        "Channel.Open": reply(lambda _: spec.Channel.OpenOk()),
        "Channel.Close": reply(lambda _: spec.Channel.CloseOk()),
        "Confirm.Select": reply(lambda _: spec.Confirm.SelectOk()),
        "Basic.Qos": reply(lambda _: spec.Basic.QosOk()),
        "Basic.Consume": reply(lambda m: spec.Basic.ConsumeOk(consumer_tag=m.consumer_tag)),
        "Basic.Cancel": reply(lambda m: spec.Basic.CancelOk(consumer_tag=m.consumer_tag)),
        "Queue.Declare": reply(lambda m: spec.Queue.DeclareOk(queue=m.queue)),
        "Exchange.Declare": reply(lambda _: spec.Exchange.DeclareOk()),
    }


@dataclass
class ScriptedBroker:
    """A server for one test; ``async with`` starts and stops it. See the module docstring.

    ``answers`` maps a method name (pamqp's, e.g. ``"Queue.Declare"``) to what to send
    back, over the broker-like defaults; an answer returning ``[]`` leaves the client
    waiting. ``start=False`` never begins the handshake.
    """

    channel_max: int = 2047
    frame_max: int = 131_072
    heartbeat: int = 60
    start: bool = True
    answers: dict[str, Answer] = field(default_factory=dict)
    received: list[tuple[int, Any]] = field(default_factory=list)  # (channel, pamqp frame)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _serving: set[asyncio.Task[Any]] = field(default_factory=set)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.answers = self._handshake() | _default_answers() | self.answers

    def _handshake(self) -> dict[str, Answer]:
        tune = spec.Connection.Tune(self.channel_max, self.frame_max, self.heartbeat)
        return {
            "Connection.StartOk": lambda _channel, _method: [(0, tune)],
            "Connection.Open": lambda _channel, _method: [(0, spec.Connection.OpenOk())],
            "Connection.Close": lambda _channel, _method: [(0, spec.Connection.CloseOk())],
        }

    def url(self, userinfo: str = "guest:guest", path: str = "/", query: str = "") -> str:
        """The URL of this server."""
        return f"amqp://{userinfo}@127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    async def __aenter__(self) -> Self:
        install_codec()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()  # each connection's reader ends, and with it its handler
        await asyncio.gather(*self._serving, return_exceptions=True)

    def methods(self, name: str) -> list[Any]:
        """The methods of this name received so far, in order."""
        return [frame for _, frame in self.received if getattr(frame, "name", None) == name]

    async def wait_for(self, name: str, count: int = 1) -> Any:
        """Wait until ``count`` methods of this name arrived; return the last of them."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.methods(name)) >= count)
        return self.methods(name)[count - 1]

    def send(self, method: Any, *, channel: int = 0) -> None:
        """Send a method to the client of the latest connection."""
        self._writers[-1].write(pamqp_frame.marshal(method, channel))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if (task := asyncio.current_task()) is not None:
            self._serving.add(task)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await self._record(0, await reader.readexactly(8))  # the protocol header
            if self.start:
                writer.write(pamqp_frame.marshal(spec.Connection.Start(), 0))
            async for channel, frame in self._frames(reader):
                await self._record(channel, frame)
                for reply_channel, reply in self._answer(channel, frame):
                    writer.write(pamqp_frame.marshal(reply, reply_channel))
                if isinstance(frame, spec.Connection.Close | spec.Connection.CloseOk):
                    break
        writer.close()

    async def _frames(self, reader: asyncio.StreamReader) -> AsyncIterator[tuple[int, Any]]:
        while True:
            header = await reader.readexactly(7)
            rest = await reader.readexactly(int.from_bytes(header[3:7], "big") + 1)
            _, channel, frame = pamqp_frame.unmarshal(header + rest)
            yield channel, frame

    def _answer(self, channel: int, frame: Any) -> list[tuple[int, Any]]:
        answer = self.answers.get(getattr(frame, "name", ""))
        return answer(channel, frame) if answer else []

    async def _record(self, channel: int, frame: Any) -> None:
        async with self._arrived:
            self.received.append((channel, frame))
            self._arrived.notify_all()


def refuse(reply: Any) -> Answer:
    """An answer that sends ``reply`` (a close, say) on the request's channel."""
    return lambda channel, _: [(0 if isinstance(reply, spec.Connection.Close) else channel, reply)]


def silent(_channel: int, _method: Any) -> list[tuple[int, Any]]:
    """An answer that never comes: a broker under an alarm, say."""
    return []
