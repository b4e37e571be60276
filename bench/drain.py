"""Drain time of the sidecar alone, this tree against another, in alternating runs.

Usage: python bench/drain.py [--n N] [--pairs P] [--prefetch P] [--base DIR]

Each run drains N 1 KiB messages (bench/harness.py's mix: 20 % repairs, 2 % rejects) from
a full staging queue through ``acemq-sidecar run`` at default settings, timed from the
moment its consumer attaches until the target and quarantine hold every message and
staging is empty, and the CPU the sidecar process spent meanwhile (from /proc) per
message: on a loaded machine that figure varies far less than the rate. With ``--base
DIR`` (a source tree, for example ``git archive REV | tar -x -C DIR``) each pair also runs
the sidecar from that tree (``PYTHONPATH=DIR``), the order alternating from pair to pair;
without it, this tree only. Prints each run, the
median and range per tree, and one JSON line. A benchmark, never a test: the broker
shares the cores with the sidecar, so compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import aiormq
import aiormq.abc
from harness import URL, consumer_attached, drained, expected_split, fill, sidecar, topology
from paired import cpu_s


async def drain(
    channel: aiormq.abc.AbstractChannel, n: int, prefetch: int | None, tree: str | None
) -> tuple[float, float]:
    """Drain n messages through the sidecar of ``tree`` (None: this one): msg/s, CPU us/msg."""
    relayed, rejected = expected_split(n)
    async with topology(channel, "drain") as topo:
        await fill(channel, topo.staging, n)
        async with sidecar(topo, prefetch=prefetch, pythonpath=tree) as pid:
            t0 = await consumer_attached(channel, topo.staging)
            cpu0 = cpu_s(pid)
            t1 = await drained(
                channel, topo.staging, {topo.target: relayed, topo.quarantine: rejected}
            )
            cpu = cpu_s(pid) - cpu0
    return n / (t1 - t0), cpu / n * 1e6


async def main() -> None:
    """Run the pairs and print the figures, the last line as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--prefetch", type=int, default=None, help="default: the sidecar's")
    parser.add_argument("--base", default=None, help="a source tree to compare against")
    args = parser.parse_args()
    trees: list[str | None] = [None] if args.base is None else [None, args.base]
    rates: dict[str, list[float]] = {str(tree or "this"): [] for tree in trees}
    cpus: dict[str, list[float]] = {str(tree or "this"): [] for tree in trees}
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    try:
        for pair in range(args.pairs):
            for tree in trees if pair % 2 == 0 else trees[::-1]:
                rate, cpu_us = await drain(channel, args.n, args.prefetch, tree)
                name = str(tree or "this")
                rates[name].append(rate)
                cpus[name].append(cpu_us)
                figures = f"{rate:8.0f} msg/s {cpu_us:6.1f} us/msg"
                print(f"pair {pair + 1} {name:20} {figures}", flush=True)
    finally:
        await connection.close()
    summary: dict[str, object] = {"n": args.n, "pairs": args.pairs}
    for name, runs in rates.items():
        rate, cpu_us = statistics.median(runs), statistics.median(cpus[name])
        print(
            f"{name:20} median {rate:8.0f} msg/s ({min(runs):.0f}-{max(runs):.0f}),"
            f" {cpu_us:.1f} us/msg ({min(cpus[name]):.1f}-{max(cpus[name]):.1f})"
        )
        summary[name] = {"msg_s": round(rate), "cpu_us_per_msg": round(cpu_us, 1)}
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
