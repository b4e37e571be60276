"""Latency through the sidecar at a fixed rate: staging publish to target delivery.

Usage: python bench/latency.py [--rate R] [--seconds S] [--prefetch P] [--via shovel]

Starts ``acemq-sidecar run`` (default settings) on an empty staging queue, publishes the
benchmark's message mix (1 KiB, 20% needing repair, 2% to quarantine) at a fixed rate,
and times each message from just before its publish to its arrival on the target queue,
both measured in this process. Includes the broker's two hops and the sidecar's confirm
round trip. ``--via shovel``: the same through the shovel plugin (ack-mode on-confirm;
``scripts/broker --plugins``), the figure to compare with in the same hour: absolute
times move with the machine. Prints p50/p99/max in ms, the last line as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiormq
import aiormq.abc
from harness import (
    BODY,
    URL,
    consumer_attached,
    expected_split,
    properties_for,
    shovel,
    sidecar,
    topology,
)

SENT = "x-bench-sent-ns"


async def measure(
    rate: int, seconds: int, prefetch: int | None, *, via: str = "sidecar"
) -> dict[str, float | str]:
    """Publish rate * seconds messages at the rate; return the latency percentiles."""
    connection = await aiormq.connect(URL)
    setup = await connection.channel()
    total = rate * seconds
    relayed, _ = expected_split(total)
    samples: list[float] = []
    done = asyncio.Event()

    def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        sent = (message.header.properties.headers or {}).get(SENT)
        if isinstance(sent, int):
            samples.append((time.perf_counter_ns() - sent) / 1e6)
        if len(samples) >= relayed:
            done.set()

    try:
        async with (
            topology(setup, "latency") as topo,
            shovel(topo) if via == "shovel" else sidecar(topo, prefetch=prefetch),
        ):
            await consumer_attached(setup, topo.staging)
            consumer = await connection.channel()
            await consumer.basic_consume(topo.target, on_message, no_ack=True)
            publisher = await connection.channel(publisher_confirms=False)
            start = time.perf_counter()
            for i in range(total):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                properties = properties_for(i, **{SENT: time.perf_counter_ns()})
                await publisher.basic_publish(BODY, routing_key=topo.staging, properties=properties)
            async with asyncio.timeout(60):
                await done.wait()
            achieved = total / (time.perf_counter() - start)
            await consumer.close()
            await publisher.close()
    finally:
        await connection.close()
    samples.sort()
    return {
        "via": via,
        "rate_msg_s": rate,
        "achieved_msg_s": round(achieved, 1),
        "messages": len(samples),
        "p50_ms": round(samples[len(samples) // 2], 2),
        "p99_ms": round(samples[int(len(samples) * 0.99)], 2),
        "max_ms": round(samples[-1], 2),
    }


async def main() -> None:
    """Run one measurement and print it."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument(
        "--prefetch", type=int, default=None, help="the sidecar's (default: its own)"
    )
    parser.add_argument("--via", choices=("sidecar", "shovel"), default="sidecar")
    args = parser.parse_args()
    result = await measure(args.rate, args.seconds, args.prefetch, via=args.via)
    print(
        f"{args.via} latency at {result['rate_msg_s']} msg/s ({result['messages']} messages):"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
