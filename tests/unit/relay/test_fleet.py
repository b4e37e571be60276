"""The route fleet: workers started per route, reload plans carried out, series kept right.

No broker: a connection whose channels open and consume but never deliver stands in for
one, and reload plans are applied to fake workers whose drain the test ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.amqp import RelayConnection
from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.relay.fleet import RouteFleet
from sidecar.routemap.model import (
    BrokerConfig,
    HttpConfig,
    MetricsConfig,
    Mode,
    Publishers,
    Route,
    RouteMap,
    TlsConfig,
)
from sidecar.routemap.reload_plan import plan_reload
from sidecar.wire import BrokerAddress


def route(name: str) -> Route:
    return Route(
        name=name,
        queue=f"staging.{name}",
        exchange=name,
        routing_key=None,
        publishers=Publishers.ACEMQ,
        origin=None,
        mode=Mode.ENFORCE,
        prefetch=8,
    )


def route_map(*names: str, shutdown_grace_s: float = 30.0) -> RouteMap:
    return RouteMap(
        broker=BrokerConfig(
            addresses=(BrokerAddress.parse("amqp://h/"),),
            tls=TlsConfig(),
            prefetch=8,
            heartbeat_s=30,
            connect_timeout_s=10.0,
        ),
        http=HttpConfig(host="127.0.0.1", port=9090),
        metrics=MetricsConfig(producers_per_route=20),
        mode=Mode.ENFORCE,
        quarantine_exchange="acemq.quarantine",
        shutdown_grace_s=shutdown_grace_s,
        routes=tuple(route(name) for name in names),
    )


@dataclass
class Rig:
    """A fleet and the registry its metrics are on."""

    fleet: RouteFleet
    registry: CollectorRegistry

    def has_series(self, name: str) -> bool:
        """Whether the route's route_up series exists."""
        sample = self.registry.get_sample_value("acemq_sidecar_route_up", {"route": name})
        return sample is not None


def make_rig(*names: str, shutdown_grace_s: float = 30.0) -> Rig:
    registry = CollectorRegistry()
    fleet = RouteFleet(
        route_map(*names, shutdown_grace_s=shutdown_grace_s),
        metrics=Metrics(registry, version="test", contract="1.1"),
        clock=Clock.system(),
        new_id=lambda: "id",
        rng=random.Random(1),
    )
    return Rig(fleet=fleet, registry=registry)


@dataclass
class DrainingWorker:
    """A running worker as the fleet sees it; its task ends when the test says so."""

    pause_reason: str | None = None
    stops: list[bool] = field(default_factory=list)

    def request_stop(self, *, replaced: bool = False) -> None:
        """Record the stop request."""
        self.stops.append(replaced)


def running(rig: Rig, name: str) -> tuple[DrainingWorker, asyncio.Future[None]]:
    """Put a fake worker for ``name`` in the fleet, as if a session had started it."""
    worker, task = DrainingWorker(), asyncio.get_running_loop().create_future()
    rig.fleet._workers[name] = (worker, task)  # type: ignore[assignment]
    return worker, task


@dataclass
class QuietChannel:
    """A channel that opens and consumes, delivers nothing, and may hang on cancel."""

    connection: QuietConnection
    is_open: bool = True
    consumer_cancelled: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def consume(
        self,
        queue: str,
        callback: Any,
        *,
        consumer_tag: str,
        on_body_size: Any = None,
        max_in_flight_bytes: int | None = None,
    ) -> None:
        """Consume nothing."""
        del queue, callback, consumer_tag, on_body_size, max_in_flight_bytes

    async def qos(self, prefetch_count: int) -> None:
        """Take any window."""
        del prefetch_count

    async def cancel(self, consumer_tag: str, *, on_sent: Any = None) -> bool:
        """Return at once, or never: a broker that stopped answering."""
        del consumer_tag
        if on_sent is not None:
            on_sent()
        if self.connection.hang_on_cancel:
            await asyncio.Event().wait()
        return True

    def has_room(self) -> bool:
        """Always: no byte budget here."""
        return True

    async def wait_closed(self) -> str:
        """Return once closed; the worker waits so once its route consumes."""
        self.connection.consumers += 1
        if self.connection.consumers == self.connection.routes:
            self.connection.all_consuming.set()
        await self.closed.wait()
        return "closed"

    async def close(self) -> None:
        """Close."""
        self.is_open = False
        self.closed.set()


@dataclass
class QuietConnection:
    """A connection whose entities all exist and whose channels are ``QuietChannel``s."""

    routes: int
    hang_on_cancel: bool = False
    is_open: bool = True
    blocked_reason: str | None = None
    consumers: int = 0
    all_consuming: asyncio.Event = field(default_factory=asyncio.Event)
    channels: list[QuietChannel] = field(default_factory=list)

    async def wait_closed(self) -> BaseException | None:
        """Never close."""
        await asyncio.Event().wait()
        return None

    async def wait_unblocked(self) -> None:
        """Never blocked."""

    async def check_queue(self, name: str) -> None:
        """Every queue exists."""
        del name

    async def check_exchange(self, name: str) -> None:
        """Every exchange exists."""
        del name

    async def channel(self, *, prefetch: int) -> QuietChannel:
        """Open a quiet channel."""
        del prefetch
        channel = QuietChannel(self)
        self.channels.append(channel)
        return channel


def test_every_route_of_the_map_has_its_series_from_the_start() -> None:
    """The series exist at zero before any connection: absence alerts need them."""
    rig = make_rig("orders", "invoices")
    assert rig.has_series("orders")
    assert rig.has_series("invoices")
    assert rig.fleet.pause_reasons() == {}
    assert rig.fleet.connection is None


def test_a_reload_between_sessions_changes_the_series_and_starts_nothing() -> None:
    """Without a session a removed route's series go at once; a new route's appear."""
    rig = make_rig("orders", "invoices")
    new = route_map("orders", "payments")
    rig.fleet.apply(plan_reload(route_map("orders", "invoices"), new), route_map=new)
    assert not rig.has_series("invoices")
    assert rig.has_series("payments")
    assert rig.has_series("orders")
    assert rig.fleet.pause_reasons() == {}  # no worker starts outside a session


async def test_a_removed_route_keeps_its_series_until_its_worker_drained() -> None:
    """Its last messages settle while draining; dropping the series earlier would recreate them."""
    rig = make_rig("orders", "invoices")
    worker, task = running(rig, "invoices")
    new = route_map("orders")
    rig.fleet.apply(plan_reload(route_map("orders", "invoices"), new), route_map=new)
    assert worker.stops == [True]  # replaced: it no longer reports the route up or down
    assert "invoices" not in rig.fleet.pause_reasons()
    await asyncio.sleep(0)
    assert rig.has_series("invoices")
    task.set_result(None)
    await asyncio.sleep(0)
    assert not rig.has_series("invoices")


async def test_a_route_added_back_while_its_old_worker_drains_keeps_its_series() -> None:
    """Removed, then re-added by a later reload before the drain ended: the series stay."""
    rig = make_rig("orders", "invoices")
    _, task = running(rig, "invoices")
    without = route_map("orders")
    rig.fleet.apply(plan_reload(route_map("orders", "invoices"), without), route_map=without)
    again = route_map("orders", "invoices")
    rig.fleet.apply(plan_reload(without, again), route_map=again)
    task.set_result(None)
    await asyncio.sleep(0)
    assert rig.has_series("invoices")


async def test_running_starts_a_worker_per_route_and_drains_them_on_exit() -> None:
    """Each route consumes on the session's connection; leaving the session stops them all."""
    rig = make_rig("orders", "invoices")
    connection = QuietConnection(routes=2)
    relay_connection = cast("RelayConnection", connection)
    async with rig.fleet.running(relay_connection, login="relay", slack_s=1.0):
        assert rig.fleet.connection is relay_connection
        async with asyncio.timeout(5):
            await connection.all_consuming.wait()
        assert rig.fleet.pause_reasons() == {"orders": None, "invoices": None}
    assert rig.fleet.connection is None
    assert rig.fleet.pause_reasons() == {}
    assert connection.channels
    assert all(not channel.is_open for channel in connection.channels)


async def test_workers_still_draining_after_the_grace_and_slack_are_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that stops answering mid-drain must not keep the process past its grace."""
    rig = make_rig("orders", shutdown_grace_s=0.05)
    connection = QuietConnection(routes=1, hang_on_cancel=True)
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="sidecar.service"):
        async with rig.fleet.running(
            cast("RelayConnection", connection), login="relay", slack_s=0.05
        ):
            async with asyncio.timeout(5):
                await connection.all_consuming.wait()
            left = loop.time()
        took = loop.time() - left
    assert 0.1 <= took < 2.0, took
    assert "did not finish within the shutdown grace" in caplog.text
    assert rig.fleet.pause_reasons() == {}


def test_a_new_map_for_the_same_routes_restarts_none() -> None:
    """A reload that changes nothing the routes run with keeps every worker."""
    rig = make_rig("orders")
    same = dataclasses.replace(route_map("orders"), http=HttpConfig(host="0.0.0.0", port=1))  # noqa: S104
    plan = plan_reload(route_map("orders"), same)
    assert (plan.stop, plan.start, plan.restart) == ((), (), ())
    rig.fleet.apply(plan, route_map=same)
    assert rig.has_series("orders")
