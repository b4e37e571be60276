"""Two builds of the sidecar against each other: paired drains, CPU per message first.

Usage: python bench/ab.py --a PATH [--b PATH] [--n N] [--pairs P] [--core C]

``--a`` and ``--b`` are ``acemq-sidecar`` executables (``--b`` defaults to this venv's), for
instance the one in the venv of a second worktree checked out at the baseline commit. Each
pair drains N messages (bench/harness.py's mix) through A and through B, the order
alternating from pair to pair, on the same broker, and reads from /proc the CPU the
sidecar process and the broker spent during each drain.

The sidecar's CPU µs per message is the figure to judge a change by on a busy machine: it
moves far less than throughput when other work shares the cores. The per-pair ratio B/A
cancels what drifts between pairs. ``--core`` starts both on that core (``taskset -c``).
A benchmark, never a test: compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiormq
from harness import URL
from paired import broker_pids, drain_sidecar


def _spread(values: list[float], digits: int = 1) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


async def main() -> None:
    """Run the pairs and print the medians, the per-pair ratios, then one JSON line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", type=Path, required=True, help="the baseline's acemq-sidecar")
    parser.add_argument("--b", type=Path, default=Path(sys.executable).with_name("acemq-sidecar"))
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--core", type=int, default=None)
    args = parser.parse_args()
    broker = broker_pids()
    if not broker:
        sys.exit("no broker process (beam.smp) found on this machine")
    builds = {"a": args.a, "b": args.b}
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    try:
        for pair in range(args.pairs):
            for name in ("a", "b") if pair % 2 == 0 else ("b", "a"):
                result = await drain_sidecar(
                    channel, args.n, core=args.core, broker=broker, executable=builds[name]
                )
                runs[name].append(result)
                print(f"pair {pair} {name}: {json.dumps(result)}", flush=True)
                time.sleep(1.0)  # let the broker settle between drains
    finally:
        await connection.close()
    summary: dict[str, object] = {"n": args.n, "pairs": args.pairs, "core": args.core}
    summary |= {f"{name}_build": str(path) for name, path in builds.items()}
    for name, results in runs.items():
        for key in results[0]:
            summary[f"{name}_{key}"] = _spread([r[key] for r in results])
    for key in runs["a"][0]:
        ratios = [b[key] / a[key] for a, b in zip(runs["a"], runs["b"], strict=True)]
        summary[f"b/a_{key}"] = _spread(ratios, 3)
    print(f"== {args.pairs} pairs of {args.n} messages, A={args.a}, B={args.b}")
    for key, value in summary.items():
        if isinstance(value, dict):
            print(f"   {key:28} median {value['median']:>9}   range {value['min']}..{value['max']}")
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), **summary}))


if __name__ == "__main__":
    asyncio.run(main())
