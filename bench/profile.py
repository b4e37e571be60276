"""Where the sidecar's time goes: a py-spy profile of one drain, summarised.

Usage: python bench/profile.py [--n N] [--native] [--out bench/profiles/drain.txt]
Needs py-spy (``pip install py-spy``) and permission to trace (root, or ptrace allowed).

Fills a staging queue with N messages (bench/harness.py's mix), starts ``acemq-sidecar
run`` at default settings, attaches py-spy to it (sampling every thread; ``--native``
adds the C frames, which is where the compiled build's modules run), waits until the
queue is drained, and stops. The raw collapsed stacks go to
``--out``; the summary printed is the share of samples by leaf function (self time) and by
module of the sidecar anywhere on the stack (inclusive time).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
from pathlib import Path

import aiormq
from harness import URL, consumer_attached, drained, expected_split, fill, sidecar, topology

SAMPLE_RATE = 250  # samples per second


def summarise(raw: Path, *, top: int = 25) -> list[str]:
    """Return the summary lines of py-spy's collapsed stacks (``frame;frame;... count``)."""
    leaf: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        leaf[_function(frames[-1])] += count
        for module in {_module(frame) for frame in frames if "sidecar/" in frame}:
            modules[module] += count
    lines = [f"{total} samples", "", "self time by function:"]
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in leaf.most_common(top)]
    lines += ["", "inclusive time by sidecar module:"]
    lines += [f"  {n / total:6.1%}  {module}" for module, n in modules.most_common()]
    return lines


def _function(frame: str) -> str:
    """The frame without its line number: self time adds up per function."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})"


def _module(frame: str) -> str:
    # py-spy writes a frame as "function (path/to/file.py:line)".
    path = frame.rsplit("(", 1)[-1].split(":", 1)[0]
    return path[path.index("sidecar/") :] if "sidecar/" in path else path


async def main() -> None:
    """Profile one drain and print the summary."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("profiles/drain.txt"))
    parser.add_argument("--native", action="store_true", help="C frames too (compiled code)")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    connection = await aiormq.connect(URL)
    channel = await connection.channel(publisher_confirms=True)
    relayed, rejected = expected_split(args.n)
    try:
        async with topology(channel, "profile") as topo:
            await fill(channel, topo.staging, args.n)
            async with sidecar(topo) as pid:
                await consumer_attached(channel, topo.staging)
                recorder = subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        str(SAMPLE_RATE),
                        "--format",
                        "raw",
                        "--output",
                        str(args.out),
                        # Native stacks need the process paused per sample.
                        *(["--native"] if args.native else ["--nonblocking"]),
                    ],
                    stdout=subprocess.DEVNULL,
                )
                await drained(
                    channel, topo.staging, {topo.target: relayed, topo.quarantine: rejected}
                )
            recorder.wait(timeout=60)  # the sidecar exited: py-spy writes and stops
    finally:
        await connection.close()
    print("\n".join(summarise(args.out)))


if __name__ == "__main__":
    asyncio.run(main())
