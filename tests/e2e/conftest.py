"""Fixtures for the process-level tests: the sidecar as a subprocess on a generated route map.

``sidecar`` writes a route map for the test's own topology to ``tmp_path``, starts
``python -m sidecar run --config FILE`` with stdout and stderr captured to files there,
waits for ``/readyz`` and kills whatever is still running at teardown. ``broker`` is the
shared test client (tests/conftest.py) made to survive ``rabbitmqctl close_all_connections``.

Every wait polls with a deadline; a failed wait shows the process's output.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiormq
import pytest
import yaml
from pamqp.commands import Basic
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
    from pathlib import Path

READY_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 2.0
POLL_S = 0.05
LOG_TAIL_LINES = 60
ID_HEADER = "x-acemq-id"


# --- waiting -------------------------------------------------------------------------------


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float,
    what: str,
    context: Callable[[], str] = str,
) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` and showing ``context()``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g}s: {what}\n{context()}")
        await asyncio.sleep(POLL_S)


# --- the test client and topology ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flow:
    """One route's topology: staging queue -> target topic exchange -> target queue ("#")."""

    name: str
    staging: str
    exchange: str
    target: str

    def route(self) -> dict[str, Any]:
        """Return this flow as a route-map entry that keeps the original routing key."""
        return {
            "name": self.name,
            "from": self.staging,
            "to": {"exchange": self.exchange, "routing_key": "keep"},
        }


async def declare_flow(broker: Broker, name: str, *, with_exchange: bool = True) -> Flow:
    """Declare a staging queue, a target queue and (unless told not to) the target exchange."""
    staging = await broker.queue(f"{name}.staging")
    target = await broker.queue(f"{name}.target")
    exchange = broker.name(f"{name}.exchange")
    if with_exchange:
        await declare_target(broker, exchange=exchange, target=target)
    return Flow(name=name, staging=staging, exchange=exchange, target=target)


async def declare_target(broker: Broker, *, exchange: str, target: str) -> None:
    """Declare a flow's topic exchange and bind its target queue to everything on it."""
    await broker.channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    if exchange not in broker.exchanges:
        broker.exchanges.append(exchange)
    await broker.bind(target, exchange)


async def declare_quarantine(broker: Broker) -> tuple[str, str]:
    """Declare the quarantine fanout exchange with a queue bound; return both names."""
    exchange = await broker.exchange("quarantine", kind="fanout")
    queue = await broker.queue("quarantine")
    await broker.bind(queue, exchange, routing_key="")
    return exchange, queue


# --- messages ------------------------------------------------------------------------------


def make_ids(prefix: str, count: int) -> list[str]:
    """Return ``count`` distinct message ids."""
    return [f"{prefix}-{index:05d}" for index in range(count)]


async def publish_ids(broker: Broker, queue: str, ids: Iterable[str], *, batch: int = 200) -> None:
    """Publish one confirmed message per id to a queue: ``x-acemq-id`` and ``message_id``."""
    pending = list(ids)
    for start in range(0, len(pending), batch):
        await asyncio.gather(
            *(
                broker.publish(queue, headers={ID_HEADER: id_}, message_id=id_)
                for id_ in pending[start : start + batch]
            )
        )


def id_of(message: aiormq.abc.DeliveredMessage) -> str:
    """Return a relayed message's ``x-acemq-id``, checking ``message_id`` agrees."""
    properties = message.header.properties
    id_ = str((properties.headers or {}).get(ID_HEADER))
    assert properties.message_id == id_, f"message_id {properties.message_id!r} != {id_!r}"
    return id_


async def take_ids(broker: Broker, queue: str) -> list[str]:
    """Get (and ack) every message a queue holds now; return their ids, repeats included."""
    ids: list[str] = []
    while True:
        message = await broker.channel.basic_get(queue, no_ack=True)
        if not isinstance(message.delivery, Basic.GetOk):
            return ids
        ids.append(id_of(message))


async def take_until(
    broker: Broker,
    queue: str,
    expected: Iterable[str],
    *,
    timeout_s: float,
    context: Callable[[], str] = str,
) -> list[str]:
    """Keep taking from a queue until every expected id came; return all ids taken."""
    wanted = set(expected)
    taken: list[str] = []

    async def complete() -> bool:
        taken.extend(await take_ids(broker, queue))
        return wanted <= set(taken)

    def missing() -> str:
        gone = sorted(wanted - set(taken))
        return f"{len(gone)} of {len(wanted)} missing, e.g. {gone[:5]}\n{context()}"

    await eventually(complete, timeout_s=timeout_s, what=f"every id on {queue}", context=missing)
    return taken


def duplicates(ids: Iterable[str]) -> int:
    """Count the copies beyond the first of every id."""
    return sum(count - 1 for count in Counter(ids).values())


# --- the process ---------------------------------------------------------------------------


def free_port() -> int:
    """Return a localhost TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(none)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty)"


@dataclass
class Sidecar:
    """One sidecar process (restartable) on a route map file in the test's tmp_path."""

    amqp_url: str
    workdir: Path
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    runs: int = 0

    @property
    def config(self) -> Path:
        """The route map file the process reads (and re-reads on SIGHUP)."""
        return self.workdir / "routes.yaml"

    def route_map(
        self,
        *,
        quarantine: str,
        flows: Iterable[Flow],
        prefetch: int = 64,
        shutdown_grace_s: float = 10.0,
    ) -> dict[str, Any]:
        """Return a route map for the test's topology, listening on this sidecar's port."""
        return {
            "broker": {"url": self.amqp_url, "prefetch": prefetch, "connect_timeout_s": 5},
            "http": {"listen": f"127.0.0.1:{self.port}"},
            "mode": "enforce",
            "quarantine": {"exchange": quarantine},
            "shutdown_grace_s": shutdown_grace_s,
            "routes": [flow.route() for flow in flows],
        }

    def write(self, route_map: dict[str, Any] | str, *, keep_stamp: bool = False) -> None:
        """Write the route map file (a mapping is dumped as YAML).

        ``keep_stamp`` keeps the file's size and modification time, padding with a comment,
        so that the sidecar's file watcher (which compares both) cannot see the change and
        only a SIGHUP can make it reload.
        """
        text = route_map if isinstance(route_map, str) else yaml.safe_dump(route_map)
        if not keep_stamp:
            self.config.write_text(text, encoding="utf-8")
            return
        before = self.config.stat()
        padding = before.st_size - len(text.encode()) - 2
        assert padding >= 0, "write the first version with padding (keep_stamp needs room)"
        self.config.write_text(f"{text}#{'x' * padding}\n", encoding="utf-8")
        os.utime(self.config, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = self.config.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    def pad(self, size: int = 8192) -> None:
        """Pad the route map file with a comment to ``size`` bytes (room for ``keep_stamp``)."""
        text = self.config.read_text(encoding="utf-8")
        self.config.write_text(
            f"{text}#{'x' * (size - len(text.encode()) - 2)}\n", encoding="utf-8"
        )

    def launcher(self) -> list[str]:
        """The command that starts the sidecar's command line: ``python -m sidecar``."""
        return [sys.executable, "-m", "sidecar"]

    async def start(self, *, wait_ready: bool = True) -> None:
        """Start ``python -m sidecar run --config FILE``; wait for /readyz 200 unless told not."""
        assert not self.is_running(), "already running"
        self.runs += 1
        with (
            (self.workdir / f"stdout.{self.runs}.log").open("wb") as stdout,
            (self.workdir / f"stderr.{self.runs}.log").open("wb") as stderr,
        ):
            self.process = await asyncio.create_subprocess_exec(
                *self.launcher(),
                "run",
                "--config",
                str(self.config),
                cwd=REPO,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env={**os.environ, "ACEMQ_LOG_LEVEL": "INFO"},
            )
        if wait_ready:
            await self.wait_ready()

    def stderr(self) -> str:
        """What the latest run wrote to stderr."""
        return (self.workdir / f"stderr.{self.runs}.log").read_text(errors="replace")

    def output(self) -> str:
        """The tails of every run's stdout and stderr, and the exit status, for a failure."""
        parts = []
        for run in range(1, self.runs + 1):
            parts.append(f"--- run {run} stdout ---\n{_tail(self.workdir / f'stdout.{run}.log')}")
            parts.append(f"--- run {run} stderr ---\n{_tail(self.workdir / f'stderr.{run}.log')}")
        status = None if self.process is None else self.process.returncode
        parts.append(f"--- exit status of the latest run: {status} ---")
        return "\n".join(parts)

    def is_running(self) -> bool:
        """Whether the latest run is still alive."""
        return self.process is not None and self.process.returncode is None

    def send(self, signum: signal.Signals) -> None:
        """Send a signal to the running process."""
        assert self.is_running(), f"not running, cannot send {signum.name}\n{self.output()}"
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait_exit(self, *, timeout_s: float) -> int:
        """Wait for the process to exit; return its status (fail if it does not exit)."""
        assert self.process is not None
        process = self.process
        await eventually(
            lambda: process.returncode is not None,
            timeout_s=timeout_s,
            what="the sidecar to exit",
            context=self.output,
        )
        assert process.returncode is not None
        return process.returncode

    async def kill(self) -> None:
        """SIGKILL the process if it runs, and reap it."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            async with asyncio.timeout(10):
                await self.process.wait()

    async def get(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the probe port; return (status, body), (0, reason) if unreachable."""
        return await asyncio.to_thread(self._get, path)

    def _get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, repr(e)

    async def wait_ready(self, *, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for /readyz 200; fail early if the process exits."""
        last: tuple[int, str] = (0, "")

        async def ready() -> bool:
            nonlocal last
            assert self.is_running(), f"the sidecar exited while starting\n{self.output()}"
            last = await self.get("/readyz")
            return last[0] == 200

        await eventually(
            ready,
            timeout_s=timeout_s,
            what="GET /readyz == 200",
            context=lambda: f"last /readyz: {last}\n{self.output()}",
        )

    async def metrics_text(self) -> str:
        """The /metrics exposition text."""
        status, body = await self.get("/metrics")
        assert status == 200, f"/metrics answered {status}: {body}\n{self.output()}"
        return body

    async def metric(self, name: str, **labels: str) -> float:
        """Return one sample's value from /metrics (the sum over samples matching ``labels``)."""
        text = await self.metrics_text()
        values = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        ]
        assert values, f"no sample {name}{labels} in /metrics:\n{text}"
        return float(sum(values))


@pytest.fixture
async def sidecar(amqp_url: str, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar process on a route map in tmp_path, killed at teardown whatever happened."""
    process = Sidecar(amqp_url=amqp_url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()
