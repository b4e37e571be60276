"""The README's demo: the sidecar relaying sample messages on the local broker.

Declares a demo topology, starts `acemq-sidecar run --config config/example.yaml` as a
process, publishes samples as the five AceMQ libraries and a plain application would,
then prints what arrived on the target queues and in quarantine, and the metrics.
Uses a plain AMQP client (aiormq), like any application would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiormq
from pamqp.commands import Basic

REPO = Path(__file__).resolve().parents[1]
URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
OUT = {
    "demo.out.orders": ("demo.orders", "order.#"),
    "demo.out.invoices": ("demo.invoices", "#"),
    "demo.out.quarantine": ("demo.quarantine", ""),
}
STAGING = ("demo.staging.orders", "demo.staging.invoices")
FIRST_SEEN = 1_767_323_045_678

# (routing key on demo.staging, properties, headers, what it shows); the staging exchange
# routes order.# and refund.# to demo.staging.orders and invoice.# to demo.staging.invoices.
SAMPLES: list[tuple[str, dict[str, object], dict[str, object], str]] = [
    (
        "order.placed",
        {"message_id": "ord-1"},
        {
            "x-acemq-id": "ord-1",
            "x-acemq-type": "order.placed",
            "x-acemq-version": 2,
            "x-acemq-correlation": "ord-1",
            "x-acemq-attempt": 1,
            "x-acemq-first-seen": FIRST_SEEN,
            "x-acemq-origin": "checkout@app-7",
            "x-tenant": "acme",
        },
        "Java: canonical envelope",
    ),
    (
        "order.paid",
        {"message_id": "ord-2"},
        {
            "x-acemq-id": "",
            "x-acemq-type": "order.paid",
            "x-acemq-version": " 3 ",
            "x-acemq-attempt": 0,
            "x-acemq-first-seen": 0,
            "x-acemq-causation": "",
        },
        ".NET/Go drift: empty id, text version, attempt 0, first-seen 0",
    ),
    (
        "order.placed",
        {"message_id": "ord-3"},
        {
            "x-acemq-id": "ord-3",
            "x-acemq-type": "order.placed",
            "x-acemq-version": 1,
            "x-acemq-correlation": "ord-3",
            "x-acemq-attempt": 1,
            "x-acemq-first-seen": FIRST_SEEN,
            "x-acemq-replayed-from": "orders.dlq",
            "x-acemq-replayed-at": "2026-02-03T04:05:06.7891234+00:00",
            "x-acemq-replay-count": 2,
        },
        ".NET 0.5.0 replay: legacy x-acemq-replayed-* stamps",
    ),
    (
        "order.shipped",
        {"message_id": "ord-4"},
        {"x-acemq-id": "ord-4", "x-acemq-zone": "eu-west", "x-tenant": "acme"},
        "a newer library's x-acemq-zone on an acemq route",
    ),
    (
        "refund.issued",
        {"message_id": "ord-5"},
        {"x-acemq-id": "ord-5"},
        "a routing key the target exchange cannot route",
    ),
    (
        "invoice.issued",
        {
            "message_id": "inv-1",
            "correlation_id": "cart-9",
            "message_type": "invoice.issued",
            "app_id": "billing",
        },
        {"x-customer": "c-17"},
        "plain app: envelope filled from AMQP properties",
    ),
    (
        "invoice.voided",
        {"message_id": "inv-2"},
        {"x-acemq-tenant": "acme"},
        "plain app sets a reserved header on an apps route",
    ),
]
SHOWN = (
    "x-acemq-id",
    "x-acemq-type",
    "x-acemq-version",
    "x-acemq-attempt",
    "x-acemq-first-seen",
    "x-acemq-origin",
    "acemq-replayed-at",
    "acemq-replay-count",
)


def free_port() -> int:
    """Pick a free local port for the sidecar's HTTP server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def declare(channel: aiormq.abc.AbstractChannel) -> None:
    """Declare the demo topology afresh (the platform's job, not the sidecar's)."""
    for exchange, kind in (
        ("demo.staging", "topic"),
        ("demo.orders", "topic"),
        ("demo.invoices", "topic"),
        ("demo.quarantine", "fanout"),
    ):
        await channel.exchange_declare(exchange, exchange_type=kind, durable=True)
    for queue in (*STAGING, *OUT):
        await channel.queue_delete(queue)  # drops old messages and bindings
        await channel.queue_declare(queue, durable=True)
    for queue, (exchange, key) in OUT.items():
        await channel.queue_bind(queue, exchange, routing_key=key)
    await channel.queue_bind("demo.staging.orders", "demo.staging", routing_key="order.#")
    await channel.queue_bind("demo.staging.orders", "demo.staging", routing_key="refund.#")
    await channel.queue_bind("demo.staging.invoices", "demo.staging", routing_key="invoice.#")


def wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    """Wait for /readyz to answer 200."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the sidecar exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("the sidecar did not become ready in 30 s")


async def collect(
    channel: aiormq.abc.AbstractChannel, want: int
) -> dict[str, list[Basic.Properties]]:
    """Read messages from the output queues until ``want`` have arrived (10 s at most)."""
    got: dict[str, list[Basic.Properties]] = {queue: [] for queue in OUT}
    deadline = time.monotonic() + 10
    while sum(map(len, got.values())) < want and time.monotonic() < deadline:
        for queue in OUT:
            message = await channel.basic_get(queue, no_ack=True)
            if isinstance(message.delivery, Basic.GetOk):
                got[queue].append(message.header.properties)
        await asyncio.sleep(0.05)
    return got


def show(value: object) -> str:
    """Show a header value compactly."""
    return value.decode() if isinstance(value, bytes) else str(value)


def summarise(metrics: str) -> list[str]:
    """Condense /metrics to the outcome counts and the violations by kind."""
    lines, kinds = [], {}
    for line in metrics.splitlines():
        if line.startswith("acemq_sidecar_messages_total") and not line.endswith(" 0.0"):
            lines.append(line)
        elif line.startswith("acemq_sidecar_violations_total") and not line.endswith(" 0.0"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            kind = labels["kind"].strip('"')
            kinds[kind] = kinds.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    summary = " ".join(f"{kind}={count}" for kind, count in sorted(kinds.items()))
    return [*lines, f"acemq_sidecar_violations_total by kind: {summary}"]


async def main() -> int:
    """Run the demo; return the exit code."""
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    await declare(channel)
    port = free_port()
    env = {**os.environ, "ACEMQ_HTTP_LISTEN": f"127.0.0.1:{port}", "ACEMQ_LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--config", str(REPO / "config/example.yaml")],
        env=env,
    )
    try:
        wait_ready(port, process)
        print(f"sidecar running (pid {process.pid}); metrics on http://127.0.0.1:{port}/metrics\n")
        print("published:")
        for routing_key, properties, headers, what in SAMPLES:
            await channel.basic_publish(
                b'{"demo": true}',
                exchange="demo.staging",
                routing_key=routing_key,
                properties=Basic.Properties(headers=headers, delivery_mode=2, **properties),  # type: ignore[arg-type]
            )
            print(f"  {properties['message_id']:6} {routing_key:15} {what}")
        arrived = await collect(channel, len(SAMPLES))
        for queue, messages in arrived.items():
            print(f"\n{queue}: {len(messages)} message(s)")
            for props in messages:
                headers = props.headers or {}
                if queue == "demo.out.quarantine":
                    print(f"  {props.message_id:6} because: {show(headers.get('x-acemq-error'))}")
                    continue
                fields = " ".join(
                    f"{k.removeprefix('x-acemq-')}={show(headers[k])}"
                    for k in SHOWN
                    if k in headers
                )
                print(f"  {props.message_id:6} {fields}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        print("\nmetrics:")
        print("\n".join(f"  {line}" for line in summarise(metrics)))
        total = sum(map(len, arrived.values()))
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=30)
        await connection.close()
    print(
        f"\nsidecar stopped on SIGTERM with exit status {status};"
        f" {total}/{len(SAMPLES)} messages accounted for"
    )
    return 0 if status == 0 and total == len(SAMPLES) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
