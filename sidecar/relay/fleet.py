"""The route workers of one connection: a ``RouteWorker`` per route, started, drained, replaced.

This module owns the running workers of the route map: it starts one per route in a
session (one connection's task group), asks them all to drain when the session ends,
carries out a reload's ``ReloadPlan`` on the running ones (the stopped and restarted
routes drain, the new ones start, the others run on untouched) and adds and removes each
route's metric series. It connects to nothing and reads no file: ``sidecar.service`` does
that, and decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from sidecar.relay.context import RouteContext
from sidecar.relay.worker import RouteWorker

if TYPE_CHECKING:
    import random
    from collections.abc import AsyncIterator, Callable

    from sidecar.amqp import RelayConnection
    from sidecar.clock import Clock
    from sidecar.observe import Metrics, Tracing
    from sidecar.routemap import ReloadPlan, Route, RouteMap

__all__ = ["RouteFleet"]

log = logging.getLogger("sidecar.service")  # the process's lines, whichever module writes them


class RouteFleet:
    """The workers of one route map's routes; see the module docstring.

    Written from the event loop only; ``connection`` and ``pause_reasons`` may be read
    from any thread.
    """

    def __init__(
        self,
        route_map: RouteMap,
        *,
        metrics: Metrics,
        clock: Clock,
        new_id: Callable[[], str],
        rng: random.Random,
        tracing: Tracing | None = None,
    ) -> None:
        self._route_map = route_map  # the map the workers run with, replaced by a reload
        self._tracing = tracing  # None: off
        self._metrics = metrics
        self._clock = clock
        self._new_id = new_id
        self._rng = rng
        self._workers: dict[str, tuple[RouteWorker, asyncio.Task[None]]] = {}
        # Set while a session runs: where new workers go, and the login they publish as
        # (what the broker checks user_id against: see RouteContext.login).
        self._session: asyncio.TaskGroup | None = None
        self._connection: RelayConnection | None = None
        self._publishing: RelayConnection | None = None
        self._login: str | None = None
        for route in route_map.routes:
            metrics.add_route(route.name)

    @property
    def connection(self) -> RelayConnection | None:
        """The connection the workers consume on, from their start to the start of their drain."""
        return self._connection

    @property
    def publishing(self) -> RelayConnection | None:
        """The connection the workers publish on (the one a broker's alarm blocks)."""
        return self._publishing

    def pause_reasons(self) -> dict[str, str | None]:
        """Return each running worker's reason for not consuming (None: it consumes)."""
        # A snapshot first: the loop may add and remove workers meanwhile.
        return {name: worker.pause_reason for name, (worker, _) in dict(self._workers).items()}

    @contextlib.asynccontextmanager
    async def running(
        self,
        connection: RelayConnection,
        publishing: RelayConnection | None = None,
        *,
        login: str | None,
        slack_s: float,
    ) -> AsyncIterator[None]:
        """Run a worker per route on ``connection`` while the body runs, then drain them.

        They publish on ``publishing`` (``connection`` when not given), as ``login``. The
        workers drain within the map's ``shutdown_grace_s``; whatever still runs after that
        and ``slack_s`` (a broker that stopped answering) is cancelled, so the process exits
        in time. Unacked deliveries go back to their queues either way.
        """
        try:
            async with asyncio.timeout(None) as deadline, asyncio.TaskGroup() as session:
                self._session, self._connection, self._login = session, connection, login
                self._publishing = publishing or connection
                try:
                    for route in self._route_map.routes:
                        self._start_worker(route)
                    yield
                finally:
                    for worker, _ in self._workers.values():
                        worker.request_stop()
                    self._session = self._connection = self._publishing = None
                    grace = self._route_map.shutdown_grace_s + slack_s
                    deadline.reschedule(asyncio.get_running_loop().time() + grace)
        except TimeoutError:
            log.warning("routes did not finish within the shutdown grace; stopped them")
        self._workers.clear()

    def apply(self, plan: ReloadPlan, *, route_map: RouteMap) -> None:
        """Run ``route_map`` from now on: stop, start and restart the routes ``plan`` names.

        The routes it keeps run on untouched. A stopped or restarted route's worker drains
        its in-flight messages before it ends; workers start only while a session runs.
        """
        self._route_map = route_map
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

    def _start_worker(self, route: Route) -> None:
        assert self._session is not None  # noqa: S101 - only called inside a session
        assert self._connection is not None  # noqa: S101
        assert self._publishing is not None  # noqa: S101
        quarantine_exchange = self._route_map.quarantine_exchange
        tracing = self._tracing
        worker = RouteWorker(
            RouteContext(
                route=route,
                quarantine_exchange=quarantine_exchange,
                login=self._login,
                metrics=self._metrics,
                clock=self._clock,
                new_id=self._new_id,
                rng=self._rng,
                tracer=None
                if tracing is None
                else tracing.for_route(route, quarantine_exchange=quarantine_exchange),
            )
        )
        task = self._session.create_task(
            worker.run(
                self._connection,
                publishing=self._publishing,
                grace_s=self._route_map.shutdown_grace_s,
            ),
            name=f"route:{route.name}",
        )
        self._workers[route.name] = (worker, task)

    def _forget_route(self, name: str, _task: object = None) -> None:
        """Drop a removed route's series once its worker drained, unless a reload re-added it."""
        if all(route.name != name for route in self._route_map.routes):
            self._metrics.remove_route(name)
