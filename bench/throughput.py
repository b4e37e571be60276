"""Throughput of the sidecar against a raw aiormq relay and the shovel, in one run.

Usage: python bench/throughput.py [N] [--prefetch P]
Needs the local broker with rabbitmq_shovel enabled (scripts/broker --plugins).

Each path drains N 1 KiB messages (a realistic AceMQ header set; one in four needs
repair) from a full queue to a bound target queue, timed from the moment its consumer
starts until the target holds N and the source is empty. Prints msg/s for each path, the
sidecar's ratio to the others, its p50/p99 latency at a fixed rate, and its peak RSS.
Compare ratios within one run: the broker shares the cores with the code under test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import aiormq
import aiormq.abc
from pamqp.commands import Basic

REPO = Path(__file__).resolve().parents[1]
URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
BODY = os.urandom(512).hex().encode()  # 1 KiB


def headers_for(i: int) -> dict[str, object]:
    """A typical envelope; every fourth message carries .NET/Go drift the sidecar repairs."""
    headers: dict[str, object] = {
        "x-acemq-id": f"m-{i}",
        "x-acemq-type": "order.placed",
        "x-acemq-version": 1,
        "x-acemq-correlation": f"c-{i}",
        "x-acemq-attempt": 1,
        "x-acemq-first-seen": 1_764_400_000_000,
        "x-acemq-origin": "checkout@app-7",
        "x-tenant": "acme",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    if i % 4 == 0:
        headers.update({"x-acemq-attempt": " 2 ", "x-acemq-causation": "", "x-acemq-first-seen": 0})
    return headers


async def fill(channel: aiormq.abc.AbstractChannel, queue: str, n: int) -> None:
    """Publish n messages with confirms, in windows of 1000."""
    window = []
    for i in range(n):
        properties = Basic.Properties(headers=headers_for(i), delivery_mode=2, message_id=f"m-{i}")  # type: ignore[arg-type]
        window.append(channel.basic_publish(BODY, routing_key=queue, properties=properties))
        if len(window) >= 1000:
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)


async def depth(channel: aiormq.abc.AbstractChannel, queue: str) -> int:
    """Ready messages in a queue."""
    ok = await channel.queue_declare(queue, passive=True)
    return int(ok.message_count or 0)


async def wait_drained(
    channel: aiormq.abc.AbstractChannel, source: str, target: str, n: int
) -> None:
    """Return once the target holds n and the source is empty."""
    while await depth(channel, target) < n or await depth(channel, source) > 0:
        await asyncio.sleep(0.02)


async def raw_relay(
    connection: aiormq.abc.AbstractConnection, source: str, exchange: str, n: int, prefetch: int
) -> None:
    """The baseline: consume, publish with confirm, ack; one task per message; no contract."""
    channel = await connection.channel(publisher_confirms=True)
    await channel.basic_qos(prefetch_count=prefetch)
    done = asyncio.Event()
    count = 0

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        nonlocal count
        await channel.basic_publish(
            message.body,
            exchange=exchange,
            routing_key=message.delivery.routing_key or "",
            properties=message.header.properties,
        )
        await channel.basic_ack(message.delivery.delivery_tag)  # type: ignore[arg-type]
        count += 1
        if count >= n:
            done.set()

    await channel.basic_consume(source, on_message)
    await done.wait()
    await channel.close()


async def latency(
    connection: aiormq.abc.AbstractConnection, source: str, target: str, *, rate: int, seconds: int
) -> tuple[float, float]:
    """Publish at a fixed rate through the running sidecar; return p50 and p99 in ms.

    The latency is publish -> arrival on the target queue, so it includes the broker's two
    hops and the sidecar's confirm round trip.
    """
    publisher = await connection.channel(publisher_confirms=False)
    consumer = await connection.channel()
    samples: list[float] = []
    total = rate * seconds
    done = asyncio.Event()

    def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        sent = (message.header.properties.headers or {}).get("x-bench-sent-ns")
        if isinstance(sent, int):
            samples.append((time.perf_counter_ns() - sent) / 1e6)
        if len(samples) >= total:
            done.set()

    await consumer.basic_consume(target, on_message, no_ack=True)
    start = time.perf_counter()
    for i in range(total):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        headers = {**headers_for(i), "x-bench-sent-ns": time.perf_counter_ns()}
        properties = Basic.Properties(headers=headers, delivery_mode=2, message_id=f"l-{i}")  # type: ignore[arg-type]
        await publisher.basic_publish(BODY, routing_key=source, properties=properties)
    async with asyncio.timeout(30):
        await done.wait()
    await consumer.close()
    await publisher.close()
    samples.sort()
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99)]


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


async def start_sidecar(
    source: str, exchange: str, quarantine: str, prefetch: int
) -> subprocess.Popen[bytes]:
    """Start the sidecar process on a full queue; return once its route consumes."""
    port = free_port()
    config = (
        f"broker: {{url: '{URL}', prefetch: {prefetch}}}\n"
        f"http: {{listen: '127.0.0.1:{port}'}}\n"
        f"quarantine: {{exchange: {quarantine}}}\n"
        "routes:\n"
        f"  - {{name: bench, from: {source}, to: {{exchange: {exchange}, routing_key: keep}}}}\n"
    )
    path = Path(tempfile.mkdtemp()) / "bench.yaml"
    path.write_text(config)
    env = {**os.environ, "ACEMQ_LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--config", str(path)], env=env
    )
    while True:
        if process.poll() is not None:
            sys.exit(f"the sidecar exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return process
        except OSError:
            await asyncio.sleep(0.01)


async def main() -> None:
    """Run the three paths and print the figures as JSON and a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", nargs="?", type=int, default=20_000)
    parser.add_argument("--prefetch", type=int, default=512)
    parser.add_argument("--rate", type=int, default=500, help="msg/s for the latency phase")
    args = parser.parse_args()
    n, prefetch = args.n, args.prefetch
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    run = uuid.uuid4().hex[:6]
    names = {k: f"bench.{run}.{k}" for k in ("a", "b", "c", "d", "e", "f", "x", "y", "q")}
    for key in "abcdefq":
        await channel.queue_declare(names[key], durable=True)
    for key, queue in (("x", "b"), ("y", "d"), ("q", "q")):
        await channel.exchange_declare(names[key], exchange_type="fanout", durable=True)
        await channel.queue_bind(names[queue], names[key], routing_key="")
    results: dict[str, float] = {"n": n, "prefetch": prefetch}
    try:
        # 1. the sidecar (a separate process, as deployed)
        await fill(channel, names["a"], n)
        process = await start_sidecar(names["a"], names["x"], names["q"], prefetch)
        t0 = time.perf_counter()
        await wait_drained(channel, names["a"], names["b"], n)
        results["sidecar_msg_s"] = n / (time.perf_counter() - t0)
        await channel.queue_purge(names["b"])  # the latency phase reads the target afresh
        p50, p99 = await latency(connection, names["a"], names["b"], rate=args.rate, seconds=10)
        results["latency_rate_msg_s"], results["latency_p50_ms"], results["latency_p99_ms"] = (
            args.rate,
            p50,
            p99,
        )
        results["sidecar_peak_rss_mib"] = round(peak_rss_mib(process.pid), 1)
        process.terminate()
        process.wait(timeout=30)
        # 2. a raw aiormq relay (no contract, no codec hook), in this process
        await fill(channel, names["c"], n)
        t0 = time.perf_counter()
        await raw_relay(connection, names["c"], names["y"], n, prefetch)
        await wait_drained(channel, names["c"], names["d"], n)
        results["raw_relay_msg_s"] = n / (time.perf_counter() - t0)
        # 3. the shovel, ack-mode on-confirm
        await fill(channel, names["e"], n)
        spec = {
            "src-protocol": "amqp091",
            "src-uri": "amqp://",
            "src-queue": names["e"],
            "dest-protocol": "amqp091",
            "dest-uri": "amqp://",
            "dest-queue": names["f"],
            "ack-mode": "on-confirm",
            "src-prefetch-count": prefetch,
        }
        t0 = time.perf_counter()
        subprocess.run(
            ["rabbitmqctl", "set_parameter", "shovel", f"sh-{run}", json.dumps(spec)],
            check=True,
            capture_output=True,
        )
        await wait_drained(channel, names["e"], names["f"], n)
        results["shovel_msg_s"] = n / (time.perf_counter() - t0)
        subprocess.run(
            ["rabbitmqctl", "clear_parameter", "shovel", f"sh-{run}"],
            capture_output=True,
            check=False,
        )
    finally:
        for key in "abcdefq":
            await channel.queue_delete(names[key])
        for key in "xyq":
            await channel.exchange_delete(names[key])
        await connection.close()
    results["sidecar_vs_raw_relay"] = results["sidecar_msg_s"] / results["raw_relay_msg_s"]
    results["sidecar_vs_shovel"] = results["sidecar_msg_s"] / results["shovel_msg_s"]
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))
    for key in ("sidecar_msg_s", "raw_relay_msg_s", "shovel_msg_s"):
        print(f"{key.removesuffix('_msg_s'):10} {results[key]:8.0f} msg/s")
    print(
        f"sidecar / raw relay {results['sidecar_vs_raw_relay']:.2f}"
        f"   sidecar / shovel {results['sidecar_vs_shovel']:.2f}"
    )
    print(
        f"sidecar latency at {args.rate} msg/s: p50 {results['latency_p50_ms']:.1f} ms,"
        f" p99 {results['latency_p99_ms']:.1f} ms"
    )
    print(f"sidecar peak RSS {results['sidecar_peak_rss_mib']} MiB")


if __name__ == "__main__":
    asyncio.run(main())
