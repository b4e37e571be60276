"""The long-running process: two connections, one worker per route, signals, reloads, probes.

This module owns the lifecycle: connect (``sidecar.dialer`` picks the address, backs off,
and opens a consuming and a publishing connection to it), run the route workers on them
(``sidecar.relay.fleet``), reconnect when the broker goes away, reload the route map on SIGHUP
or a changed file, and shut down in the reverse order of start-up on SIGTERM. It keeps
what the probes read (``observe.probes`` decides what they
answer). It settles no message itself.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

from sidecar import __version__, startup_signals
from sidecar.contract import CONTRACT_VERSION
from sidecar.dialer import Dialer
from sidecar.errors import ConfigError
from sidecar.observe import (
    HealthServer,
    Metrics,
    ReloadResult,
    liveness,
    readiness,
    start_tracing,
)
from sidecar.relay import RouteFleet, first_of, sleep_unless
from sidecar.route_files import RouteMapFile
from sidecar.routemap import plan_reload

if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from sidecar.amqp import Connection
    from sidecar.broker import BrokerAddress
    from sidecar.clock import Clock
    from sidecar.dialer import Connections
    from sidecar.observe import Probe
    from sidecar.routemap import RouteMap

__all__ = ["Service"]

log = logging.getLogger(__name__)

CONFIG_POLL_S = 2.0  # how often a changed route map file is noticed (SIGHUP is immediate)
TICK_S = 5.0
SHUTDOWN_SLACK_S = 10.0  # beyond shutdown_grace_s: cancelling consumers, closing channels
LIVENESS_STALE_S = 60.0  # an event loop blocked this long fails /healthz
TRACE_FLUSH_S = 2.0  # at exit, the queued spans' export is awaited at most this long


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
        self._config = RouteMapFile(config_path, env=env)
        self._clock = clock
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
        self._tracing = tracing = start_tracing(  # None: off
            route_map.tracing, env=env, metrics=self._metrics, version=__version__
        )
        self._fleet = RouteFleet(
            route_map, metrics=self._metrics, clock=clock, new_id=new_id, rng=rng, tracing=tracing
        )
        self._dialer = Dialer(route_map.broker.addresses, stop=self._stop, rng=rng)
        # The address in use (None while not connected): its login is what the workers
        # publish as, even after a reload changed the URLs (they apply at the next reconnect).
        self._node: BrokerAddress | None = None
        self._metrics.watch_broker_blocked(lambda: self._blocked_reason() is not None)

    # --- probes (called from the HTTP thread: plain reads only) ---

    def liveness(self) -> Probe:
        """Alive while the event loop keeps ticking; a loop stuck ``LIVENESS_STALE_S`` fails.

        The tick task stamps ``_last_tick`` every ``TICK_S``; a loop blocked by a
        synchronous call or a busy callback stops stamping, and this thread sees it.
        """
        return liveness(
            stopping=self._stop.is_set(),
            stale_s=self._clock.monotonic() - self._last_tick,
            limit_s=LIVENESS_STALE_S,
        )

    def _blocked_reason(self) -> str | None:
        """Return the broker's reason while it blocks the routes' publishes (any thread)."""
        connection = self._fleet.publishing
        return None if connection is None else connection.blocked_reason

    def readiness(self) -> Probe:
        """Ready when connected, not blocked, and every route of the map consumes (``probes``)."""
        connected = self._connected  # snapshots: the loop may swap the map meanwhile
        return readiness(
            connected=connected,
            routes=[route.name for route in self._route_map.routes],
            pause_reasons=self._fleet.pause_reasons(),
            blocked=self._blocked_reason() if connected else None,
            node=self._node,
        )

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
                tasks.create_task(
                    self._config.watch(self._reload, stop=self._stop, poll_s=CONFIG_POLL_S),
                    name="config-watch",
                )
                tasks.create_task(self._tick(), name="liveness-tick")
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            self._health.stop()
            if self._tracing is not None:
                self._tracing.shutdown(timeout_s=TRACE_FLUSH_S)
        log.info("acemq-sidecar stopped")
        return 0

    # --- the connection ---

    async def _connection_loop(self) -> None:
        """Connect, run a session, and on its loss connect again, to the next address."""
        has_connected = False
        while not self._stop.is_set():
            dialed = await self._dialer.connect(self._route_map.broker)
            if dialed is None:
                return  # stopped before an address answered
            connections, address = dialed
            if has_connected:
                self._metrics.count_reconnect()
            has_connected = True
            self._node = address
            self._set_connected(connected=True)
            login = _logged_in(connections.consuming, address)
            started = asyncio.get_running_loop().time()
            try:
                await self._run_session(connections, login=login)
            finally:
                self._set_connected(connected=False)
                await connections.close()
            lived_s = asyncio.get_running_loop().time() - started
            await self._dialer.after_session(connections, address, lived_s=lived_s)

    def _set_connected(self, *, connected: bool) -> None:
        self._connected = connected
        self._metrics.set_broker_connected(connected=connected)

    async def _run_session(self, connections: Connections, *, login: str | None) -> None:
        """Run every route on the session's connections until one drops or the process stops."""
        consuming, publishing = connections.consuming, connections.publishing
        async with self._fleet.running(
            consuming, publishing, login=login, slack_s=SHUTDOWN_SLACK_S
        ):
            while True:
                await first_of(connections.wait_closed(), self._stop.wait(), self._reload.wait())
                if self._stop.is_set():
                    log.info("stopping: draining in-flight messages")
                    return
                if not (consuming.is_open and publishing.is_open):
                    return
                self._reload.clear()
                self._apply_reload()

    # --- reloads ---

    def _apply_reload(self) -> None:
        """Replace the route map route by route; refuse an invalid one and keep the old."""
        try:
            new_map = self._config.load()
        except ConfigError as e:
            log.error("config reload refused, the running routes are unchanged: %s", e)  # noqa: TRY400
            self._metrics.count_reload(ReloadResult.REFUSED)
            return
        if new_map is None:
            return  # no file to read: the map came from elsewhere
        plan = plan_reload(self._route_map, new_map)
        if plan.broker_changed:
            log.warning("config reload: broker settings take effect at the next reconnect")
        if plan.http_changed:
            log.warning("config reload: http, metrics, tracing settings apply at the next start")
        self._route_map = new_map
        self._fleet.apply(plan, route_map=new_map)
        self._metrics.count_reload(ReloadResult.APPLIED)
        log.info(
            "config reloaded: %d routes; %d restarted, %d added, %d removed",
            len(new_map.routes),
            len(plan.restart),
            len(plan.start),
            len(plan.stop),
        )

    # --- small waits ---

    async def _tick(self) -> None:
        while not self._stop.is_set():
            self._last_tick = self._clock.monotonic()
            await sleep_unless(self._stop, TICK_S)


def _logged_in(connection: Connection, address: BrokerAddress) -> str | None:
    """Log the connect and how it logged in; return the name the broker knows us by.

    None for EXTERNAL without a user in the URL: the certificate's name is not known here,
    so every user_id is moved (none could be checked to match it), and the log says so.
    """
    mechanism = connection.mechanism
    login = address.user_for(mechanism)
    extra = {"node": address.endpoint, "mechanism": mechanism}
    who = "the client certificate's user" if login is None else f"user {login!r}"
    log.info(
        "connected to %s, logged in with SASL %s as %s",
        address.masked(),
        mechanism,
        who,
        extra=extra,
    )
    if login is None:
        log.info(
            "EXTERNAL login without a user in the URL: the broker knows the sidecar by a name"
            " from its certificate that the sidecar does not know, so every user_id is moved"
            " to acemq-original-user-id; name the certificate's user in the URL"
            " (amqps://USER@host) to keep the user_ids that match it",
            extra=extra,
        )
    return login
