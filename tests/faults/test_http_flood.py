"""An HTTP flood never stops the relay: slowloris clients beyond the descriptor limit.

The sidecar runs as a process with ``RLIMIT_NOFILE`` 256, against a private RabbitMQ node
(``tests/faults/private_node.py``: closing its connections touches nobody else's broker).
``FLOOD_CLIENTS`` slow clients, more than the process has descriptors, each send the start
of a request and a byte a second, and connect again whenever they are cut. While they do,
the test proves:

- the probes answer (or are refused at once): none hangs for ``PROBE_TIMEOUT_S``;
- the process's threads, descriptors and memory stay bounded;
- a backlog is relayed, none lost;
- the broker connection, closed with ``rabbitmqctl close_all_connections``, comes back and
  the relay resumes: the HTTP side leaves the reconnect its descriptor.

Before the HTTP side was bounded, a flood like this made a thread per client, spun the
accept loop on EMFILE and left no descriptor for the reconnect: the relay stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import resource
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from sidecar.observe.http_server import MAX_CONNECTIONS
from tests.brokers import module_node
from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    duplicates,
    eventually,
    make_ids,
    publish_ids,
    take_until,
)
from tests.faults.private_node import PrivateNode
from tests.support import Broker, open_broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from tests.faults.conftest import FaultRecord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DESCRIPTOR_LIMIT = 256  # the sidecar's RLIMIT_NOFILE, soft and hard
FLOOD_CLIENTS = 600  # more than twice the descriptors the sidecar has
TRICKLE_S = 1.0  # a slow client sends a byte this often
RECONNECT_S = 1.0  # and connects again this long after it was cut
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 10.0  # a probe that takes this long hung (the kubelet gives up after 1 s)
SAMPLE_EVERY_S = 0.25
PER_PHASE = 2000  # messages relayed before and after the connection is closed
PREFETCH = 64
RELAY_TIMEOUT_S = 90.0
# The HTTP side adds one thread; asyncio's resolver pool (used by a reconnect) at most
# min(32, cores + 4). A thread per connection would add hundreds.
THREAD_GROWTH_BOUND = 1 + min(32, (os.cpu_count() or 1) + 4)
# Descriptors: the HTTP side holds at most its cap, the listener and one being accepted.
DESCRIPTOR_GROWTH_BOUND = MAX_CONNECTIONS + 2
RSS_GROWTH_BOUND_MIB = 32.0  # a connection costs a few KiB; a thread each cost 61 MiB


# --- the private node and the sidecar on it ----------------------------------------------


@pytest.fixture(scope="module")
def node(broker_version: str) -> Iterator[PrivateNode]:
    """A RabbitMQ node of the version for this module alone."""
    with module_node(broker_version, "httpflood") as started:
        yield started


@pytest.fixture
async def node_broker(node: PrivateNode) -> AsyncIterator[Broker]:
    """A test client on the private node, with self-deleting topology."""
    async with open_broker(node.url) as client:
        yield client


@dataclass
class LimitedSidecar(Sidecar):
    """The sidecar process with RLIMIT_NOFILE set before it starts (soft and hard)."""

    descriptor_limit: int = DESCRIPTOR_LIMIT

    def launcher(self) -> list[str]:
        """``python -m sidecar``, with the descriptor limit set first in the same process."""
        limit = self.descriptor_limit
        code = (
            "import resource, runpy; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
            "runpy.run_module('sidecar', run_name='__main__')"
        )
        return [sys.executable, "-c", code]


@pytest.fixture
async def limited_sidecar(node: PrivateNode, tmp_path: Path) -> AsyncIterator[LimitedSidecar]:
    """A sidecar process on the private node, killed at teardown whatever happened."""
    process = LimitedSidecar(amqp_url=node.url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


# --- the flood ---------------------------------------------------------------------------

UNFINISHED = b"GET /readyz HTTP/1.1\r\nHost: flood\r\nX-Slow: "


@dataclass
class FloodStats:
    """What the slow clients saw."""

    connected: int = 0
    cut: int = 0  # closed or reset by the server
    answered: int = 0  # the server sent bytes (it never should: no request ends)
    refused: int = 0  # could not connect


async def slow_client(port: int, stats: FloodStats, stop: asyncio.Event) -> None:
    """Hold a connection open with a request that never ends; connect again when cut."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats.refused += 1
            await _pause(stop, RECONNECT_S)
            continue
        stats.connected += 1
        try:
            writer.write(UNFINISHED)
            while not stop.is_set():
                await writer.drain()
                try:
                    async with asyncio.timeout(TRICKLE_S):
                        data = await reader.read(1)
                except TimeoutError:
                    writer.write(b"a")
                    continue
                if data:
                    stats.answered += 1
                else:
                    stats.cut += 1
                break
        except OSError:
            stats.cut += 1
        finally:
            writer.close()
        await _pause(stop, RECONNECT_S)


async def _pause(stop: asyncio.Event, delay_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await stop.wait()


@contextlib.asynccontextmanager
async def flooding(port: int, clients: int, stats: FloodStats) -> AsyncIterator[None]:
    """Run ``clients`` slow clients against ``port`` for the block, counting in ``stats``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = clients + 256
    if soft < need:  # the test process's own descriptors, one per slow client
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tasks:
            for index in range(clients):
                tasks.create_task(slow_client(port, stats, stop), name=f"slow-{index}")
            try:
                yield
            finally:
                stop.set()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- what is watched while it runs -------------------------------------------------------


@dataclass
class ProbeLog:
    """Every probe made during the flood: the status (0: refused), or a hang."""

    statuses: list[int] = field(default_factory=list)
    slowest_s: float = 0.0
    hung: list[str] = field(default_factory=list)


def probe_once(port: int, path: str) -> tuple[int | None, float, str]:
    """GET ``path``: (status, seconds, "") answered; (0, s, why) refused; (None, s, why) hung."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=PROBE_TIMEOUT_S
        ) as reply:
            reply.read()
            return int(reply.status), time.monotonic() - started, ""
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), time.monotonic() - started, ""
    except TimeoutError as e:
        return None, time.monotonic() - started, repr(e)
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            return None, time.monotonic() - started, repr(e)
        return 0, time.monotonic() - started, repr(e)
    except (OSError, http.client.HTTPException) as e:
        return 0, time.monotonic() - started, repr(e)


async def probing(port: int, log: ProbeLog, stop: asyncio.Event) -> None:
    """Probe /healthz and /readyz in turn every PROBE_EVERY_S until ``stop``."""
    paths = ("/healthz", "/readyz")
    index = 0
    while not stop.is_set():
        path = paths[index % 2]
        index += 1
        status, seconds, why = await asyncio.to_thread(probe_once, port, path)
        log.slowest_s = max(log.slowest_s, seconds)
        if status is None:
            log.hung.append(f"{path}: {why} after {seconds:.1f}s")
        else:
            log.statuses.append(status)
        await _pause(stop, PROBE_EVERY_S)


@dataclass
class ProcessPeaks:
    """The sidecar's threads, descriptors and resident memory: at the start, at the peak."""

    pid: int
    threads: tuple[int, int] = (0, 0)
    descriptors: tuple[int, int] = (0, 0)
    rss_mib: tuple[float, float] = (0.0, 0.0)
    cpu_s: tuple[float, float] = (0.0, 0.0)
    samples: int = 0

    def sample(self) -> None:
        """Read /proc once; keep the first reading and the highest."""
        status = _status(self.pid)
        threads = int(status["Threads"])
        rss = int(status["VmRSS"].split()[0]) / 1024
        descriptors = len(os.listdir(f"/proc/{self.pid}/fd"))  # noqa: PTH208
        cpu = _cpu_s(self.pid)
        if self.samples == 0:
            self.threads, self.descriptors = (threads, threads), (descriptors, descriptors)
            self.rss_mib, self.cpu_s = (rss, rss), (cpu, cpu)
        else:
            self.threads = (self.threads[0], max(self.threads[1], threads))
            self.descriptors = (self.descriptors[0], max(self.descriptors[1], descriptors))
            self.rss_mib = (self.rss_mib[0], max(self.rss_mib[1], rss))
            self.cpu_s = (self.cpu_s[0], cpu)
        self.samples += 1


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:  # noqa: PTH123
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:  # noqa: PTH123
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def sampling(peaks: ProcessPeaks, stop: asyncio.Event) -> None:
    """Sample the process every SAMPLE_EVERY_S until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            peaks.sample()
        await _pause(stop, SAMPLE_EVERY_S)


@contextlib.asynccontextmanager
async def watching(port: int, peaks: ProcessPeaks, probes: ProbeLog) -> AsyncIterator[None]:
    """Probe and sample the process for the block."""
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(probing(port, probes, stop), name="probing")
        tasks.create_task(sampling(peaks, stop), name="sampling")
        try:
            yield
        finally:
            stop.set()


# --- the test ----------------------------------------------------------------------------


async def test_an_http_flood_beyond_the_descriptor_limit_never_stops_the_relay(
    node: PrivateNode,
    node_broker: Broker,
    limited_sidecar: LimitedSidecar,
    record: Callable[..., FaultRecord],
) -> None:
    """Slowloris clients beyond RLIMIT_NOFILE: probes answer, the relay goes on and reconnects."""
    broker, sidecar = node_broker, limited_sidecar
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "flood")
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=PREFETCH))
    await sidecar.start()
    assert sidecar.process is not None
    peaks, probes = ProcessPeaks(pid=sidecar.process.pid), ProbeLog()
    peaks.sample()
    flood = FloodStats()

    def context() -> str:
        return f"{flood}\n{peaks}\nprobes hung: {probes.hung[:5]}\n{sidecar.output()}"

    before_ids, after_ids = make_ids("before", PER_PHASE), make_ids("after", PER_PHASE)
    taken: list[str] = []
    async with (
        flooding(sidecar.port, FLOOD_CLIENTS, flood),
        watching(sidecar.port, peaks, probes),
    ):
        # Full pressure first: more connections made than the sidecar has descriptors.
        await eventually(
            lambda: flood.connected > DESCRIPTOR_LIMIT,
            timeout_s=RELAY_TIMEOUT_S,
            what=f"more than {DESCRIPTOR_LIMIT} slow clients connected",
            context=context,
        )
        flood_started = time.monotonic()
        await publish_ids(broker, flow.staging, before_ids)
        taken += await take_until(
            broker, flow.target, before_ids, timeout_s=RELAY_TIMEOUT_S, context=context
        )
        relayed_s = time.monotonic() - flood_started
        cut_at = time.monotonic()
        await node.ctl.close_all_connections()
        await broker.reconnect()  # the test client was closed too
        await publish_ids(broker, flow.staging, after_ids)
        taken += await take_until(
            broker, flow.target, after_ids, timeout_s=RELAY_TIMEOUT_S, context=context
        )
        resumed_s = time.monotonic() - cut_at
        flood_s = time.monotonic() - flood_started
    peaks.sample()

    assert sidecar.is_running(), sidecar.output()
    assert not probes.hung, f"probes hung during the flood: {probes.hung[:5]}\n{context()}"
    assert probes.statuses, "no probe finished during the flood"
    assert flood.cut > 0, f"the server never cut a slow client: {flood}"
    assert flood.answered == 0, f"a request that never ended was answered: {flood}"
    threads, descriptors, rss = peaks.threads, peaks.descriptors, peaks.rss_mib
    assert threads[1] - threads[0] <= THREAD_GROWTH_BOUND, f"threads {threads}"
    assert descriptors[1] - descriptors[0] <= DESCRIPTOR_GROWTH_BOUND, f"fds {descriptors}"
    assert descriptors[1] < DESCRIPTOR_LIMIT, f"descriptors ran out: {descriptors}"
    assert rss[1] - rss[0] <= RSS_GROWTH_BOUND_MIB, f"RSS MiB {rss}"

    # After the flood: nothing lost, the reconnect counted, the probes say all is well.
    assert set(before_ids + after_ids) <= set(taken)
    doubled = duplicates(taken)
    assert doubled <= PREFETCH, f"{doubled} duplicates, more than one prefetch window"
    await sidecar.wait_ready()
    assert await sidecar.metric("acemq_sidecar_reconnects_total") >= 1

    answered = sum(1 for status in probes.statuses if status)
    cpu = (peaks.cpu_s[1] - peaks.cpu_s[0]) / flood_s * 100
    record(
        messages=2 * PER_PHASE,
        faults=1,
        duplicates=doubled,
        duplicate_bound=PREFETCH,
        recovery_s=(resumed_s,),
        note=(
            f"{FLOOD_CLIENTS} slow clients on RLIMIT_NOFILE {DESCRIPTOR_LIMIT} for {flood_s:.0f}s:"
            f" {flood.connected} connections, {flood.cut} cut, {flood.refused} refused;"
            f" probes {answered} of {len(probes.statuses)} answered, slowest"
            f" {probes.slowest_s:.2f}s, none hung; threads {threads[0]}->{threads[1]},"
            f" fds {descriptors[0]}->{descriptors[1]}, RSS {rss[0]:.0f}->{rss[1]:.0f} MiB,"
            f" sidecar CPU {cpu:.0f}%; the first {PER_PHASE} relayed {relayed_s:.1f}s into the"
            f" flood"
        ),
    )
