"""The sidecar's AMQP 0-9-1 client: the face every other module imports.

A lean client on an asyncio protocol, built for one job: consume, publish with confirms,
ack. The frames every message crosses are read and written by our own codec
(:mod:`sidecar.wire.frames`); the rare ones go through pamqp behind one hook
(:mod:`sidecar.amqp.codec`, and :mod:`sidecar.amqp.handshake` for channel 0). The relay
talks to it through the Protocols of :mod:`sidecar.amqp.protocols`. Import from here,
never from a submodule: import-linter holds everyone else to this face.

The modules, each one job: ``link`` (the socket: bytes in, batched writes out,
heartbeats), ``frame_reader`` (the bytes cut into frames, each to its channel),
``handshake`` (channel 0), ``connection`` (connect, channels, checks), ``lifecycle`` (a
channel's state machine), ``channel`` (consume, publish, ack on it), ``inbound`` (its
deliveries to the consumer, its returns to their publish), ``acks`` and ``confirms`` (its
settlement bookkeeping), ``content`` (messages put together from their frames, as
:mod:`sidecar.wire.delivery`'s values), ``stream`` (a body passed through in frames),
``codec`` (pamqp), ``protocols`` (what the relay needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.amqp.channel import Channel
from sidecar.amqp.codec import install_codec
from sidecar.amqp.connection import ClientOptions, Connection, QueueCounts, connect
from sidecar.amqp.lifecycle import ChannelState
from sidecar.amqp.protocols import (
    AckChannel,
    Consumer,
    DeliveryConsumer,
    Publisher,
    RelayChannel,
    RelayConnection,
)
from sidecar.amqp.stream import BodyStream
from sidecar.errors import (
    BrokerConnectionError,
    ChannelClosedError,
    ChannelLostError,
    ConnectFailedError,
    MissingEntityError,
    SidecarChannelError,
)
from sidecar.wire import Delivery, PublishOutcome, UndecodableTable

__all__ = [
    "AckChannel",
    "BodyStream",
    "BrokerConnectionError",
    "Channel",
    "ChannelClosedError",
    "ChannelLostError",
    "ChannelState",
    "ClientOptions",
    "ConnectFailedError",
    "Connection",
    "Consumer",
    "Delivery",
    "DeliveryConsumer",
    "MissingEntityError",
    "PublishOutcome",
    "Publisher",
    "QueueCounts",
    "RelayChannel",
    "RelayConnection",
    "SidecarChannelError",
    "UndecodableTable",
    "connect",
    "install_codec",
]

if TYPE_CHECKING:

    def _the_client_is_what_the_relay_needs(
        channel: Channel, connection: Connection
    ) -> tuple[RelayChannel, Publisher, Consumer, RelayConnection]:
        """Never called: mypy checks here that the client satisfies the Protocols."""
        return channel, channel, channel, connection
