"""A scripted AMQP 0-9-1 server: just enough of a broker to drive the client in tests.

It listens on 127.0.0.1 (a free port), speaks the handshake, and answers each channel
method the client sends as a broker would (open-ok, select-ok, qos-ok, consume-ok,
cancel-ok, declare-ok, close-ok) unless the test scripts another answer, or none. It
records every frame it receives, and sends whatever method a test asks for: the frames
RabbitMQ never sends, or sends only under conditions a test cannot make. pamqp builds and
reads its frames, independently of the client's own codec.

It offers the SASL mechanisms it is given, can listen with TLS (``tls``), hands every whole
publish (method, header, body) to ``on_publish`` for the frames to answer it with (a
return and a confirm, say), and sends raw bytes for frames no codec would make.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import install_codec

Answer = Callable[[int, Any], list[tuple[int, Any]]]  # (channel, method) -> frames to send
# (channel, delivery tag, basic.publish, its content header, its body) -> frames to send
OnPublish = Callable[[int, int, Any, Any, bytes], list[tuple[int, Any]]]


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
        "Queue.Declare": reply(lambda m: spec.Queue.DeclareOk(m.queue, 0, 0)),
        "Exchange.Declare": reply(lambda _: spec.Exchange.DeclareOk()),
    }


@dataclass
class ScriptedBroker:
    """A server for one test; ``async with`` starts and stops it. See the module docstring.

    ``answers`` maps a method name (pamqp's, e.g. ``"Queue.Declare"``) to what to send
    back, over the broker-like defaults; an answer returning ``[]`` leaves the client
    waiting. ``start=False`` never begins the handshake. ``on_publish`` answers each whole
    publish; without it, publishes get no answer.
    """

    channel_max: int = 2047
    frame_max: int = 131_072
    heartbeat: int = 60
    start: bool = True
    mechanisms: str = "PLAIN AMQPLAIN"
    tls: ssl.SSLContext | None = None
    on_publish: OnPublish | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    received: list[tuple[int, Any]] = field(default_factory=list)  # (channel, pamqp frame)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _consuming: int = -1  # the connection a basic.consume came on last (-1: the latest)
    _serving: set[asyncio.Task[Any]] = field(default_factory=set)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.answers = self._handshake() | _default_answers() | self.answers
        self._publishes = _Publishes(self)

    def _handshake(self) -> dict[str, Answer]:
        tune = spec.Connection.Tune(self.channel_max, self.frame_max, self.heartbeat)
        return {
            "Connection.StartOk": lambda _channel, _method: [(0, tune)],
            "Connection.Open": lambda _channel, _method: [(0, spec.Connection.OpenOk())],
            "Connection.Close": lambda _channel, _method: [(0, spec.Connection.CloseOk())],
        }

    def url(
        self, userinfo: str = "guest:guest", path: str = "/", query: str = "", scheme: str = "amqp"
    ) -> str:
        """The URL of this server (``userinfo`` empty: none, not even the ``@``)."""
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    async def __aenter__(self) -> Self:
        install_codec()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
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
        """Send a method to the client: on the connection that consumes, else the latest."""
        self._writers[self._consuming].write(pamqp_frame.marshal(method, channel))

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are: a frame no codec would make."""
        self._writers[self._consuming].write(data)

    def send_content(
        self, method: Any, *, channel: int, body: bytes, properties: spec.Basic.Properties
    ) -> None:
        """Send a delivery or a return: its method, content header and body frames."""
        self.send(method, channel=channel)
        self.send(pamqp_header.ContentHeader(0, len(body), properties), channel=channel)
        if body:
            self.send(pamqp_body.ContentBody(body), channel=channel)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self._writers)
        self._writers.append(writer)
        if (task := asyncio.current_task()) is not None:
            self._serving.add(task)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await self._record(0, await reader.readexactly(8))  # the protocol header
            if self.start:
                start = spec.Connection.Start(mechanisms=self.mechanisms)
                writer.write(pamqp_frame.marshal(start, 0))
            async for channel, frame in self._frames(reader):
                if isinstance(frame, spec.Basic.Consume):
                    self._consuming = index
                await self._record(channel, frame)
                for reply_channel, reply in self._answer(channel, frame):
                    writer.write(pamqp_frame.marshal(reply, reply_channel))
                for reply_channel, reply in self._publishes.take(channel, frame):
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


class _Publishes:
    """Puts each channel's publishes together and numbers them as confirms do (from 1)."""

    def __init__(self, server: ScriptedBroker) -> None:
        self._server = server
        self._pending: dict[int, list[Any]] = {}
        self._tags: dict[int, int] = {}

    def take(self, channel: int, frame: Any) -> list[tuple[int, Any]]:
        """Note a frame; return the answer to the publish it completes, if it does."""
        if isinstance(frame, spec.Basic.Publish):
            self._pending[channel] = [frame]
            return []
        parts = self._pending.get(channel)
        if parts is None or not isinstance(
            frame, pamqp_header.ContentHeader | pamqp_body.ContentBody
        ):
            return []
        parts.append(frame)
        header = parts[1]
        body = b"".join(part.value for part in parts[2:])
        if len(body) < header.body_size:
            return []
        del self._pending[channel]
        self._tags[channel] = tag = self._tags.get(channel, 0) + 1
        on_publish = self._server.on_publish
        return on_publish(channel, tag, parts[0], header, body) if on_publish else []
