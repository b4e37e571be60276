"""The adapter: the only module that imports aiormq and pamqp.

It owns three things: routing pamqp's field-table, short-string and timestamp codecs
through ``sidecar.wire`` (so every header keeps its wire type), turning the client's
objects into our frozen ``Delivery`` and back, and translating the client's exceptions
into ours at this edge. Everything else in the sidecar sees only our types.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, cast

import aiormq
import aiormq.abc
import aiormq.exceptions
from pamqp import commands as spec
from pamqp import common as pamqp_common
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from sidecar.errors import SidecarError, WireError
from sidecar.waits import first_of
from sidecar.wire import Timestamp, decode_table, encode_table_for_pamqp

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Mapping

    from sidecar.contract import PropertyValue
    from sidecar.wire import FieldTable, FieldValue

__all__ = [
    "Channel",
    "ChannelLostError",
    "Connection",
    "Delivery",
    "MissingEntityError",
    "PublishOutcome",
    "build_properties",
    "connect",
    "install_codec",
]

# pamqp name -> contract (vector-format) name, in pamqp's wire order.
_PROPERTY_NAMES: Final = (
    ("content_type", "content_type"),
    ("content_encoding", "content_encoding"),
    ("delivery_mode", "delivery_mode"),
    ("priority", "priority"),
    ("correlation_id", "correlation_id"),
    ("reply_to", "reply_to"),
    ("expiration", "expiration"),
    ("message_id", "message_id"),
    ("timestamp", "timestamp"),
    ("message_type", "type"),
    ("user_id", "user_id"),
    ("app_id", "app_id"),
    ("cluster_id", "cluster_id"),
)
_SHORTSTR_MAX = 255
CLOSE_TIMEOUT_S = 5.0  # cancel and close wait this long for the broker, no longer


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


# --- the codec hook ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UndecodableTable:
    """A header table our codec refused: kept as raw bytes so nothing is lost."""

    raw: bytes
    error: str


def _decode_table_hook(data: bytes) -> tuple[int, FieldTable | UndecodableTable]:
    try:
        table, end = decode_table(data)
    except WireError as e:
        # pamqp would kill the connection (and redeliver the message forever); keep
        # the bytes instead and let the relay quarantine the message with the reason.
        length = int.from_bytes(data[:4], "big") + 4 if len(data) >= 4 else len(data)
        return min(length, len(data)), UndecodableTable(bytes(data[:length]), str(e))
    return end, table


def _encode_table_hook(value: object) -> bytes:
    if isinstance(value, UndecodableTable):
        return value.raw
    return encode_table_for_pamqp(cast("Mapping[str, object] | None", value))


def _decode_shortstr_hook(data: bytes) -> tuple[int, str]:
    # surrogateescape: a property that is not UTF-8 survives to the republish byte for byte.
    if not data:
        raise ValueError("Could not unpack short string: no data")
    length = data[0]
    if len(data) < length + 1:
        raise ValueError("Could not unpack short string: truncated")
    return length + 1, bytes(data[1 : length + 1]).decode("utf-8", "surrogateescape")


def _encode_shortstr_hook(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > _SHORTSTR_MAX:
        raise WireError(f"short string of {len(raw)} bytes exceeds 255: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


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
    "table": (_decode_table_hook, _encode_table_hook),
    "shortstr": (_decode_shortstr_hook, _encode_shortstr_hook),
    "timestamp": (_decode_timestamp_hook, _encode_timestamp_hook),
}


def install_codec() -> None:
    """Route pamqp's table, short-string and timestamp codecs through ours (idempotent).

    Both of pamqp's dispatchers look these up at call time in ``pamqp.decode.METHODS`` and
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


# --- deliveries and properties ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One message consumed from a staging queue, in our own types."""

    delivery_tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    properties: Mapping[str, PropertyValue]
    headers: Mapping[str, FieldValue]
    body: bytes
    undecodable: UndecodableTable | None = None


def _delivery_from(message: aiormq.abc.DeliveredMessage) -> Delivery:
    frame = message.delivery
    pamqp_properties = message.header.properties
    properties: dict[str, PropertyValue] = {}
    for attribute, name in _PROPERTY_NAMES:
        value = getattr(pamqp_properties, attribute)
        if value is not None:
            properties[name] = int(value) if isinstance(value, Timestamp) else value
    raw_headers: object = pamqp_properties.headers
    undecodable = raw_headers if isinstance(raw_headers, UndecodableTable) else None
    headers = raw_headers if isinstance(raw_headers, dict) else {}
    return Delivery(
        delivery_tag=int(getattr(frame, "delivery_tag", 0) or 0),
        exchange=str(getattr(frame, "exchange", "") or ""),
        routing_key=str(getattr(frame, "routing_key", "") or ""),
        redelivered=bool(getattr(frame, "redelivered", False)),
        properties=MappingProxyType(properties),
        headers=MappingProxyType(headers),
        body=bytes(message.body),
        undecodable=undecodable,
    )


def build_properties(
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue] | UndecodableTable | None,
) -> spec.Basic.Properties:
    """Build pamqp properties from ours without pamqp's validation.

    pamqp's constructor refuses a non-empty ``cluster_id`` and unusual delivery modes,
    which the broker accepts and the contract passes through unchanged.
    """
    result = spec.Basic.Properties()
    for attribute, name in _PROPERTY_NAMES:
        value = properties.get(name)
        if value is not None:
            setattr(result, attribute, value)
    result.headers = cast("pamqp_common.FieldTable", headers or None)
    return result


# --- connection and channels -----------------------------------------------------------


class PublishOutcome(StrEnum):
    """How the broker settled one publish."""

    CONFIRMED = "confirmed"
    RETURNED = "returned"  # mandatory and unroutable
    NACKED = "nacked"


class Channel:
    """One AMQP channel with publisher confirms: consume, publish mandatory, ack."""

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self._channel = channel
        # aiormq matches a returned message to its publish by message_id; two publishes
        # in flight with one message_id would be confused, so the second waits.
        self._publishing: dict[str, asyncio.Future[Any]] = {}
        # Set when the broker cancels our consumer (its queue was deleted): the channel
        # stays open but nothing will arrive, so the route must treat it as lost.
        self._cancelled_by_broker = asyncio.Event()
        self._retired = False
        channel.on_consumer_cancel_callbacks.add(self._on_broker_cancel)

    def _on_broker_cancel(self, _frame: object) -> None:
        self._cancelled_by_broker.set()

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack and publish (not once we began to close it)."""
        return not self._retired and not self._channel.is_closed

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels its consumer."""
        await first_of(asyncio.shield(self._channel.closing), self._cancelled_by_broker.wait())
        if self._cancelled_by_broker.is_set():
            return "the broker cancelled the consumer (was the queue deleted?)"
        closing = self._channel.closing
        reason = closing.exception() if closing.done() and not closing.cancelled() else None
        return f"channel closed by the broker: {reason}" if reason else "channel closed"

    async def consume(
        self, queue: str, callback: Callable[[Delivery], Awaitable[None]], *, consumer_tag: str
    ) -> None:
        """Start consuming ``queue``; ``callback`` runs as its own task per delivery."""

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            await callback(_delivery_from(message))

        try:
            await self._channel.basic_consume(queue, on_message, consumer_tag=consumer_tag)
        except aiormq.exceptions.ChannelNotFoundEntity as e:
            raise MissingEntityError(kind="queue", name=queue) from e
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as e:
            # RuntimeError: aiormq's ChannelInvalidStateError, the channel closed meanwhile
            raise ChannelLostError(f"cannot consume {queue!r}: {e!r}") from e

    async def cancel(self, consumer_tag: str) -> None:
        """Stop deliveries to a consumer; in-flight ones stay ours to settle.

        Sent without waiting for the broker (nowait) but, unlike aiormq's own nowait
        cancel, keeping the callback: deliveries already on the wire are still settled
        rather than dropped and redelivered. Bounded, and never cancelled midway (a
        cancelled rpc closes the channel before the in-flight acks).
        """
        frame = spec.Basic.Cancel(consumer_tag=consumer_tag, nowait=True)
        sending = asyncio.create_task(self._send(frame), name=f"cancel:{consumer_tag}")
        await asyncio.wait([sending], timeout=CLOSE_TIMEOUT_S)

    async def _send(self, frame: spec.Basic.Cancel) -> None:
        with contextlib.suppress(aiormq.exceptions.AMQPError, ConnectionError, RuntimeError):
            await cast("aiormq.Channel", self._channel).rpc(frame)  # nowait: returns once sent

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        properties: spec.Basic.Properties,
        slow_after_s: float,
        on_slow: Callable[[], None],
    ) -> PublishOutcome:
        """Publish mandatory and wait for the broker's confirm; never a fire-and-forget.

        There is no give-up timeout: a publish already sent may still be confirmed, so
        sending it again would duplicate it. After ``slow_after_s`` ``on_slow`` is called
        once, and the wait goes on until the confirm, a nack, a return or the channel's end.
        """
        message_id = str(properties.message_id or "")
        while (earlier := self._publishing.get(message_id)) is not None:
            await asyncio.wait([earlier])
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] | None = None
        if message_id:
            done = loop.create_future()
            self._publishing[message_id] = done
        # A timer, not a task around the publish: aiormq maps a channel close to its reason
        # only in the task it cancels, and a timer costs far less per message.
        slow = loop.call_later(slow_after_s, on_slow)
        try:
            await self._channel.basic_publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
            )
        except aiormq.exceptions.PublishError:  # a return; subclass of DeliveryError
            return PublishOutcome.RETURNED
        except aiormq.exceptions.DeliveryError:
            return PublishOutcome.NACKED
        except aiormq.exceptions.ChannelNotFoundEntity as e:
            raise MissingEntityError(kind="exchange", name=exchange) from e
        except (
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,
            ConnectionError,
        ) as e:
            raise ChannelLostError(f"publish to {exchange!r} failed: {e!r}") from e
        finally:
            slow.cancel()
            if done is not None:
                if self._publishing.get(message_id) is done:
                    del self._publishing[message_id]
                done.set_result(None)
        return PublishOutcome.CONFIRMED

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery; False when the channel is gone (the broker will redeliver)."""
        if self._retired:  # a closing channel: the broker would discard the ack
            return False
        try:
            await self._channel.basic_ack(delivery_tag)
        except (aiormq.exceptions.AMQPError, RuntimeError, ConnectionError):
            return False
        return True

    async def close(self) -> None:
        """Close the channel; unacked deliveries go back to their queues."""
        self._retired = True  # acks sent from here on would be discarded by the broker
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._channel.close()


class Connection:
    """One AMQP connection; channels come from here."""

    def __init__(self, connection: aiormq.abc.AbstractConnection) -> None:
        self._connection = connection

    @property
    def is_open(self) -> bool:
        """Whether the connection is still usable."""
        return not self._connection.is_closed

    async def wait_closed(self) -> BaseException | None:
        """Return when the connection closes, with the reason when there is one."""
        try:
            await asyncio.shield(self._connection.closing)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the reason is the return value
            return e
        return None

    async def channel(self, *, prefetch: int) -> Channel:
        """Open a confirm-mode channel with the given prefetch (the in-flight bound)."""
        try:
            raw = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            await raw.basic_qos(prefetch_count=prefetch)
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as e:
            raise ChannelLostError(f"cannot open a channel: {e!r}") from e
        return Channel(raw)

    async def check_queue(self, name: str) -> None:
        """Passively check that a queue exists; raise MissingEntityError if not."""
        await self._check(lambda ch: ch.queue_declare(name, passive=True), "queue", name)

    async def check_exchange(self, name: str) -> None:
        """Passively check that an exchange exists (the default exchange always does)."""
        if name == "":
            return
        await self._check(lambda ch: ch.exchange_declare(name, passive=True), "exchange", name)

    async def _check(
        self,
        declare: Callable[[aiormq.abc.AbstractChannel], Awaitable[object]],
        kind: str,
        name: str,
    ) -> None:
        # A failed passive declare closes its channel, so each check gets a scratch one.
        try:
            channel = await self._connection.channel()
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as e:
            raise ChannelLostError(f"cannot open a channel: {e!r}") from e
        try:
            await declare(channel)
        except aiormq.exceptions.ChannelNotFoundEntity as e:
            raise MissingEntityError(kind=kind, name=name) from e
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as e:
            raise ChannelLostError(f"checking {kind} {name!r} failed: {e!r}") from e
        finally:
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.close()

    async def close(self) -> None:
        """Close the connection, waiting at most a few seconds for the broker."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._connection.close()


async def connect(
    url: str,
    *,
    heartbeat_s: int,
    connect_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    name: str = "acemq-sidecar",
) -> Connection:
    """Open a connection; raise ConnectionError with the reason when the broker refuses."""
    install_codec()
    separator = "&" if "?" in url else "?"
    full_url = f"{url}{separator}heartbeat={heartbeat_s}"
    try:
        async with asyncio.timeout(connect_timeout_s):
            raw = await aiormq.connect(
                full_url,
                context=ssl_context,
                client_properties={"connection_name": name},
            )
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as e:
        raise ConnectionError(f"cannot connect to the broker: {e!r}") from e
    return Connection(raw)
