"""Throughput of the sidecar against a raw aiormq relay and the shovel, in one run.

Usage: python bench/throughput.py [N] [--prefetch P]
Needs the local broker with rabbitmq_shovel enabled (scripts/broker --plugins).

Each path drains N 1 KiB messages (a realistic AceMQ header set, 20% needing repair, 2%
rejected) from a full staging queue, timed from the moment its consumer attaches until
the target (and, for the sidecar, the quarantine) holds every message and staging is
empty:

  sidecar    ``acemq-sidecar run`` with a route map of default settings (prefetch too,
             unless --prefetch), as users run it
  raw relay  a plain aiormq relay, the design brief's baseline: consume, publish with
             confirm, ack; one task per message; no contract
  shovel     the RabbitMQ shovel plugin, ack-mode on-confirm, prefetch 512

Prints msg/s for each, the ratios, the sidecar's peak RSS, and last one JSON line.
Compare ratios within one run: the broker shares the cores with the code under test.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import aiormq
import aiormq.abc
from harness import (
    BODY,
    URL,
    consumer_attached,
    drained,
    expected_split,
    fill,
    peak_rss_mib,
    shovel,
    sidecar,
    topology,
)


async def run_sidecar(
    channel: aiormq.abc.AbstractChannel, n: int, prefetch: int | None
) -> dict[str, float]:
    """Drain n messages through the sidecar process."""
    relayed, rejected = expected_split(n)
    async with topology(channel, "sidecar") as topo:
        await fill(channel, topo.staging, n)
        async with sidecar(topo, prefetch=prefetch) as pid:
            t0 = await consumer_attached(channel, topo.staging)
            t1 = await drained(
                channel, topo.staging, {topo.target: relayed, topo.quarantine: rejected}
            )
            rss = peak_rss_mib(pid)
    return {"sidecar_msg_s": n / (t1 - t0), "sidecar_peak_rss_mib": round(rss, 1)}


async def run_raw_relay(
    connection: aiormq.abc.AbstractConnection,
    channel: aiormq.abc.AbstractChannel,
    n: int,
    prefetch: int,
) -> float:
    """Drain n messages through the plain aiormq relay, in this process."""
    async with topology(channel, "raw") as topo:
        await fill(channel, topo.staging, n)
        relay = await connection.channel(publisher_confirms=True)
        await relay.basic_qos(prefetch_count=prefetch)
        acked = 0
        all_acked = asyncio.Event()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal acked
            await relay.basic_publish(
                message.body,
                exchange=topo.exchange,
                routing_key=message.delivery.routing_key or "",
                properties=message.header.properties,
            )
            await relay.basic_ack(message.delivery.delivery_tag)  # type: ignore[arg-type]
            acked += 1
            if acked >= n:
                all_acked.set()

        await relay.basic_consume(topo.staging, lambda m: asyncio.ensure_future(on_message(m)))
        t0 = await consumer_attached(channel, topo.staging)
        t1 = await drained(channel, topo.staging, {topo.target: n})
        # The target can hold every copy before the last acks are sent: closing the channel
        # under them would be a channel error.
        await asyncio.wait_for(all_acked.wait(), timeout=60)
        await relay.close()
    return n / (t1 - t0)


async def run_shovel(channel: aiormq.abc.AbstractChannel, n: int) -> float:
    """Drain n messages through the shovel plugin, ack-mode on-confirm."""
    async with topology(channel, "shovel") as topo:
        await fill(channel, topo.staging, n)
        async with shovel(topo):
            t0 = await consumer_attached(channel, topo.staging)
            t1 = await drained(channel, topo.staging, {topo.target: n})
    return n / (t1 - t0)


async def main() -> None:
    """Run the three paths and print the figures, the last line as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("n", nargs="?", type=int, default=20_000)
    parser.add_argument(
        "--prefetch", type=int, default=None, help="the sidecar's (default: its own)"
    )
    args = parser.parse_args()
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    results: dict[str, float] = {"n": args.n, "body_bytes": len(BODY)}
    try:
        results |= await run_sidecar(channel, args.n, args.prefetch)
        results["raw_relay_msg_s"] = await run_raw_relay(
            connection, channel, args.n, args.prefetch or 512
        )
        results["shovel_msg_s"] = await run_shovel(channel, args.n)
    finally:
        await connection.close()
    results["sidecar_vs_raw_relay"] = results["sidecar_msg_s"] / results["raw_relay_msg_s"]
    results["sidecar_vs_shovel"] = results["sidecar_msg_s"] / results["shovel_msg_s"]
    for key in ("sidecar_msg_s", "raw_relay_msg_s", "shovel_msg_s"):
        print(f"{key.removesuffix('_msg_s'):10} {results[key]:8.0f} msg/s")
    print(
        f"sidecar / raw relay {results['sidecar_vs_raw_relay']:.2f}"
        f"   sidecar / shovel {results['sidecar_vs_shovel']:.2f}"
        f"   sidecar peak RSS {results['sidecar_peak_rss_mib']} MiB"
    )
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    asyncio.run(main())
