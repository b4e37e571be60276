"""Connecting to the broker: the failover ring walked, backoff per failed round, after a loss.

No broker: the client's ``connect`` and the backoff's sleep are replaced by recorders, so
each test says which addresses were tried and how long the dialer would have waited.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from sidecar import dialer as dialer_module
from sidecar.broker import BrokerAddress
from sidecar.dialer import HEALTHY_SESSION_S, Dialer
from sidecar.routemap.model import BrokerConfig, TlsConfig

NODES = tuple(BrokerAddress.parse(f"amqp://relay:s3cret@rabbit-{i}/") for i in range(3))


def broker(*addresses: BrokerAddress) -> BrokerConfig:
    return BrokerConfig(
        addresses=addresses, tls=TlsConfig(), prefetch=8, heartbeat_s=30, connect_timeout_s=1.0
    )


@dataclass
class FakeConnection:
    """What the dialer reads of a lost connection: why it closed."""

    reason: str = "heartbeat timeout"
    name: str = dialer_module.CONSUMING_NAME
    closed: bool = False

    async def wait_closed(self) -> str:
        """Return the reason at once: the connection is already gone."""
        return self.reason

    async def close(self) -> None:
        """Close it."""
        self.closed = True


@dataclass
class Wire:
    """The client's connect and the backoff's sleep, as recorders."""

    stop: asyncio.Event
    up: set[str] = field(default_factory=set)  # hosts that answer
    tried: list[str] = field(default_factory=list)  # the consuming connections' hosts
    publishing: list[str] = field(default_factory=list)  # the publishing connections' hosts
    publishing_up: bool = True
    made: list[FakeConnection] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    stop_after_sleeps: int | None = None

    async def connect(self, address: BrokerAddress, *, name: str, **_: Any) -> FakeConnection:
        """Answer for the hosts that are up; refuse the others."""
        publishing = name == dialer_module.PUBLISHING_NAME
        (self.publishing if publishing else self.tried).append(address.host)
        if address.host not in self.up or (publishing and not self.publishing_up):
            raise ConnectionError("connection refused")
        self.made.append(FakeConnection(name=name))
        return self.made[-1]

    async def sleep_unless(self, stop: asyncio.Event, delay_s: float) -> None:
        """Record the delay instead of waiting it; stop after the given number of sleeps."""
        self.delays.append(delay_s)
        if self.stop_after_sleeps is not None and len(self.delays) >= self.stop_after_sleeps:
            stop.set()


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    wire = Wire(stop=asyncio.Event())
    monkeypatch.setattr(dialer_module, "connect", wire.connect)
    monkeypatch.setattr(dialer_module, "sleep_unless", wire.sleep_unless)
    return wire


def make_dialer(wire: Wire, *addresses: BrokerAddress) -> Dialer:
    return Dialer(addresses, stop=wire.stop, rng=random.Random(1))


async def test_a_node_that_does_not_answer_moves_on_to_the_next_at_once(wire: Wire) -> None:
    """One node down of three: no backoff, the next node of the ring serves."""
    dialer = make_dialer(wire, *NODES)
    ring = [address.host for address in dialer._failover.addresses]
    wire.up = set(ring[1:])
    dialed = await dialer.connect(broker(*NODES))
    assert dialed is not None
    assert dialed[1].host == ring[1]
    assert wire.tried == ring[:2]
    assert wire.delays == []


async def test_it_backs_off_once_per_round_in_which_every_node_failed(wire: Wire) -> None:
    """The whole cluster down: one wait per round, not one per node; a stop ends it."""
    dialer = make_dialer(wire, *NODES)
    ring = [address.host for address in dialer._failover.addresses]
    wire.stop_after_sleeps = 2
    assert await dialer.connect(broker(*NODES)) is None
    assert wire.tried == ring + ring
    assert len(wire.delays) == 2
    assert wire.delays[0] < wire.delays[1]  # exponential: the second round waits longer


async def test_a_reloaded_address_list_applies_at_the_next_connect(wire: Wire) -> None:
    """broker.urls changed by a reload: the next connection goes to the new nodes."""
    dialer = make_dialer(wire, NODES[0])
    moved = BrokerAddress.parse("amqp://relay:s3cret@rabbit-new/")
    wire.up = {"rabbit-new"}
    wire.stop_after_sleeps = 1  # the old node only: a stop ends it, the test fails fast
    dialed = await dialer.connect(broker(moved))
    assert dialed is not None
    assert wire.tried == ["rabbit-new"]


async def test_a_session_consumes_and_publishes_on_two_connections_to_one_node(
    wire: Wire,
) -> None:
    """Publishing apart from consuming: an alarm blocks only the publishing connection."""
    dialer = make_dialer(wire, *NODES)
    wire.up = {address.host for address in NODES}
    dialed = await dialer.connect(broker(*NODES))
    assert dialed is not None
    connections, address = dialed
    assert wire.tried == wire.publishing == [address.host]
    assert [c.name for c in wire.made] == ["acemq-sidecar", "acemq-sidecar publish"]
    assert [connections.consuming, connections.publishing] == list(wire.made)  # type: ignore[comparison-overlap]


async def test_a_node_whose_publishing_connection_fails_is_a_failed_attempt(wire: Wire) -> None:
    """The consuming connection made first is closed, and the next node is tried."""
    dialer = make_dialer(wire, *NODES)
    wire.up = {address.host for address in NODES}
    wire.publishing_up = False
    wire.stop_after_sleeps = 1
    assert await dialer.connect(broker(*NODES)) is None
    assert len(wire.tried) == len(NODES)
    assert all(connection.closed for connection in wire.made)


async def test_a_stop_before_connecting_tries_nothing(wire: Wire) -> None:
    """SIGTERM while the broker is away: the process exits without another attempt."""
    wire.stop.set()
    assert await make_dialer(wire, *NODES).connect(broker(*NODES)) is None
    assert wire.tried == []


async def test_losses_in_a_row_back_off_further_and_a_healthy_session_starts_afresh(
    wire: Wire,
) -> None:
    """A connection that dies at once again must not reconnect in a tight loop."""
    dialer = make_dialer(wire, NODES[0])
    lost = FakeConnection()
    await dialer.after_session(lost, NODES[0], lived_s=1.0)  # type: ignore[arg-type]
    await dialer.after_session(lost, NODES[0], lived_s=1.0)  # type: ignore[arg-type]
    await dialer.after_session(lost, NODES[0], lived_s=HEALTHY_SESSION_S)  # type: ignore[arg-type]
    first, second, fresh = wire.delays
    assert 0.25 <= first <= 0.5
    assert 0.5 <= second <= 1.0
    assert 0.25 <= fresh <= 0.5


async def test_no_wait_after_a_session_the_stop_ended(wire: Wire) -> None:
    """The drain is done: the process exits now, not after a reconnect delay."""
    wire.stop.set()
    dialer = make_dialer(wire, NODES[0])
    await dialer.after_session(FakeConnection(), NODES[0], lived_s=1.0)  # type: ignore[arg-type]
    assert wire.delays == []


async def test_the_log_lines_never_show_the_password(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    """Every attempt and loss is logged with the node's URL, its password masked."""
    dialer = make_dialer(wire, *NODES)
    wire.stop_after_sleeps = 1
    with caplog.at_level(logging.WARNING, logger="sidecar.service"):
        await dialer.connect(broker(*NODES))
        wire.stop.clear()
        await dialer.after_session(FakeConnection(), NODES[0], lived_s=1.0)  # type: ignore[arg-type]
    assert "trying the next address" in caplog.text
    assert "retrying in" in caplog.text
    assert "lost (heartbeat timeout); reconnecting in" in caplog.text
    assert "amqp://relay:***@rabbit-" in caplog.text
    assert "s3cret" not in caplog.text
