"""Peak RSS of the sidecar draining large messages, this tree against another.

Usage: python bench/memory.py [--n N] [--mib M] [--prefetch P] [--budget BYTES] [--base DIR]

Fills a staging queue with N messages of M MiB, then drains it through ``acemq-sidecar
run`` (default settings unless --prefetch or --budget, which sets
``broker.max_in_flight_bytes``) and reads the process's peak resident set (``VmHWM``)
once the target holds every message. With ``--base DIR`` (a source tree, for example
``git archive REV | tar -x -C DIR``) the same drain runs from that tree too
(``PYTHONPATH=DIR``), after this one. Prints each figure and one JSON line. The broker
holds N x M MiB meanwhile: mind a shared one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiormq
import aiormq.abc
from harness import URL, consumer_attached, drained, peak_rss_mib, sidecar, topology
from pamqp.commands import Basic

MIB = 2**20


async def fill(channel: aiormq.abc.AbstractChannel, queue: str, n: int, body: bytes) -> None:
    """Publish n copies of ``body`` with confirms, ten at a time."""
    for start in range(0, n, 10):
        await asyncio.gather(
            *(
                channel.basic_publish(
                    body,
                    routing_key=queue,
                    properties=Basic.Properties(
                        delivery_mode=2,
                        message_id=f"m-{i}",
                        headers={"x-acemq-id": f"m-{i}", "x-acemq-type": "bench.large"},
                    ),
                )
                for i in range(start, min(n, start + 10))
            )
        )


async def drain(
    channel: aiormq.abc.AbstractChannel, args: argparse.Namespace, tree: str | None
) -> dict[str, float]:
    """Drain the queue through the sidecar of ``tree`` (None: this one); its peak RSS."""
    body = b"x" * int(args.mib * MIB)
    async with topology(channel, "memory") as topo:
        await fill(channel, topo.staging, args.n, body)
        running = sidecar(topo, prefetch=args.prefetch, pythonpath=tree, budget=args.budget)
        async with running as pid:
            t0 = await consumer_attached(channel, topo.staging)
            t1 = await drained(channel, topo.staging, {topo.target: args.n})
            rss = peak_rss_mib(pid)
    return {"peak_rss_mib": round(rss, 1), "drain_s": round(t1 - t0, 2)}


async def main() -> None:
    """Run the drains and print the figures, the last line as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--mib", type=float, default=5.0)
    parser.add_argument("--prefetch", type=int, default=None, help="default: the sidecar's")
    parser.add_argument("--budget", type=int, default=None, help="default: the sidecar's")
    parser.add_argument("--base", default=None, help="a source tree to compare against")
    args = parser.parse_args()
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    results: dict[str, object] = {"n": args.n, "mib": args.mib, "at": time.strftime("%F %T")}
    try:
        for name, tree in [("this", None), ("base", args.base)]:
            if name == "base" and tree is None:
                continue
            figures = await drain(channel, args, tree)
            rss, seconds = figures["peak_rss_mib"], figures["drain_s"]
            print(f"{name:5} peak RSS {rss} MiB, drained in {seconds} s")
            results[name] = figures
    finally:
        await connection.close()
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
