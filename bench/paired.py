"""The sidecar against the shovel, paired runs in both setups, with CPU per message.

Usage: python bench/paired.py [--n N] [--pairs P] [--setup shared|pinned|both]
                              [--trace-ratio R [--collector up|down]]

Each pair drains N 1 KiB messages (bench/harness.py's mix: 20 % repairs, 2 % rejects)
through the sidecar (``acemq-sidecar run`` at default settings) and through the RabbitMQ
shovel plugin (ack-mode on-confirm), the order alternating from pair to pair, on the same
broker. For each path it reads, from /proc, the CPU the sidecar process and the broker's
processes spent during the drain, and reports per relayed message:

  shared   the machine as it is: broker and sidecar on every core
  pinned   as in production, where the sidecar has its own pod's CPU: every thread of the
           broker pinned to core 0 (``taskset -a -p``), the sidecar started on core 1;
           the broker's affinity is restored afterwards

``--trace-ratio R`` runs the sidecar with tracing on (``OTEL_TRACES_EXPORTER=otlp``, the
default parent-based sampler at R) and gives each message a trace of its own, flagged
sampled on R of them (``harness.PRODUCERS_SAMPLE``), as producers sampling at R send them:
R of the deliveries are traced, on either path. It exports over OTLP/HTTP to a collector
of the bench's own (``--collector up``: a receiver in this process that answers every
export and counts the bytes) or to a port nobody listens on (``--collector down``).

It prints the median and range of each figure over the pairs, and the ratios of the
medians, then the README's table (Markdown, dated, with the command), then one JSON
line. It says when it could not pin (no taskset, one core). The sidecar is this venv's
build: plain Python, or compiled once scripts/compile has run (the table says which). A
benchmark, never a test: compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import aiormq
from collector import collector
from harness import (
    PRODUCERS_SAMPLE,
    URL,
    consumer_attached,
    drained,
    expected_split,
    fill,
    shovel,
    sidecar,
    topology,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import aiormq.abc

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process and its threads, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def broker_pids() -> list[int]:
    """The broker's OS processes (beam.smp and its port programs), by their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if command.endswith((b"beam.smp", b"erl_child_setup", b"inet_gethost", b"epmd")):
            pids.append(int(entry.name))
    return pids


def broker_cpu_s(pids: list[int]) -> dict[int, float]:
    """CPU seconds each of the broker's processes has spent so far (those still there)."""
    spent = {}
    for pid in pids:
        try:
            spent[pid] = cpu_s(pid)
        except OSError:  # a port program that came and went
            continue
    return spent


def spent_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent in between by the processes there both times.

    A port program that exits during a drain would otherwise count its whole life as
    negative time (seen: a broker figure of -1,307 µs per message).
    """
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


@contextmanager
def broker_pinned(pids: list[int], core: int) -> Iterator[str | None]:
    """Pin every thread of the broker's processes to one core; restore after.

    Yields None when pinned, else why it could not pin.
    """
    taskset = shutil.which("taskset")
    if taskset is None:
        yield "taskset is not installed (Debian util-linux)"
        return
    if (os.cpu_count() or 1) < 2:
        yield "one core: nothing to pin apart"
        return
    before = {pid: os.sched_getaffinity(pid) for pid in pids}
    for pid in pids:
        subprocess.run(
            [taskset, "-a", "-p", "-c", str(core), str(pid)], check=True, capture_output=True
        )
    try:
        yield None
    finally:
        for pid, cores in before.items():
            mask = ",".join(map(str, sorted(cores)))
            subprocess.run(
                [taskset, "-a", "-p", "-c", mask, str(pid)], check=False, capture_output=True
            )


async def drain_sidecar(
    channel: aiormq.abc.AbstractChannel,
    n: int,
    *,
    core: int | None,
    broker: list[int],
    executable: Path | None = None,
    prefetch: int | None = None,
) -> dict[str, float]:
    """One sidecar drain: msg/s, and sidecar and broker CPU µs per message."""
    relayed, rejected = expected_split(n)
    async with topology(channel, "sidecar") as topo:
        await fill(channel, topo.staging, n)
        cpus = None if core is None else str(core)
        async with sidecar(topo, cpus=cpus, executable=executable, prefetch=prefetch) as pid:
            # From the moment it consumes: its start-up (imports, connect) is not relaying.
            t0 = await consumer_attached(channel, topo.staging)
            b0, s0 = broker_cpu_s(broker), cpu_s(pid)
            t1 = await drained(
                channel, topo.staging, {topo.target: relayed, topo.quarantine: rejected}
            )
            b1, s1 = broker_cpu_s(broker), cpu_s(pid)
    return {
        "msg_s": n / (t1 - t0),
        "sidecar_us_per_msg": (s1 - s0) / n * 1e6,
        "broker_us_per_msg": spent_s(b0, b1) / n * 1e6,
    }


async def drain_shovel(
    channel: aiormq.abc.AbstractChannel, n: int, *, broker: list[int]
) -> dict[str, float]:
    """One shovel drain: msg/s and broker CPU µs per message (the shovel runs in it)."""
    async with topology(channel, "shovel") as topo:
        await fill(channel, topo.staging, n)
        async with shovel(topo):
            t0 = await consumer_attached(channel, topo.staging)
            b0 = broker_cpu_s(broker)
            t1 = await drained(channel, topo.staging, {topo.target: n})
            b1 = broker_cpu_s(broker)
    return {"msg_s": n / (t1 - t0), "broker_us_per_msg": spent_s(b0, b1) / n * 1e6}


async def run_setup(
    setup: str, *, n: int, pairs: int, prefetch: int | None = None
) -> dict[str, object]:
    """Run the pairs of one setup; return every run and the medians."""
    broker = broker_pids()
    if not broker:
        sys.exit("no broker process (beam.smp) found on this machine")
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    runs: dict[str, list[dict[str, float]]] = {"sidecar": [], "shovel": []}
    note: str | None = None
    try:
        with broker_pinned(broker, 0) if setup == "pinned" else nullcontext() as note:
            core = 1 if setup == "pinned" and note is None else None
            for pair in range(pairs):
                order = ("sidecar", "shovel") if pair % 2 == 0 else ("shovel", "sidecar")
                for path in order:
                    if path == "sidecar":
                        runs[path].append(
                            await drain_sidecar(
                                channel, n, core=core, broker=broker, prefetch=prefetch
                            )
                        )
                    else:
                        runs[path].append(await drain_shovel(channel, n, broker=broker))
                    time.sleep(1.0)  # let the broker settle between drains
    finally:
        await connection.close()
    summary: dict[str, object] = {"setup": setup, "n": n, "pairs": pairs, "could_not_pin": note}
    for path, results in runs.items():
        for key in results[0]:
            values = [r[key] for r in results]
            summary[f"{path}_{key}"] = {
                "median": round(statistics.median(values), 1),
                "min": round(min(values), 1),
                "max": round(max(values), 1),
            }
    ratio = [s["msg_s"] / h["msg_s"] for s, h in zip(runs["sidecar"], runs["shovel"], strict=True)]
    broker_ratio = [
        s["broker_us_per_msg"] / h["broker_us_per_msg"]
        for s, h in zip(runs["sidecar"], runs["shovel"], strict=True)
    ]
    summary["throughput_ratio"] = {
        "median": round(statistics.median(ratio), 2),
        "min": round(min(ratio), 2),
        "max": round(max(ratio), 2),
    }
    summary["broker_cpu_ratio"] = {
        "median": round(statistics.median(broker_ratio), 2),
        "min": round(min(broker_ratio), 2),
        "max": round(max(broker_ratio), 2),
    }
    return summary


def _print(summary: dict[str, object]) -> None:
    print(f"== {summary['setup']}: {summary['pairs']} pairs of {summary['n']} messages")
    if summary["could_not_pin"]:
        print(f"   could not pin: {summary['could_not_pin']}")
    for key, value in summary.items():
        if isinstance(value, dict):
            print(f"   {key:28} median {value['median']:>9}   range {value['min']}..{value['max']}")


async def main() -> None:
    """Run the setups asked for and print the figures, the last line as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--setup", choices=("shared", "pinned", "both"), default="both")
    parser.add_argument("--prefetch", type=int, help="the sidecar's (default: its own)")
    parser.add_argument("--trace-ratio", type=float, help="tracing on, this share sampled")
    parser.add_argument("--collector", choices=("up", "down"), default="up")
    args = parser.parse_args()
    setups = ("shared", "pinned") if args.setup == "both" else (args.setup,)
    with tracing(args.trace_ratio, args.collector) as received:
        results = [
            await run_setup(setup, n=args.n, pairs=args.pairs, prefetch=args.prefetch)
            for setup in setups
        ]
    if received is not None:
        print(f"   the collector received {received()} exports, {received(bytes_=True):,} bytes")
    for summary in results:
        _print(summary)
    print()
    print("\n".join(markdown(results, argv=sys.argv[1:])))
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}))


@contextmanager
def tracing(ratio: float | None, state: str) -> Iterator[Callable[..., int] | None]:
    """Set the sidecar's OTEL_* variables for a ratio (nothing when None), with a collector.

    Yields what counts the exports received (``received(bytes_=True)`` for their bytes), or
    None when tracing is off or the collector is down.
    """
    if ratio is None:
        yield None
        return
    PRODUCERS_SAMPLE.append(ratio)
    names = ("OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_ENDPOINT")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["OTEL_TRACES_EXPORTER"] = "otlp"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(ratio)
    try:
        with collector(up=state == "up") as (endpoint, received):
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            yield received if state == "up" else None
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build() -> str:
    """Which build of the sidecar this venv runs: compiled (scripts/compile) or plain."""
    out = subprocess.run(
        [sys.executable, "-c", "import sidecar.wire; print(sidecar.wire.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return "compiled (scripts/compile)" if out.stdout.strip().endswith(".so") else "plain Python"


def traced() -> str:
    """How the sidecar traced in this run, for the table's line ('' when off)."""
    if os.environ.get("OTEL_TRACES_EXPORTER") != "otlp":
        return ""
    return f", tracing on at {os.environ['OTEL_TRACES_SAMPLER_ARG']}"


def markdown(results: list[dict[str, object]], *, argv: list[str]) -> list[str]:
    """The README's table: medians with their ranges, one row per setup, dated, with the command."""

    def cell(summary: dict[str, object], key: str, unit: str = "") -> str:
        value = summary.get(key)
        if not isinstance(value, dict):
            return "-"
        return f"{value['median']:,}{unit} ({value['min']:,}-{value['max']:,})"

    lines = [
        (
            f"`python bench/paired.py {' '.join(argv)}`, {time.strftime('%Y-%m-%d')},"
            f" the sidecar {build()}{traced()}: medians of the pairs (range)"
        ),
        "",
        (
            "| setup | sidecar msg/s | shovel msg/s | ratio | sidecar CPU µs/msg"
            " | broker CPU µs/msg, sidecar | broker CPU µs/msg, shovel | broker ratio |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {"shared": "sharing both cores", "pinned": "broker on core 0, sidecar on core 1"}
    for summary in results:
        setup = str(summary["setup"])
        name = names.get(setup, setup)
        if summary.get("could_not_pin"):
            name += f" (could not pin: {summary['could_not_pin']})"
        lines.append(
            f"| {name}, {summary['pairs']} pairs of {summary['n']:,}"
            f" | {cell(summary, 'sidecar_msg_s')} | {cell(summary, 'shovel_msg_s')}"
            f" | {cell(summary, 'throughput_ratio', ' x')}"
            f" | {cell(summary, 'sidecar_sidecar_us_per_msg')}"
            f" | {cell(summary, 'sidecar_broker_us_per_msg')}"
            f" | {cell(summary, 'shovel_broker_us_per_msg')}"
            f" | {cell(summary, 'broker_cpu_ratio', ' x')} |"
        )
    return lines


if __name__ == "__main__":
    asyncio.run(main())
