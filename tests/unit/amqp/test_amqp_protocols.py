"""The client's channel and connection are what the relay needs: a fake can stand in."""

from __future__ import annotations

import asyncio

from sidecar.amqp import (
    Channel,
    Connection,
    Consumer,
    Publisher,
    RelayChannel,
    RelayConnection,
)
from sidecar.amqp.handshake import Control
from sidecar.amqp.link import Link


async def test_a_real_channel_and_connection_satisfy_the_relays_protocols() -> None:
    """mypy checks the typed assignments; isinstance checks the members at run time."""
    link = Link(asyncio.get_running_loop())
    channel = Channel(link, 1)
    connection = Connection(link, Control(link))
    as_channel: RelayChannel = channel
    as_publisher: Publisher = channel
    as_consumer: Consumer = channel
    as_connection: RelayConnection = connection
    for value, protocol in [
        (as_channel, RelayChannel),
        (as_publisher, Publisher),
        (as_consumer, Consumer),
        (as_connection, RelayConnection),
    ]:
        assert isinstance(value, protocol)


class HalfAChannel:
    """A fake that only publishes: not enough for a route."""

    is_open = True

    async def publish(self) -> None:
        """Publish nothing."""

    async def publish_through(self) -> None:
        """Pass nothing through."""

    def publish_now(self) -> bool:
        """Publish nothing now."""
        return False

    async def close(self) -> None:
        """Close nothing."""


def test_a_fake_missing_what_the_relay_uses_is_not_a_relay_channel() -> None:
    """The run-time check is not vacuous: a consumer's members are required."""
    assert isinstance(HalfAChannel(), Publisher)
    assert not isinstance(HalfAChannel(), Consumer)
    assert not isinstance(HalfAChannel(), RelayChannel)
