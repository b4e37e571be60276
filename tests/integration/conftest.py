"""Run the sidecar's Service in the test's event loop against the test broker."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.clock import Clock
from sidecar.route_files import load_route_map
from sidecar.service import Service
from tests.support import Broker

pytestmark = pytest.mark.integration


@dataclass
class Topology:
    """One test's staging queue, target exchange and queue, and quarantine."""

    staging: str
    staging_exchange: str  # a topic exchange bound to staging with "#", to keep routing keys
    target_exchange: str
    target: str
    quarantine_exchange: str
    quarantine: str


async def make_topology(broker: Broker, suffix: str = "a", binding: str = "#") -> Topology:
    """Declare staging -> (sidecar) -> target exchange -> target queue, and quarantine."""
    staging = await broker.queue(f"staging.{suffix}")
    staging_exchange = await broker.exchange(f"stage.{suffix}")
    await broker.bind(staging, staging_exchange, "#")
    target_exchange = await broker.exchange(f"target.{suffix}")
    target = await broker.queue(f"out.{suffix}")
    await broker.bind(target, target_exchange, binding)
    quarantine_exchange = broker.name("quarantine")
    if quarantine_exchange not in broker.exchanges:
        await broker.exchange("quarantine", "fanout")
        await broker.queue("quarantined")
        await broker.bind(broker.name("quarantined"), quarantine_exchange, "")
    return Topology(
        staging=staging,
        staging_exchange=staging_exchange,
        target_exchange=target_exchange,
        target=target,
        quarantine_exchange=quarantine_exchange,
        quarantine=broker.name("quarantined"),
    )


def route_map_yaml(
    url: str,
    quarantine_exchange: str,
    routes: list[dict[str, Any]],
    *,
    mode: str = "enforce",
    prefetch: int = 64,
    max_in_flight_bytes: int | None = None,
    max_body_bytes: int | None = None,
) -> str:
    """Write a route map for the given routes (dicts of the YAML route keys)."""
    lines = [
        "broker:",
        f"  url: {url}",
        f"  prefetch: {prefetch}",
        *([f"  max_in_flight_bytes: {max_in_flight_bytes}"] if max_in_flight_bytes else []),
        *([f"  max_body_bytes: {max_body_bytes}"] if max_body_bytes else []),
        "http: {listen: '127.0.0.1:0'}",
        f"mode: {mode}",
        f"quarantine: {{exchange: {quarantine_exchange}}}",
        "shutdown_grace_s: 10",
        "routes:",
    ]
    for route in routes:
        lines.append(f"  - name: {route['name']}")
        lines.append(f"    from: {route['from']}")
        key = route.get("routing_key", "keep")
        lines.append(f"    to: {{exchange: {route['exchange']}, routing_key: {key}}}")
        lines.extend(
            f"    {option}: {route[option]}"
            for option in ("publishers", "origin", "mode", "prefetch")
            if option in route
        )
    return "\n".join(lines) + "\n"


async def wait_for(
    predicate: Callable[[], bool], *, timeout_s: float = 15.0, what: str = ""
) -> None:
    """Poll a predicate until it holds (tests only; bounded)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or predicate}")
        await asyncio.sleep(0.02)


@dataclass
class Running:
    """A Service running in this event loop, with its registry and config file."""

    service: Service
    registry: CollectorRegistry
    path: Path
    task: asyncio.Task[int]

    def sample(self, name: str, **labels: str) -> float:
        """A metric's current value (0 when the series does not exist)."""
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def run_sidecar(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Running]]:
    """Start a Service for a route map text; stop it (SIGTERM path) on exit."""

    @contextlib.asynccontextmanager
    async def run(text: str, *, ready: bool = True) -> AsyncIterator[Running]:
        path = tmp_path / f"routes-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(text)
        registry = CollectorRegistry()
        service = Service(
            load_route_map(path, env={}),
            config_path=path,
            env={},
            registry=registry,
            clock=Clock.system(),
            new_id=lambda: str(uuid.uuid4()),
            rng=random.Random(7),
        )
        task = asyncio.create_task(service.run(), name="sidecar-under-test")
        try:
            if ready:
                await wait_for(lambda: service.readiness().ok or task.done(), what="readiness")
                assert not task.done(), task
            yield Running(service=service, registry=registry, path=path, task=task)
        finally:
            service.request_stop()
            async with asyncio.timeout(30):
                assert await task == 0

    return run
