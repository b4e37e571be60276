"""The long-running process: one connection, one worker per route, signals, reloads, probes.

This module owns the lifecycle: connect with backoff, start a ``RouteWorker`` per route,
reconnect when the broker goes away, apply a reloaded route map route by route, and shut
down in the reverse order of start-up on SIGTERM. It settles no message itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from typing import TYPE_CHECKING

from sidecar import __version__, startup_signals
from sidecar.amqp import connect
from sidecar.backoff import Backoff
from sidecar.contract import CONTRACT_VERSION
from sidecar.errors import ConfigError, TlsFileError
from sidecar.failover import Failover
from sidecar.health import HealthServer, Probe
from sidecar.metrics import Metrics, ReloadResult
from sidecar.relay import RouteWorker
from sidecar.reload_plan import plan_reload
from sidecar.route_files import load_config
from sidecar.tls import client_context
from sidecar.waits import first_of, sleep_unless

if TYPE_CHECKING:
    import random
    import ssl
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from sidecar.address import BrokerAddress
    from sidecar.amqp import Connection
    from sidecar.clock import Clock
    from sidecar.reload_plan import ReloadPlan
    from sidecar.route_map import BrokerConfig, Route, RouteMap

__all__ = ["Service"]

log = logging.getLogger(__name__)

CONFIG_POLL_S = 2.0  # how often a changed route map file is noticed (SIGHUP is immediate)
TICK_S = 5.0
SHUTDOWN_SLACK_S = 10.0  # beyond shutdown_grace_s: cancelling consumers, closing channels
LIVENESS_STALE_S = 60.0  # an event loop blocked this long fails /healthz
HEALTHY_SESSION_S = 30.0  # a connection that lived this long resets the reconnect backoff


def _ssl_context(broker: BrokerConfig, address: BrokerAddress) -> ssl.SSLContext | None:
    # Built again at every connect: a renewed certificate applies at the next reconnect. A
    # file gone since the map was loaded fails this connect, which is retried with backoff.
    if not address.tls:
        return None
    try:
        return client_context(broker.tls)
    except TlsFileError as e:
        raise ConnectionError(str(e)) from e


class Service:
    """Runs the sidecar until SIGTERM; see the module docstring."""

    def __init__(
        self,
        route_map: RouteMap,
        *,
        config_path: Path | None,
        env: Mapping[str, str],
        registry: CollectorRegistry,
        clock: Clock,
        new_id: Callable[[], str],
        rng: random.Random,
    ) -> None:
        self._route_map = route_map
        self._config_path = config_path
        self._env = env
        self._clock = clock
        self._new_id = new_id
        self._rng = rng
        self._metrics = Metrics(
            registry,
            version=__version__,
            contract=CONTRACT_VERSION,
            producers_per_route=route_map.metrics.producers_per_route,
        )
        self._health = HealthServer(
            host=route_map.http.host,
            port=route_map.http.port,
            registry=registry,
            liveness=self.liveness,
            readiness=self.readiness,
        )
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._connected = False
        self._last_tick = clock.monotonic()
        self._workers: dict[str, tuple[RouteWorker, asyncio.Task[None]]] = {}
        self._session: asyncio.TaskGroup | None = None
        # The address in use (None while not connected) and its login: what the broker
        # checks user_id against, even after a reload changed the URLs (which apply at the
        # next reconnect). The ring is shuffled once per process, so replicas spread.
        self._failover = Failover.shuffled(route_map.broker.addresses, rng=rng)
        self._node: BrokerAddress | None = None
        self._login = self._failover.addresses[0].login
        self._connection: Connection | None = None
        self._config_stamp = self._stat_config()
        for route in route_map.routes:
            self._metrics.add_route(route.name)
        self._metrics.watch_broker_blocked(lambda: self._blocked_reason() is not None)

    # --- probes (called from the HTTP thread: plain reads only) ---

    @property
    def http_port(self) -> int:
        """The port /metrics, /healthz and /readyz listen on."""
        return self._health.port

    def liveness(self) -> Probe:
        """Alive while the event loop keeps ticking; a loop stuck this long fails.

        The tick task stamps ``_last_tick`` every ``TICK_S``; a loop blocked by a
        synchronous call or a busy callback stops stamping, and this thread sees it. After
        a stop request the ticks end while the routes drain: the process then exits by
        itself within the grace period (or is killed at it), so it is not reported dead.
        """
        if self._stop.is_set():
            return Probe(ok=True, detail="stopping")
        stale = self._clock.monotonic() - self._last_tick
        if stale > LIVENESS_STALE_S:
            return Probe(ok=False, detail=f"event loop has not run for {stale:.0f}s")
        return Probe(ok=True, detail="ok")

    def _blocked_reason(self) -> str | None:
        """Return the broker's reason while it blocks the open connection (from any thread)."""
        connection = self._connection
        return None if connection is None else connection.blocked_reason

    def readiness(self) -> Probe:
        """Ready when connected, not blocked by the broker, and every route of the map consumes.

        ``detail`` has one ``route NAME: reason`` line per route that does not consume (or
        ``broker: not connected``, or ``broker: blocked: REASON``); ``report`` is the
        /readyz JSON body, every route with "consuming" or its reason.
        """
        # Snapshots: the loop may swap the map or add and remove workers meanwhile.
        connected, route_map, workers = self._connected, self._route_map, dict(self._workers)
        blocked = self._blocked_reason() if connected else None
        node = self._node
        routes: dict[str, str] = {}
        down: list[str] = []
        for route in route_map.routes:
            entry = workers.get(route.name)
            if entry is None:
                reason: str | None = "starting" if connected else "waiting for the broker"
            else:
                reason = entry[0].pause_reason
            if reason is None:
                routes[route.name] = "consuming"
            else:
                routes[route.name] = reason
                down.append(f"route {route.name}: {reason}")
        if blocked is not None:
            down.insert(0, f"broker: blocked: {blocked}")
        ready = connected and not down
        broker = "connected" if connected else "not connected"
        report = {
            "ready": ready,
            "broker": broker if blocked is None else f"blocked: {blocked}",
            "routes": routes,
        }
        if connected and node is not None:  # which node of the cluster, the password masked
            report["node"] = node.masked()
        if not connected:
            return Probe(ok=False, detail="broker: not connected", report=report)
        return Probe(ok=ready, detail="\n".join(down) or "ok", report=report)

    # --- control ---

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does)."""
        self._stop.set()

    def request_reload(self) -> None:
        """Reload the route map from its file (what SIGHUP does)."""
        self._reload.set()

    async def run(self) -> int:
        """Run until stopped; return the process exit code."""
        loop = asyncio.get_running_loop()
        for signum, handler in (
            (signal.SIGTERM, self.request_stop),
            (signal.SIGINT, self.request_stop),
            (signal.SIGHUP, self.request_reload),
        ):
            loop.add_signal_handler(signum, handler)
        if startup_signals.stop_requested():  # a SIGTERM that came while starting
            self.request_stop()
        self._health.start()
        log.info(
            "acemq-sidecar %s started: %d routes, metrics on port %d",
            __version__,
            len(self._route_map.routes),
            self._health.port,
        )
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._connection_loop(), name="connection")
                tasks.create_task(self._watch_config(), name="config-watch")
                tasks.create_task(self._tick(), name="liveness-tick")
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            self._health.stop()
        log.info("acemq-sidecar stopped")
        return 0

    # --- the connection ---

    async def _connection_loop(self) -> None:
        """Connect, run a session, and on its loss connect again, to the next address.

        A failed attempt moves on to the next address at once; only when every address
        failed in a row does the loop back off (exponential, with jitter). A lost session
        backs off as before, then tries the next address: a node that just went away is
        tried again last.
        """
        backoff = Backoff(rng=self._rng)
        has_connected = False
        while not self._stop.is_set():
            broker = self._route_map.broker
            self._failover = self._failover.replaced(broker.addresses, rng=self._rng)
            address = self._failover.next_address()
            try:
                connection = await connect(
                    address,
                    heartbeat_s=broker.heartbeat_s,
                    connect_timeout_s=broker.connect_timeout_s,
                    ssl_context=_ssl_context(broker, address),
                )
            except ConnectionError as e:
                if not self._failover.failed():
                    log.warning(
                        "broker %s unreachable: %s; trying the next address",
                        address.masked(),
                        e,
                        extra={"node": address.endpoint},
                    )
                    continue
                delay = backoff.next_delay()
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
            if has_connected:
                self._metrics.count_reconnect()
            has_connected = True
            self._node, self._login = address, address.login
            self._set_connected(connected=True)
            log.info("connected to %s", address.masked(), extra={"node": address.endpoint})
            started = asyncio.get_running_loop().time()
            try:
                await self._run_session(connection)
            finally:
                self._set_connected(connected=False)
                await connection.close()
            if asyncio.get_running_loop().time() - started >= HEALTHY_SESSION_S:
                backoff.reset()  # a fresh failure; one that comes at once again backs off
            if not self._stop.is_set():
                delay = backoff.next_delay()
                reason = await connection.wait_closed()
                log.warning(
                    "connection to the broker %s lost (%s); reconnecting in %.1fs",
                    address.masked(),
                    reason or "closed",
                    delay,
                    extra={"node": address.endpoint},
                )
                await sleep_unless(self._stop, delay)

    def _set_connected(self, *, connected: bool) -> None:
        self._connected = connected
        self._metrics.set_broker_connected(connected=connected)

    async def _run_session(self, connection: Connection) -> None:
        """Run every route on one connection until it drops or the process stops.

        On a stop the workers drain within ``shutdown_grace_s``; whatever still runs after
        that and the closing slack (a broker that stopped answering) is cancelled, so the
        process exits in time. Unacked deliveries go back to their queues either way.
        """
        try:
            async with asyncio.timeout(None) as deadline, asyncio.TaskGroup() as session:
                self._session, self._connection = session, connection
                try:
                    for route in self._route_map.routes:
                        self._start_worker(route)
                    await self._supervise(connection)
                finally:
                    for worker, _ in self._workers.values():
                        worker.request_stop()
                    self._session = self._connection = None
                    grace = self._route_map.shutdown_grace_s + SHUTDOWN_SLACK_S
                    deadline.reschedule(asyncio.get_running_loop().time() + grace)
        except TimeoutError:
            log.warning("routes did not finish within the shutdown grace; stopped them")
        self._workers.clear()

    async def _supervise(self, connection: Connection) -> None:
        while True:
            await first_of(connection.wait_closed(), self._stop.wait(), self._reload.wait())
            if self._stop.is_set():
                log.info("stopping: draining in-flight messages")
                return
            if not connection.is_open:
                return
            self._reload.clear()
            self._apply_reload()

    def _start_worker(self, route: Route) -> None:
        assert self._session is not None  # noqa: S101 - only called inside a session
        assert self._connection is not None  # noqa: S101
        worker = RouteWorker(
            route,
            quarantine_exchange=self._route_map.quarantine_exchange,
            login=self._login,
            metrics=self._metrics,
            clock=self._clock,
            new_id=self._new_id,
            rng=self._rng,
        )
        task = self._session.create_task(
            worker.run(self._connection, grace_s=self._route_map.shutdown_grace_s),
            name=f"route:{route.name}",
        )
        self._workers[route.name] = (worker, task)

    # --- reloads ---

    def _apply_reload(self) -> None:
        """Replace the route map route by route; refuse an invalid one and keep the old."""
        if self._config_path is None:
            return
        # Stamp before reading: the poller then skips this version (one edit plus SIGHUP
        # is one reload) but still sees a write that lands while we read.
        self._config_stamp = self._stat_config()
        try:
            new_map = load_config(self._config_path, env=self._env)
        except ConfigError as e:
            log.error("config reload refused, the running routes are unchanged: %s", e)  # noqa: TRY400
            self._metrics.count_reload(ReloadResult.REFUSED)
            return
        plan = plan_reload(self._route_map, new_map)
        if plan.broker_changed:
            log.warning("config reload: broker settings take effect at the next reconnect")
        if plan.http_changed:
            log.warning("config reload: http and metrics settings take effect at the next start")
        self._route_map = new_map
        self._carry_out(plan)
        self._metrics.count_reload(ReloadResult.APPLIED)
        log.info(
            "config reloaded: %d routes; %d restarted, %d added, %d removed",
            len(new_map.routes),
            len(plan.restart),
            len(plan.start),
            len(plan.stop),
        )

    def _carry_out(self, plan: ReloadPlan) -> None:
        """Stop, start and restart the workers the plan names; keep the others running."""
        draining: dict[str, asyncio.Task[None]] = {}
        for name in (*plan.stop, *(route.name for route in plan.restart)):
            entry = self._workers.pop(name, None)
            if entry is not None:
                # It drains its in-flight messages, then closes. It leaves the route's gauge
                # alone from now on: a successor may own it (even one re-added by a later
                # reload while this one drains); a removed route's series go anyway.
                entry[0].request_stop(replaced=True)
                draining[name] = entry[1]
        for name in plan.stop:
            if name in draining:  # after the drain, or its last messages would bring them back
                draining[name].add_done_callback(functools.partial(self._forget_route, name))
            else:
                self._metrics.remove_route(name)
        for route in plan.start:
            self._metrics.add_route(route.name)
        if self._session is not None:
            for route in (*plan.restart, *plan.start):
                self._start_worker(route)

    def _forget_route(self, name: str, _task: object = None) -> None:
        if all(route.name != name for route in self._route_map.routes):
            self._metrics.remove_route(name)

    def _stat_config(self) -> tuple[int, int] | None:
        if self._config_path is None:
            return None
        try:
            stat = self._config_path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    async def _watch_config(self) -> None:
        """Notice a changed route map file (a ConfigMap update) and reload it."""
        while not self._stop.is_set():
            await sleep_unless(self._stop, CONFIG_POLL_S)
            stamp = self._stat_config()
            if stamp is not None and stamp != self._config_stamp:
                self._config_stamp = stamp
                log.info("route map file changed; reloading")
                self._reload.set()

    # --- small waits ---

    async def _tick(self) -> None:
        while not self._stop.is_set():
            self._last_tick = self._clock.monotonic()
            await sleep_unless(self._stop, TICK_S)
