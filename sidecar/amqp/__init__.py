"""The sidecar's AMQP 0-9-1 client: the face every other module imports.

A lean client on an asyncio protocol, built for one job: consume, publish with confirms,
ack. The frames every message crosses are read and written by our own codec
(:mod:`sidecar.amqp.frames`); the rare ones go through pamqp behind one hook
(:mod:`sidecar.amqp.codec`, and :mod:`sidecar.amqp.handshake` for channel 0). The relay
talks to it through the Protocols of :mod:`sidecar.amqp.protocols`. Import from here,
never from a submodule: import-linter holds everyone else to this face.

The modules, each one job: ``link`` (the socket: frames in, batched writes out,
heartbeats), ``handshake`` (channel 0), ``connection`` (connect, channels, checks),
``channel`` (the channel's state machine), ``acks`` and ``confirms`` (its settlement
bookkeeping), ``delivery`` (the values it hands out), ``frames`` (the hot frames, pure),
``codec`` (pamqp), ``protocols`` (what the relay needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.amqp.channel import Channel
from sidecar.amqp.codec import install_codec
from sidecar.amqp.connection import Connection, connect
from sidecar.amqp.delivery import Delivery, PublishOutcome
from sidecar.amqp.frames import UndecodableTable
from sidecar.amqp.lifecycle import ChannelState
from sidecar.amqp.protocols import Consumer, Publisher, RelayChannel, RelayConnection
from sidecar.errors import (
    BrokerConnectionError,
    ChannelClosedError,
    ChannelLostError,
    ConnectFailedError,
    MissingEntityError,
    SidecarChannelError,
)

__all__ = [
    "BrokerConnectionError",
    "Channel",
    "ChannelClosedError",
    "ChannelLostError",
    "ChannelState",
    "ConnectFailedError",
    "Connection",
    "Consumer",
    "Delivery",
    "MissingEntityError",
    "PublishOutcome",
    "Publisher",
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
