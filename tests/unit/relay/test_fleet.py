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

import pytest
from prometheus_client import CollectorRegistry

from sidecar.broker import BrokerAddress
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
from tests.fakes import FakeBroker


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


async def all_consuming(broker: FakeBroker, routes: int) -> None:
    """Return once every route consumes on the fake broker (the caller bounds the wait)."""
    while True:
        if broker.live_consumers() >= routes:
            return
        await asyncio.sleep(0.001)


async def worker_consuming(route: str) -> None:
    """Return once the route's worker consumes: its window follows the bodies (a task)."""
    while not any(task.get_name() == f"follow:{route}" for task in asyncio.all_tasks()):  # noqa: ASYNC110 - no event tells it
        await asyncio.sleep(0.001)


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
    broker = FakeBroker()
    connection = broker.connection()
    async with rig.fleet.running(connection, login="relay", slack_s=1.0):
        assert rig.fleet.connection is connection
        async with asyncio.timeout(5):
            await all_consuming(broker, 2)
        assert rig.fleet.pause_reasons() == {"orders": None, "invoices": None}
    assert rig.fleet.connection is None
    assert rig.fleet.pause_reasons() == {}
    assert connection.opened
    assert all(not channel.is_open for channel in connection.opened)


async def test_workers_still_draining_after_the_grace_and_slack_are_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that stops answering mid-drain must not keep the process past its grace."""
    rig = make_rig("orders", shutdown_grace_s=0.05)
    broker = FakeBroker()
    broker.hold("cancel")  # a broker that stopped answering: the cancel-ok never comes
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="sidecar.service"):
        async with rig.fleet.running(broker.connection(), login="relay", slack_s=0.05):
            async with asyncio.timeout(5):
                await all_consuming(broker, 1)
                # Past its open: a stop while the consume-ok is on its way closes the
                # channel at once (nothing to drain), which is not the case under test.
                await worker_consuming("orders")
            left = loop.time()
        took = loop.time() - left
    assert 0.1 <= took < 10.0, took  # the grace and slack, not the broker's silence (for ever)
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
