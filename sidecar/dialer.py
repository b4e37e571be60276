"""Connecting to the broker: which address next, and how long to wait before trying again.

This module owns the attempts: the failover ring of the broker's addresses (shuffled once
per process, ``sidecar.broker.failover``), the one backoff the attempts and the lost sessions
share, the TLS context built afresh for every attempt, and the log lines of an address
that did not answer or a connection that was lost. It runs no session: ``sidecar.service``
does, between a ``connect`` and the ``after_session`` that follows it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.amqp import ClientOptions, connect
from sidecar.broker import Failover, nack_is_free
from sidecar.contract import ID
from sidecar.errors import TlsFileError
from sidecar.flow import Backoff
from sidecar.relay import first_of, sleep_unless
from sidecar.tls import client_context

if TYPE_CHECKING:
    import asyncio
    import random
    import ssl

    from sidecar.amqp import Connection
    from sidecar.broker import BrokerAddress
    from sidecar.routemap import BrokerConfig

__all__ = ["HEALTHY_SESSION_S", "Connections", "Dialer"]

log = logging.getLogger("sidecar.service")  # the process's lines, whichever module writes them

# The names the broker shows the two connections by (its management UI, list_connections).
CONSUMING_NAME = "acemq-sidecar"
PUBLISHING_NAME = "acemq-sidecar publish"
HEALTHY_SESSION_S = 30.0  # a connection that lived this long resets the reconnect backoff
# What the client is told: copies alike but for their x-acemq-id are told apart by it when
# one comes back, and a consuming channel nacks before its close where the broker's release
# spends no delivery attempt on a nack.
OPTIONS = ClientOptions(match_header=ID, nack_is_free=nack_is_free)


def _ssl_context(broker: BrokerConfig, address: BrokerAddress) -> ssl.SSLContext | None:
    # Built again at every connect: a renewed certificate applies at the next reconnect. A
    # file gone since the map was loaded fails this connect, which is retried with backoff.
    if not address.tls:
        return None
    try:
        return client_context(broker.tls)
    except TlsFileError as e:
        raise ConnectionError(str(e)) from e


@dataclass(frozen=True, slots=True)
class Connections:
    """A session's two connections to one node: one consumes (and acks), one publishes."""

    consuming: Connection
    publishing: Connection

    async def wait_closed(self) -> BaseException | None:
        """Return once either closes, with its reason: the session ends with it."""
        _, first = await first_of(self.consuming.wait_closed(), self.publishing.wait_closed())
        reason: BaseException | None = first.result()
        return reason

    async def close(self) -> None:
        """Close both: the publishing one first, so no copy is confirmed after its ack's turn."""
        await self.publishing.close()
        await self.consuming.close()


async def _connect_both(broker: BrokerConfig, address: BrokerAddress) -> Connections:
    async def one(name: str) -> Connection:
        return await connect(
            address,
            heartbeat_s=broker.heartbeat_s,
            connect_timeout_s=broker.connect_timeout_s,
            ssl_context=_ssl_context(broker, address),
            name=name,
            options=OPTIONS,
        )

    consuming = await one(CONSUMING_NAME)
    try:
        publishing = await one(PUBLISHING_NAME)
    except BaseException:
        await consuming.close()
        raise
    return Connections(consuming, publishing)


class Dialer:
    """Connects to the next broker address that answers; see the module docstring."""

    def __init__(
        self, addresses: tuple[BrokerAddress, ...], *, stop: asyncio.Event, rng: random.Random
    ) -> None:
        self._failover = Failover.shuffled(addresses, rng=rng)
        self._backoff = Backoff(rng=rng)
        self._stop = stop
        self._rng = rng

    async def connect(self, broker: BrokerConfig) -> tuple[Connections, BrokerAddress] | None:
        """Connect to an address of ``broker``; return it with the connections, None on a stop.

        Two connections to the same node: one consumes and acks, the other publishes
        (RabbitMQ's advice: an alarm blocks only the one that publishes, so acks and a
        drain's cancel still flow; and the consuming one can stop reading when the routes'
        bytes in flight fill their budget while the confirms that free them still arrive).

        A failed attempt moves on to the next address at once; only when every address
        failed in a row does it back off (exponential, with jitter) before the next round.
        """
        self._failover = self._failover.replaced(broker.addresses, rng=self._rng)
        while not self._stop.is_set():
            address = self._failover.next_address()
            try:
                connections = await _connect_both(broker, address)
            except ConnectionError as e:
                if not self._failover.failed():
                    log.warning(
                        "broker %s unreachable: %s; trying the next address",
                        address.masked(),
                        e,
                        extra={"node": address.endpoint},
                    )
                    continue
                delay = self._backoff.next_delay()
                log.warning(
                    "broker %s unreachable: %s; retrying in %.1fs",
                    address.masked(),
                    e,
                    delay,
                    extra={"node": address.endpoint},
                )
                await sleep_unless(self._stop, delay)
                continue
            self._failover.connected()
            return connections, address
        return None

    async def after_session(
        self, connections: Connections, address: BrokerAddress, *, lived_s: float
    ) -> None:
        """Back off after a session on ``connection`` ended, unless the process stops.

        A session that lived ``HEALTHY_SESSION_S`` resets the backoff first: its loss is a
        fresh failure, and one that comes at once again backs off. The next ``connect``
        tries the next address: a node that just went away is tried again last.
        """
        if lived_s >= HEALTHY_SESSION_S:
            self._backoff.reset()
        if self._stop.is_set():
            return
        delay = self._backoff.next_delay()
        reason = await connections.wait_closed()
        log.warning(
            "connection to the broker %s lost (%s); reconnecting in %.1fs",
            address.masked(),
            reason or "closed",
            delay,
            extra={"node": address.endpoint},
        )
        await sleep_unless(self._stop, delay)
