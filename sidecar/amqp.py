"""The adapter: the sidecar's AMQP 0-9-1 client, and the only module that imports pamqp.

A lean client on an asyncio protocol, built for one job: consume, publish with confirms,
ack. The frames every message crosses are read and written by :mod:`sidecar.frames` (our
own codec, no object per frame, header tables through :mod:`sidecar.wire` so every header
keeps its wire type); the rare ones (handshake, channel, queue and exchange methods) go
through pamqp. Writes made in one turn of the event loop leave in one ``write`` call, and
the broker's confirms settle publishes by delivery tag, ``multiple`` included.

It translates everything that can go wrong into our exceptions at this edge:
``ConnectionError`` to connect, :class:`ChannelLostError` and :class:`MissingEntityError`
afterwards. It never logs a URL: the caller holds the masked one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import unquote, urlsplit

from pamqp import commands as spec
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame

from sidecar import __version__
from sidecar.delivery import Delivery, PublishOutcome
from sidecar.errors import SidecarError, WireError
from sidecar.frames import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_RETURN,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEADER,
    HEARTBEAT,
    METHOD,
    BasicDeliver,
    BasicReturn,
    ContentHeader,
    UndecodableTable,
    ack_frame,
    parse_confirm,
    parse_content_header,
    parse_deliver,
    parse_return,
    publish_frames,
    put_shortstr,
    read_shortstr,
)
from sidecar.frames import content_header as encode_content_header
from sidecar.wire import Timestamp, decode_table_for_pamqp, encode_table_for_pamqp

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Coroutine, Mapping

    from sidecar.contract import PropertyValue
    from sidecar.wire import FieldValue

__all__ = [
    "Channel",
    "ChannelLostError",
    "Connection",
    "Delivery",
    "MissingEntityError",
    "PublishOutcome",
    "UndecodableTable",
    "connect",
    "install_codec",
]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0  # cancel and close wait this long for the broker, no longer
_PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
_FRAME_MAX: Final = 131_072  # what we ask for; the broker may lower it
_CHANNEL_MAX: Final = 2047  # likewise: a route takes one channel, a topology check another
# Queued writes past this size leave before the end of the loop's turn (a paired benchmark:
# +5% throughput at 64 KiB over one write per turn, ten runs out of ten; 16 KiB +3%).
_WRITE_BATCH_BYTES: Final = 65_536
_NOT_FOUND: Final = 404
_CAPABILITIES: Final = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,  # a deleted queue cancels our consumer, not silence
    "connection.blocked": True,
    "authentication_failure_close": True,  # a wrong password is a reason, not a reset
}


class SidecarChannelError(SidecarError):
    """Base of the channel-level failures the relay reacts to."""


class ChannelLostError(SidecarChannelError):
    """The channel or its connection closed; unacked deliveries go back to the queue."""


class MissingEntityError(SidecarChannelError):
    """A queue or exchange the route needs does not exist."""

    def __init__(self, *, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(
            f'{kind} "{name}" does not exist; create it (the sidecar does not declare topology)'
        )


class _ChannelClosedError(ChannelLostError):
    """The broker closed the channel, with its reply code and text."""

    def __init__(self, code: int, text: str) -> None:
        self.code = code
        self.text = text
        super().__init__(f"channel closed by the broker: {code} {text}")


# --- pamqp's codec, for the frames that go through it ------------------------------------


def _encode_table_hook(value: object) -> bytes:
    if isinstance(value, UndecodableTable):
        return value.raw
    return encode_table_for_pamqp(cast("Mapping[str, object] | None", value))


def _decode_shortstr_hook(data: bytes) -> tuple[int, str]:
    if not data:
        raise ValueError("Could not unpack short string: no data")
    value, end = read_shortstr(bytes(data), 0)
    return end, value


def _encode_shortstr_hook(value: str) -> bytes:
    out: list[bytes] = []
    put_shortstr(value, out, "short string")
    return b"".join(out)


def _decode_timestamp_hook(data: bytes) -> tuple[int, Timestamp]:
    # pamqp builds a datetime, which fails on values past year 9999: keep the integer.
    if len(data) < 8:
        raise ValueError("Could not unpack timestamp: truncated")
    return 8, Timestamp(int.from_bytes(data[:8], "big"))


def _encode_timestamp_hook(value: int | dt.datetime) -> bytes:
    if isinstance(value, dt.datetime):
        value = int(value.timestamp())
    if not 0 <= value < 2**64:
        raise WireError(f"timestamp {value} does not fit an unsigned 64-bit integer")
    return int(value).to_bytes(8, "big")


_HOOKS: Final = {
    "table": (decode_table_for_pamqp, _encode_table_hook),
    "shortstr": (_decode_shortstr_hook, _encode_shortstr_hook),
    "timestamp": (_decode_timestamp_hook, _encode_timestamp_hook),
}


def install_codec() -> None:
    """Route pamqp's table, short-string and timestamp codecs through ours (idempotent).

    The client's own hot frames never touch pamqp; this serves its handshake and control
    frames, and any other pamqp user in the process (the tests' aiormq publisher). Both of
    pamqp's dispatchers look these up at call time in ``pamqp.decode.METHODS`` and
    ``pamqp.encode.METHODS``; if an upgrade moves them, fail loudly rather than silently
    lose wire types.
    """
    decoders = getattr(pamqp_decode, "METHODS", None)
    encoders = getattr(pamqp_encode, "METHODS", None)
    if not isinstance(decoders, dict) or not isinstance(encoders, dict):
        raise SidecarError("pamqp no longer exposes decode.METHODS/encode.METHODS; pin pamqp")
    for name, (decoder, encoder) in _HOOKS.items():
        if name not in decoders or name not in encoders:
            raise SidecarError(f"pamqp no longer dispatches {name!r} through METHODS; pin pamqp")
        decoders[name] = decoder
        encoders[name] = encoder


# --- deliveries ----------------------------------------------------------------------------


def _delivery(method: BasicDeliver, header: ContentHeader, body: bytes) -> Delivery:
    raw = header.headers
    return Delivery(
        delivery_tag=method.delivery_tag,
        exchange=method.exchange,
        routing_key=method.routing_key,
        redelivered=method.redelivered,
        properties=MappingProxyType(header.properties),
        headers=MappingProxyType(raw if isinstance(raw, dict) else {}),
        body=body,
        undecodable=raw if isinstance(raw, UndecodableTable) else None,
        content_header=header.payload,
    )


@dataclass(slots=True)
class _Publish:
    """A publish waiting for its confirm; what a return is matched against."""

    future: asyncio.Future[PublishOutcome]
    exchange: str
    routing_key: str
    header: bytes  # the content header's payload as sent
    body: bytes
    returned: bool = False


@dataclass(slots=True)
class _Content:
    """A delivery or return whose header and body frames are still arriving."""

    method: BasicDeliver | BasicReturn
    header: ContentHeader | None = None
    parts: list[bytes] | None = None
    received: int = 0


# --- channels ------------------------------------------------------------------------------


class Channel:
    """One AMQP channel in confirm mode: consume, publish mandatory, ack."""

    def __init__(self, link: _Link, number: int) -> None:
        self._link = link
        self.number = number
        self._loop = link.loop
        self._rpc: asyncio.Future[Any] | None = None
        self._rpc_replies: frozenset[str] = frozenset()
        self._closing_rpc: asyncio.Future[None] | None = None
        self._closed = asyncio.Event()
        self._ended = asyncio.Event()  # closed, or the broker cancelled our consumer
        self._close_reason = "channel closed"
        self._retired = False
        self._next_tag = 0
        self._unconfirmed: dict[int, _Publish] = {}
        # Deliveries in the order they came, True once the relay acked them: a run of
        # acked ones at the front leaves as one ``multiple`` ack.
        self._unacked: dict[int, bool] = {}
        self._acks_due = 0
        self._content: _Content | None = None
        self._callback: Callable[[Delivery], Coroutine[Any, Any, None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack and publish (not once we began to close it)."""
        return not self._retired and not self._closed.is_set()

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels its consumer."""
        await self._ended.wait()
        return self._close_reason

    # --- requests ---

    async def rpc(self, method: Any, *, timeout_s: float | None = None) -> Any:  # noqa: ANN401
        """Send a synchronous method and return the broker's reply frame.

        Nothing is sent on a channel being closed: once the broker has answered the close,
        a frame on its number would be a connection error.
        """
        if not self.is_open:
            raise ChannelLostError(self._close_reason)
        while self._rpc is not None:  # one synchronous method at a time per channel
            await asyncio.wait([self._rpc])
        self._rpc = reply = self._loop.create_future()
        self._rpc_replies = frozenset(getattr(method, "valid_responses", ()))
        try:
            self._link.write(pamqp_frame.marshal(method, self.number))
            async with asyncio.timeout(timeout_s):
                return await reply
        finally:
            self._rpc = None

    async def consume(
        self,
        queue: str,
        callback: Callable[[Delivery], Coroutine[Any, Any, None]],
        *,
        consumer_tag: str,
    ) -> None:
        """Start consuming ``queue``; ``callback`` runs as its own task per delivery."""
        self._callback = callback
        try:
            await self.rpc(spec.Basic.Consume(queue=queue, consumer_tag=consumer_tag))
        except _ChannelClosedError as e:
            if e.code == _NOT_FOUND:
                raise MissingEntityError(kind="queue", name=queue) from e
            raise

    async def cancel(self, consumer_tag: str) -> None:
        """Stop deliveries to a consumer; return once no more can arrive (or after a bound).

        The broker's cancel-ok comes after the consumer's last delivery, and every delivery
        before it has been handed to its callback by then: whoever waits for in-flight work
        to settle after this sees all of it. The callback stays: deliveries already on the
        wire are settled, not dropped and redelivered.
        """
        with contextlib.suppress(TimeoutError, ChannelLostError):
            await self.rpc(spec.Basic.Cancel(consumer_tag=consumer_tag), timeout_s=CLOSE_TIMEOUT_S)

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish mandatory and wait for the broker's confirm; never a fire-and-forget.

        ``content_header`` (a delivery's, for the same body) is sent instead of encoding
        ``properties`` and ``headers``, which must then be what it holds.

        There is no give-up timeout: a publish already sent may still be confirmed, so
        sending it again would duplicate it. After ``slow_after_s`` ``on_slow`` is called
        once, and the wait goes on until the confirm, a nack, a return or the channel's end.
        Raises :class:`WireError` before sending anything when the wire cannot carry it.
        """
        frame_max = self._link.frame_max
        if content_header is None:
            content_header = encode_content_header(
                properties, headers, body_size=len(body), frame_max=frame_max
            )
        data = publish_frames(
            self.number,
            exchange=exchange,
            routing_key=routing_key,
            body=body,
            content_header=content_header,
            frame_max=frame_max,
        )
        if not self.is_open:
            raise ChannelLostError(self._close_reason)
        self._next_tag += 1
        future: asyncio.Future[PublishOutcome] = self._loop.create_future()
        self._unconfirmed[self._next_tag] = _Publish(
            future, exchange, routing_key, content_header, body
        )
        self._link.write(data)
        slow = self._loop.call_later(slow_after_s, on_slow)
        try:
            return await future
        finally:
            slow.cancel()

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery; False when the channel is gone (the broker will redeliver).

        Acks made in one turn of the event loop leave together at its end: the leading run
        of acked deliveries as one ``multiple`` ack, any acked behind an unacked one singly.
        """
        if not self.is_open:  # a closing channel: the broker would discard the ack
            return False
        if self._unacked.get(delivery_tag) is False:
            self._unacked[delivery_tag] = True
            if not self._acks_due:
                self._loop.call_soon(self._send_acks)
            self._acks_due += 1
        else:
            self._link.write(ack_frame(self.number, delivery_tag))
        return True

    def _send_acks(self) -> None:
        unacked, due = self._unacked, self._acks_due
        self._acks_due = 0
        if not due or self._closed.is_set():
            return
        leading = 0
        for acked in unacked.values():
            if not acked:
                break
            leading += 1
        if leading:
            tags = iter(list(unacked)[:leading])
            last = 0
            for last in tags:
                del unacked[last]
            self._link.write(ack_frame(self.number, last, multiple=leading > 1))
        if due > leading:  # acked behind one still in flight: singly, never twice
            for tag in [t for t, acked in unacked.items() if acked]:
                del unacked[tag]
                self._link.write(ack_frame(self.number, tag))

    async def close(self) -> None:
        """Close the channel; unacked deliveries go back to their queues."""
        self._send_acks()  # the acks already made leave before the close
        self._retired = True  # acks sent from here on would be discarded by the broker
        if self._closed.is_set():
            return
        done = self._closing_rpc
        if done is None:  # the first close sends it; any other waits for the same end
            self._closing_rpc = done = self._loop.create_future()
            close = spec.Channel.Close(
                reply_code=200, reply_text="closing", class_id=0, method_id=0
            )
            self._link.write(pamqp_frame.marshal(close, self.number))
        with contextlib.suppress(TimeoutError, ChannelLostError):
            await asyncio.wait_for(asyncio.shield(done), CLOSE_TIMEOUT_S)
        self._fail(ChannelLostError("channel closed by the sidecar"))

    # --- frames from the broker ---

    def on_method(self, method_id: int, payload: bytes) -> bool:
        """Handle a hot-path method frame for this channel; False for any other method."""
        if method_id == BASIC_DELIVER:
            self._content = _Content(parse_deliver(payload))
        elif method_id == BASIC_ACK:
            self._confirm(*parse_confirm(payload), PublishOutcome.CONFIRMED)
        elif method_id == BASIC_NACK:
            self._confirm(*parse_confirm(payload), PublishOutcome.NACKED)
        elif method_id == BASIC_RETURN:
            self._content = _Content(parse_return(payload))
        elif method_id == BASIC_CANCEL:
            # The queue was deleted: the channel stays open (in-flight deliveries can still
            # be settled) but nothing more will arrive, so the route must treat it as lost.
            if not self._ended.is_set():
                self._close_reason = "the broker cancelled the consumer (was the queue deleted?)"
                self._ended.set()
        else:
            return False
        return True

    def on_control(self, frame: object) -> None:
        """Handle any other method frame: channel close and flow, and replies to our rpcs."""
        if isinstance(frame, spec.Channel.Close):
            self._link.write(pamqp_frame.marshal(spec.Channel.CloseOk(), self.number))
            self._fail(_ChannelClosedError(frame.reply_code or 0, frame.reply_text or ""))
            self._link.forget(self.number)
        elif isinstance(frame, spec.Channel.CloseOk):
            if self._closing_rpc is not None and not self._closing_rpc.done():
                self._closing_rpc.set_result(None)
            self._link.forget(self.number)
        elif isinstance(frame, spec.Channel.Flow):
            self._link.write(pamqp_frame.marshal(spec.Channel.FlowOk(frame.active), self.number))
        elif (
            self._rpc is not None
            and not self._rpc.done()
            and getattr(frame, "name", None) in self._rpc_replies
        ):
            self._rpc.set_result(frame)  # a late reply to an rpc given up on is dropped

    def on_header(self, payload: bytes) -> None:
        """Handle a content header frame: the properties of the pending delivery or return."""
        content = self._content
        if content is None or content.header is not None:
            raise WireError(f"channel {self.number}: content header without a method")
        content.header = header = parse_content_header(payload)
        if header.body_size == 0:
            self._complete(content, b"")
        else:
            content.parts = []

    def on_body(self, payload: bytes) -> None:
        """Handle a content body frame."""
        content = self._content
        if content is None or content.parts is None or content.header is None:
            raise WireError(f"channel {self.number}: content body without a header")
        content.parts.append(payload)
        content.received += len(payload)
        if content.received >= content.header.body_size:
            parts = content.parts
            self._complete(content, parts[0] if len(parts) == 1 else b"".join(parts))

    def _complete(self, content: _Content, body: bytes) -> None:
        self._content = None
        header = content.header
        assert header is not None  # noqa: S101 - set before any body
        method = content.method
        if isinstance(method, BasicReturn):
            self._on_return(method, header, body)
        elif self._callback is not None and not self._closed.is_set():
            self._unacked[method.delivery_tag] = False
            task = self._loop.create_task(self._callback(_delivery(method, header, body)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _on_return(self, method: BasicReturn, header: ContentHeader, body: bytes) -> None:
        """Mark the publish a return is for, which is still unconfirmed (its confirm follows).

        The return holds the message as published: the unconfirmed publish to the same
        exchange and routing key with the same content header and body bytes. Only a
        byte-identical message could be mistaken for it, and then which of the two counts
        as returned makes no difference. One that matches nothing cannot be told from the
        publishes still in flight: the channel is closed, so none of them is acked and the
        broker redelivers them all (duplicates, never a loss).
        """
        for publish in self._unconfirmed.values():
            if (
                not publish.returned
                and publish.routing_key == method.routing_key
                and publish.exchange == method.exchange
                and publish.header == header.payload
                and publish.body == body
            ):
                publish.returned = True
                return
        log.warning(
            "channel %d: a returned message matches no publish in flight; closing the channel"
            " so that every unconfirmed one is redelivered",
            self.number,
        )
        closing = self._loop.create_task(self.close())
        self._tasks.add(closing)
        closing.add_done_callback(self._tasks.discard)

    def _confirm(self, tag: int, multiple: bool, outcome: PublishOutcome) -> None:  # noqa: FBT001
        unconfirmed = self._unconfirmed
        if multiple:
            tags = [t for t in unconfirmed if t <= tag]
        else:
            tags = [tag] if tag in unconfirmed else []
        for t in tags:
            publish = unconfirmed.pop(t)
            if not publish.future.done():
                returned = publish.returned and outcome is PublishOutcome.CONFIRMED
                publish.future.set_result(PublishOutcome.RETURNED if returned else outcome)

    def _fail(self, error: ChannelLostError) -> None:
        """End the channel: every waiter learns why; unconfirmed publishes fail."""
        if self._closed.is_set():
            return
        if not self._ended.is_set():
            self._close_reason = str(error)
        self._closed.set()
        self._ended.set()
        if self._rpc is not None and not self._rpc.done():
            self._rpc.set_exception(error)
        for publish in self._unconfirmed.values():
            if publish.future.done():
                continue
            publish.future.set_exception(_publish_error(error, publish.exchange))
        self._unconfirmed.clear()
        if self._closing_rpc is not None and not self._closing_rpc.done():
            self._closing_rpc.set_result(None)


def _publish_error(error: ChannelLostError, exchange: str) -> ChannelLostError:
    """Return the error a publish sees when its channel ends; a missing exchange names itself."""
    if (
        isinstance(error, _ChannelClosedError)
        and error.code == _NOT_FOUND
        and f"exchange '{exchange}'" in error.text
    ):
        missing = MissingEntityError(kind="exchange", name=exchange)
        missing.__cause__ = error
        return cast("ChannelLostError", missing)
    return error


# --- the connection ------------------------------------------------------------------------


class _Link(asyncio.Protocol):
    """The socket: frames in, batched writes out, heartbeats, and who is waiting on what."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.frame_max = _FRAME_MAX
        self.channel_max = _CHANNEL_MAX
        self.channels: dict[int, Channel] = {}
        self.handshake: asyncio.Queue[object] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.close_reason: BaseException | None = None
        self.close_ok: asyncio.Future[None] = loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_due = False
        self._last_read = loop.time()
        self._last_write = loop.time()
        self._heartbeat: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)
        self._transport.write(_PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("the broker closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        buffer = self._buffer
        buffer += data
        try:
            read = self._read_frames(buffer)
        except Exception as e:  # a frame we cannot read, or pamqp's refusal of one
            log.exception("the broker sent a frame we cannot read; dropping the connection")
            self.abort(ConnectionError(f"unreadable frame from the broker: {e}"))
            return
        del buffer[:read]

    def _read_frames(self, buffer: bytearray) -> int:
        """Handle every whole frame in ``buffer``; return how many bytes they took."""
        at, size = 0, len(buffer)
        if buffer.startswith(b"AMQP"):  # the server's own protocol header: not 0-9-1
            raise WireError(f"the server refused AMQP 0-9-1 and offers {bytes(buffer[:8])!r}")
        while size - at >= 8:
            kind, number, length = HEADER.unpack_from(buffer, at)
            if length > self.frame_max:
                raise WireError(
                    f"a frame of {length} bytes, over the frame size of {self.frame_max}:"
                    " is this an AMQP 0-9-1 broker?"
                )
            end = at + 7 + length
            if end >= size:
                break
            if buffer[end] != FRAME_END:
                raise WireError(f"frame on channel {number} lacks its frame-end octet")
            payload = bytes(buffer[at + 7 : end])
            if kind == FRAME_METHOD:
                self._on_method(number, payload, bytes(buffer[at : end + 1]))
            elif kind == FRAME_HEADER:
                if channel := self.channels.get(number):
                    channel.on_header(payload)
            elif kind == FRAME_BODY:
                if channel := self.channels.get(number):
                    channel.on_body(payload)
            elif kind != FRAME_HEARTBEAT:
                raise WireError(f"unknown frame type {kind} on channel {number}")
            at = end + 1
        return at

    def _on_method(self, number: int, payload: bytes, frame: bytes) -> None:
        if number == 0:
            self._on_connection_method(pamqp_frame.unmarshal(frame)[2])
            return
        channel = self.channels.get(number)
        if channel is None:
            # A channel closed from both sides at once gets the broker's close-ok after
            # its close; whatever comes for a channel already closed is moot.
            return
        (method_id,) = METHOD.unpack_from(payload, 0)
        if not channel.on_method(method_id, payload):
            channel.on_control(pamqp_frame.unmarshal(frame)[2])

    def _on_connection_method(self, frame: object) -> None:
        if isinstance(frame, spec.Connection.Close):
            self.write(pamqp_frame.marshal(spec.Connection.CloseOk(), 0))
            self._flush()
            reason = ConnectionError(
                f"the broker closed the connection: {frame.reply_code} {frame.reply_text}"
            )
            self.abort(reason, graceful=True)
        elif isinstance(frame, spec.Connection.CloseOk):
            if not self.close_ok.done():
                self.close_ok.set_result(None)
        elif isinstance(frame, spec.Connection.Blocked):
            log.warning("the broker blocks publishing: %s", frame.reason)
        elif isinstance(frame, spec.Connection.Unblocked):
            log.info("the broker unblocked publishing")
        else:
            self.handshake.put_nowait(frame)

    # --- writing ---

    def write(self, data: bytes) -> None:
        """Queue bytes; what one turn of the loop queues leaves at its end in one write.

        A turn that queues more (hundreds of publishes made from one read) sends every
        ``_WRITE_BATCH_BYTES`` as it goes, so the broker routes the first publishes while
        the sidecar still makes the rest, instead of waiting for the whole batch.
        """
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._end_of_turn)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _WRITE_BATCH_BYTES:
            self._flush()

    def _end_of_turn(self) -> None:
        self._flush_due = False
        self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, []
        self._out_bytes = 0
        transport = self._transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._last_write = self.loop.time()

    # --- life ---

    def start_heartbeat(self, interval_s: int) -> None:
        """Send a heartbeat when idle; drop the connection after two silent intervals."""
        if interval_s <= 0:
            return

        def beat() -> None:
            now = self.loop.time()
            if now - self._last_read > 2 * interval_s:
                self.abort(ConnectionError(f"no heartbeat from the broker in {2 * interval_s}s"))
                return
            if now - self._last_write >= interval_s / 2:
                self.write(HEARTBEAT)
            self._heartbeat = self.loop.call_later(interval_s / 2, beat)

        self._heartbeat = self.loop.call_later(interval_s / 2, beat)

    def forget(self, number: int) -> None:
        """Free a channel number once the channel is closed on both sides."""
        self.channels.pop(number, None)

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """Drop the connection now, with the reason every waiter will see.

        ``graceful`` lets what is already written (a close-ok) leave first.
        """
        if self.close_reason is None:
            self.close_reason = reason
        if self._transport is not None:
            if graceful:
                self._transport.close()
            else:
                self._transport.abort()
        self._end(reason)

    def _end(self, reason: BaseException) -> None:
        if self.closed.is_set():
            return
        if self.close_reason is None:
            self.close_reason = reason
        self.closed.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        lost = ChannelLostError(f"the connection closed: {self.close_reason}")
        for channel in list(self.channels.values()):
            channel._fail(lost)  # noqa: SLF001 - the link owns its channels
        self.channels.clear()
        self.handshake.put_nowait(self.close_reason)
        if not self.close_ok.done():
            self.close_ok.set_result(None)


class Connection:
    """One AMQP connection; channels come from here."""

    def __init__(self, link: _Link) -> None:
        self._link = link
        self._next_channel = 0

    @property
    def is_open(self) -> bool:
        """Whether the connection is still usable."""
        return not self._link.closed.is_set()

    async def wait_closed(self) -> BaseException | None:
        """Return when the connection closes, with the reason when there is one."""
        await self._link.closed.wait()
        return self._link.close_reason

    async def channel(self, *, prefetch: int) -> Channel:
        """Open a confirm-mode channel with the given prefetch (the in-flight bound)."""
        channel = await self._open()
        try:
            await channel.rpc(spec.Confirm.Select())
            await channel.rpc(spec.Basic.Qos(prefetch_count=prefetch))
        except ChannelLostError:
            await channel.close()
            raise
        return channel

    async def _open(self) -> Channel:
        if not self.is_open:
            raise ChannelLostError(f"the connection closed: {self._link.close_reason}")
        # Numbers go round 1..channel_max, so that a late frame for a channel just closed
        # never meets a new channel on the same number.
        limit, taken = self._link.channel_max, self._link.channels
        candidates = ((self._next_channel + step) % limit + 1 for step in range(limit))
        number = next((n for n in candidates if n not in taken), None)
        if number is None:
            raise ChannelLostError(f"all {limit} channel numbers the broker allows are in use")
        self._next_channel = number
        channel = taken[number] = Channel(self._link, number)
        await channel.rpc(spec.Channel.Open())
        return channel

    async def check_queue(self, name: str) -> None:
        """Passively check that a queue exists; raise MissingEntityError if not."""
        await self._check(spec.Queue.Declare(queue=name, passive=True), "queue", name)

    async def check_exchange(self, name: str) -> None:
        """Passively check that an exchange exists (the default exchange always does)."""
        if name == "":
            return
        await self._check(spec.Exchange.Declare(exchange=name, passive=True), "exchange", name)

    async def _check(self, method: object, kind: str, name: str) -> None:
        # A failed passive declare closes its channel, so each check gets a scratch one.
        channel = await self._open()
        try:
            await channel.rpc(method)
        except _ChannelClosedError as e:
            if e.code == _NOT_FOUND:
                raise MissingEntityError(kind=kind, name=name) from e
            raise ChannelLostError(f"checking {kind} {name!r} failed: {e}") from e
        finally:
            await channel.close()

    async def close(self) -> None:
        """Close the connection, waiting at most a few seconds for the broker."""
        link = self._link
        if not link.closed.is_set():
            link.write(
                pamqp_frame.marshal(
                    spec.Connection.Close(
                        reply_code=200, reply_text="closing", class_id=0, method_id=0
                    ),
                    0,
                )
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(link.close_ok), CLOSE_TIMEOUT_S)
        link.abort(ConnectionError("closed by the sidecar"))


@dataclass(frozen=True, slots=True)
class _Address:
    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool


def _address(url: str) -> _Address:
    parts = urlsplit(url)
    tls = parts.scheme == "amqps"
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return _Address(
        host=parts.hostname or "localhost",
        port=parts.port or (5671 if tls else 5672),
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=vhost,
        tls=tls,
    )


async def _next(link: _Link, expected: type) -> Any:  # noqa: ANN401
    """Return the next handshake frame, which must be of the expected type."""
    frame = await link.handshake.get()
    if isinstance(frame, BaseException):
        raise frame
    if not isinstance(frame, expected):
        raise ConnectionError(f"the broker sent {type(frame).__name__} during the handshake")
    return frame


async def connect(
    url: str,
    *,
    heartbeat_s: int,
    connect_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    name: str = "acemq-sidecar",
) -> Connection:
    """Open a connection; raise ConnectionError with the reason when the broker refuses.

    The reason never holds the URL or the password.
    """
    install_codec()
    address = _address(url)
    loop = asyncio.get_running_loop()
    link = _Link(loop)
    context: ssl.SSLContext | bool | None = ssl_context or (True if address.tls else None)
    try:
        async with asyncio.timeout(connect_timeout_s):
            await loop.create_connection(
                lambda: link,
                address.host,
                address.port,
                ssl=context,
                server_hostname=address.host if context else None,
            )
            await _next(link, spec.Connection.Start)
            properties: dict[str, object] = {
                "connection_name": name,
                "product": "acemq-sidecar",
                "version": __version__,
                "capabilities": _CAPABILITIES,
            }
            link.write(
                pamqp_frame.marshal(
                    spec.Connection.StartOk(
                        client_properties=cast("Any", properties),
                        mechanism="PLAIN",
                        response=f"\0{address.user}\0{address.password}",
                    ),
                    0,
                )
            )
            tune = await _next(link, spec.Connection.Tune)
            link.frame_max = min(tune.frame_max or _FRAME_MAX, _FRAME_MAX)
            link.channel_max = min(tune.channel_max or _CHANNEL_MAX, _CHANNEL_MAX)
            heartbeat = (
                min(h for h in (tune.heartbeat, heartbeat_s) if h)
                if (tune.heartbeat or heartbeat_s)
                else 0
            )
            link.write(
                pamqp_frame.marshal(
                    spec.Connection.TuneOk(
                        channel_max=link.channel_max,
                        frame_max=link.frame_max,
                        heartbeat=heartbeat,
                    ),
                    0,
                )
            )
            link.write(pamqp_frame.marshal(spec.Connection.Open(virtual_host=address.vhost), 0))
            await _next(link, spec.Connection.OpenOk)
    except (OSError, TimeoutError, ValueError) as e:  # ssl.SSLError is an OSError
        link.abort(ConnectionError("connect failed"))
        raise ConnectionError(f"cannot connect to the broker: {e!r}") from e
    except BaseException:  # cancelled (a stop): leave no socket behind
        link.abort(ConnectionError("connect cancelled"))
        raise
    link.start_heartbeat(heartbeat)
    return Connection(link)
