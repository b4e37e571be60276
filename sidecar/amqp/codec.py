"""The one pamqp hook: pamqp's codecs routed through ours, and the channels' control methods.

pamqp encodes and decodes every method off the hot path. :func:`install_codec` makes its
table, short-string and timestamp codecs ours (:mod:`sidecar.wire`), so a header table keeps
its wire types whoever reads it. The channel-level methods (open, close, flow, confirm,
qos, consume, cancel, the passive declares) are built here as a :class:`Request` and read
here into our own small values, so that no other module of the client touches pamqp but
the handshake, which owns channel 0.

It must not decide anything: it translates.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

from pamqp import base as pamqp_base
from pamqp import commands as spec
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp.exceptions import PAMQPException

from sidecar.amqp.violations import FrameError
from sidecar.errors import SidecarError, WireError
from sidecar.wire import (
    Timestamp,
    UndecodableTable,
    decode_table_for_pamqp,
    encode_table_for_pamqp,
    put_shortstr,
    read_shortstr,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ChannelClose",
    "ChannelCloseOk",
    "ChannelFlow",
    "Control",
    "Reply",
    "Request",
    "basic_cancel",
    "basic_consume",
    "basic_nack",
    "basic_qos",
    "basic_reject",
    "channel_close",
    "channel_close_ok",
    "channel_flow_ok",
    "channel_open",
    "confirm_select",
    "decode_control",
    "exchange_declare_passive",
    "install_codec",
    "queue_declare_passive",
]


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


# --- what the channel sends ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A synchronous method for a channel, and the names of the replies that answer it."""

    name: str
    replies: frozenset[str]
    _method: pamqp_base.Frame = field(repr=False, compare=False)

    def frame(self, channel: int) -> bytes:
        """Return the method frame's bytes on ``channel``."""
        return pamqp_frame.marshal(self._method, channel)


def _request(method: pamqp_base.Frame) -> Request:
    replies = frozenset(getattr(method, "valid_responses", ()))
    return Request(method.name, replies, method)


def channel_open() -> Request:
    """Return ``channel.open``."""
    return _request(spec.Channel.Open())


def confirm_select() -> Request:
    """Return ``confirm.select``: the broker acks or nacks every publish from then on."""
    return _request(spec.Confirm.Select())


def basic_qos(prefetch_count: int) -> Request:
    """Return ``basic.qos``, per consumer (``global`` false): for consumers started after it."""
    return _request(spec.Basic.Qos(prefetch_count=prefetch_count))


def basic_consume(queue: str, *, consumer_tag: str) -> Request:
    """Return ``basic.consume`` with our own consumer tag, acks required."""
    return _request(spec.Basic.Consume(queue=queue, consumer_tag=consumer_tag))


def basic_cancel(consumer_tag: str) -> Request:
    """Return ``basic.cancel``, waiting for its cancel-ok (which follows the last delivery)."""
    return _request(spec.Basic.Cancel(consumer_tag=consumer_tag))


def queue_declare_passive(name: str) -> Request:
    """Return a passive ``queue.declare``: a check, which closes the channel with 404."""
    return _request(spec.Queue.Declare(queue=name, passive=True))


def exchange_declare_passive(name: str) -> Request:
    """Return a passive ``exchange.declare``: a check, which closes the channel with 404."""
    return _request(spec.Exchange.Declare(exchange=name, passive=True))


def basic_nack(channel: int, delivery_tag: int, *, multiple: bool) -> bytes:
    """Return a ``basic.nack`` frame that requeues (``multiple`` with tag 0: every unacked).

    RabbitMQ 4.3+ spends no attempt of a quorum queue's delivery limit on it, unlike a
    ``basic.reject`` or a channel's close (docs/decisions/0068).
    """
    return pamqp_frame.marshal(
        spec.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple, requeue=True), channel
    )


def basic_reject(channel: int, delivery_tag: int, *, requeue: bool) -> bytes:
    """Return a ``basic.reject`` frame: the broker requeues or dead-letters the delivery."""
    return pamqp_frame.marshal(
        spec.Basic.Reject(delivery_tag=delivery_tag, requeue=requeue), channel
    )


def channel_close(channel: int) -> bytes:
    """Return our ``channel.close`` frame (200, a normal close)."""
    close = spec.Channel.Close(reply_code=200, reply_text="closing", class_id=0, method_id=0)
    return pamqp_frame.marshal(close, channel)


def channel_close_ok(channel: int) -> bytes:
    """Return a ``channel.close-ok`` frame, the answer to the broker's close."""
    return pamqp_frame.marshal(spec.Channel.CloseOk(), channel)


def channel_flow_ok(channel: int, *, active: bool) -> bytes:
    """Return a ``channel.flow-ok`` frame."""
    return pamqp_frame.marshal(spec.Channel.FlowOk(active), channel)


# --- what the broker sends -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChannelClose:
    """The broker closes the channel: why, in its words."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class ChannelCloseOk:
    """The broker's answer to our close: the channel number is free again."""


@dataclass(frozen=True, slots=True)
class ChannelFlow:
    """The broker asks to pause (``active`` false) or resume publishing on the channel."""

    active: bool


@dataclass(frozen=True, slots=True)
class Reply:
    """Any other method: the reply to a request, matched by its name.

    ``counts`` is a ``queue.declare-ok``'s (messages ready, consumers); None for the rest.
    """

    name: str
    counts: tuple[int, int] | None = None


Control = ChannelClose | ChannelCloseOk | ChannelFlow | Reply


def decode_control(frame: bytes) -> Control:
    """Read a whole method frame off the hot path; a malformed one is a :class:`FrameError`."""
    try:
        method = pamqp_frame.unmarshal(frame)[2]
    except (PAMQPException, ValueError, struct.error) as e:
        raise FrameError(f"a channel method that does not decode: {e}") from e
    if isinstance(method, spec.Channel.Close):
        return ChannelClose(method.reply_code or 0, method.reply_text or "")
    if isinstance(method, spec.Channel.CloseOk):
        return ChannelCloseOk()
    if isinstance(method, spec.Channel.Flow):
        return ChannelFlow(active=bool(method.active))
    if isinstance(method, spec.Queue.DeclareOk):
        return Reply(method.name, (method.message_count or 0, method.consumer_count or 0))
    return Reply(method.name)
