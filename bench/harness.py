"""What the throughput and latency benchmarks share: messages, queues, the sidecar process.

The message mix: 1 KiB bodies with a realistic AceMQ header set; one in five needs repair
(.NET/Go drift), one in fifty goes to quarantine: on the benchmark's ``acemq`` route
(unknown reserved names are stripped there, not refused) that is an ``x-acemq-id`` of 300
bytes, which no ``message_id`` can carry.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiormq
import aiormq.abc
from pamqp.commands import Basic

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
BODY = os.urandom(512).hex().encode()  # 1 KiB
REPAIR_EVERY = 5  # 20% need repair
REJECT_EVERY = 50  # 2% are rejected


# Set by a bench that traces (paired.py --trace-ratio R): each message then carries a trace
# of its own, flagged sampled on R of them, as producers that sample at R send them.
PRODUCERS_SAMPLE: list[float] = []


def traceparent_for(i: int) -> str:
    """Message i's W3C traceparent: one producer's trace for all, or one each (see above)."""
    if not PRODUCERS_SAMPLE:
        return "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    trace_id = (i * 0x9E3779B97F4A7C15F39CC0605CEDC835 + 1) % 2**128
    sampled = (i * 2_654_435_761) % 10_000 < PRODUCERS_SAMPLE[0] * 10_000
    return f"00-{trace_id:032x}-{i + 1:016x}-{'01' if sampled else '00'}"


def headers_for(i: int) -> dict[str, object]:
    """A typical envelope; every fifth needs repair, every fiftieth is rejected."""
    headers: dict[str, object] = {
        "x-acemq-id": f"m-{i}",
        "x-acemq-type": "order.placed",
        "x-acemq-version": 1,
        "x-acemq-correlation": f"c-{i}",
        "x-acemq-attempt": 1,
        "x-acemq-first-seen": 1_764_400_000_000,
        "x-acemq-origin": "checkout@app-7",
        "x-tenant": "acme",
        "traceparent": traceparent_for(i),
    }
    if i % REJECT_EVERY == 1:
        headers["x-acemq-id"] = f"m-{i}-" + "x" * 300
    elif i % REPAIR_EVERY == 0:
        headers.update({"x-acemq-attempt": " 2 ", "x-acemq-causation": "", "x-acemq-first-seen": 0})
    return headers


def expected_split(n: int) -> tuple[int, int]:
    """How many of messages 0..n-1 reach the target and how many quarantine."""
    rejected = sum(1 for i in range(n) if i % REJECT_EVERY == 1)
    return n - rejected, rejected


def properties_for(i: int, **headers: object) -> Basic.Properties:
    """Persistent, with a message id, as AceMQ libraries publish."""
    return Basic.Properties(  # type: ignore[arg-type]
        headers={**headers_for(i), **headers}, delivery_mode=2, message_id=f"m-{i}"
    )


async def fill(channel: aiormq.abc.AbstractChannel, queue: str, n: int) -> None:
    """Publish n messages with confirms, in windows of 1000."""
    window = []
    for i in range(n):
        window.append(channel.basic_publish(BODY, routing_key=queue, properties=properties_for(i)))
        if len(window) >= 1000:
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)


async def depth(channel: aiormq.abc.AbstractChannel, queue: str) -> int:
    """Ready messages in a queue."""
    ok = await channel.queue_declare(queue, passive=True)
    return int(ok.message_count or 0)


async def consumer_attached(channel: aiormq.abc.AbstractChannel, queue: str) -> float:
    """Return the moment a consumer appears on the queue (polled every 5 ms)."""
    while True:
        ok = await channel.queue_declare(queue, passive=True)
        if ok.consumer_count:
            return time.perf_counter()
        await asyncio.sleep(0.005)


async def drained(
    channel: aiormq.abc.AbstractChannel, source: str, targets: dict[str, int]
) -> float:
    """Return the moment each target holds its count and the source is empty."""
    while True:
        counts = [await depth(channel, queue) for queue in targets]
        if counts >= list(targets.values()) and await depth(channel, source) == 0:
            return time.perf_counter()
        await asyncio.sleep(0.01)


@dataclass(frozen=True)
class Topology:
    """A staging queue, a target exchange bound to a queue, and a quarantine the same way."""

    staging: str
    exchange: str
    target: str
    quarantine_exchange: str
    quarantine: str


@asynccontextmanager
async def topology(channel: aiormq.abc.AbstractChannel, label: str) -> AsyncIterator[Topology]:
    """Declare a fresh topology; delete it afterwards."""
    run = f"bench.{uuid.uuid4().hex[:6]}.{label}"
    topo = Topology(f"{run}.staging", f"{run}.x", f"{run}.target", f"{run}.qx", f"{run}.q")
    for queue in (topo.staging, topo.target, topo.quarantine):
        await channel.queue_declare(queue, durable=True)
    for exchange, queue in (
        (topo.exchange, topo.target),
        (topo.quarantine_exchange, topo.quarantine),
    ):
        await channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
        await channel.queue_bind(queue, exchange, routing_key="")
    try:
        yield topo
    finally:
        for queue in (topo.staging, topo.target, topo.quarantine):
            await channel.queue_delete(queue)
        for exchange in (topo.exchange, topo.quarantine_exchange):
            await channel.exchange_delete(exchange)


def free_port() -> int:
    """A free localhost port for the sidecar's HTTP server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def route_map(topo: Topology, *, port: int, prefetch: int | None, budget: int | None = None) -> str:
    """A route map shaped as config/example.yaml: defaults but the URL, quarantine and route."""
    settings = [f"url: '{URL}'"]
    settings += [f"prefetch: {prefetch}"] if prefetch else []
    settings += [f"max_in_flight_bytes: {budget}"] if budget else []
    broker = "{" + ", ".join(settings) + "}"
    return (
        f"broker: {broker}\n"
        f"http: {{listen: '127.0.0.1:{port}'}}\n"
        f"quarantine: {{exchange: {topo.quarantine_exchange}}}\n"
        "routes:\n"
        f"  - name: bench\n"
        f"    from: {topo.staging}\n"
        f"    to: {{exchange: {topo.exchange}, routing_key: keep}}\n"
        f"    publishers: acemq\n"
    )


@asynccontextmanager
async def sidecar(
    topo: Topology,
    *,
    prefetch: int | None = None,
    cpus: str | None = None,
    pythonpath: str | None = None,
    budget: int | None = None,
    executable: Path | None = None,
) -> AsyncIterator[int]:
    """Run ``acemq-sidecar run`` (as users run it) on the topology; yield its pid.

    ``cpus``: a ``taskset -c`` core list to start it on (its threads inherit it).
    ``pythonpath``: a source tree whose ``sidecar`` package runs instead of this one's.
    ``budget``: ``broker.max_in_flight_bytes`` (default: the sidecar's).
    ``executable``: another build's ``acemq-sidecar`` (bench/ab.py); this venv's by default.
    """
    port = free_port()
    path = Path(tempfile.mkdtemp()) / "bench.yaml"
    path.write_text(route_map(topo, port=port, prefetch=prefetch, budget=budget))
    executable = executable or Path(sys.executable).with_name("acemq-sidecar")
    command = [str(executable), "run", "--config", str(path)]
    env = {**os.environ, "ACEMQ_LOG_LEVEL": "WARNING"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]  # taskset execs the command: same pid
    process = subprocess.Popen(command, env=env)
    try:
        yield process.pid
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.returncode != 0:
            sys.exit(f"the sidecar exited with status {process.returncode}")


SHOVEL_PREFETCH = 512


@asynccontextmanager
async def shovel(topo: Topology) -> AsyncIterator[None]:
    """Run the shovel plugin (ack-mode on-confirm) from the staging queue to the target.

    The parameter is set in a thread while the caller waits for its consumer to attach
    (rabbitmqctl takes a second or two), and cleared afterwards.
    """
    name = f"bench-{uuid.uuid4().hex[:6]}"
    spec = {
        "src-protocol": "amqp091",
        "src-uri": "amqp://",
        "src-queue": topo.staging,
        "dest-protocol": "amqp091",
        "dest-uri": "amqp://",
        "dest-exchange": topo.exchange,
        "ack-mode": "on-confirm",
        "src-prefetch-count": SHOVEL_PREFETCH,
    }
    setting = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            ["rabbitmqctl", "set_parameter", "shovel", name, json.dumps(spec)],
            check=True,
            capture_output=True,
        )
    )
    try:
        yield
        await setting
    finally:
        subprocess.run(
            ["rabbitmqctl", "clear_parameter", "shovel", name], capture_output=True, check=False
        )
