"""Scaling on a three-node cluster: 1, 2 and 3 sidecar replicas side by side in one run.

    .venv/bin/python bench/scaling.py [MESSAGES] [--rounds N]

Starts the three-node cluster of the cluster tests (tests/cluster/nodes.py: its own node
names, ports, folders and cookie; stopped at the end), declares quorum queues (staging,
target, quarantine; their leader on the first node), and for each replica count fills the
staging queue with MESSAGES messages of the benchmark mix (bench/harness.py: 1 KiB, 20%
repaired, 2% quarantined), starts that many ``acemq-sidecar run`` processes with every
node's URL (each process shuffles them, so replicas spread over the nodes), and times the
drain from the first consumer attaching to the last copy arriving. The counts alternate
over the rounds (1, 2, 3, then 3, 2, 1, ...), so a drift of the machine does not favour
one. Broker CPU is read from /proc of the three nodes' Erlang VMs (beam.smp), sidecar CPU
from the replicas', both per relayed message.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiormq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import BODY, consumer_attached, depth, expected_split, free_port, properties_for
from bench.paired import cpu_s
from tests.cluster.nodes import Cluster, three_node_cluster

PREFETCH = 512  # the route map's default
QUORUM = {"x-queue-type": "quorum"}


@dataclass(frozen=True)
class Drain:
    """One timed drain."""

    replicas: int
    messages: int
    seconds: float
    broker_cpu_s: float
    sidecar_cpu_s: float
    nodes: tuple[str, ...]

    @property
    def rate(self) -> float:
        """Messages a second."""
        return self.messages / self.seconds

    @property
    def broker_us(self) -> float:
        """Broker CPU per relayed message, microseconds."""
        return self.broker_cpu_s / self.messages * 1e6

    @property
    def sidecar_us(self) -> float:
        """Sidecar CPU (all replicas) per relayed message, microseconds."""
        return self.sidecar_cpu_s / self.messages * 1e6


async def fill(channel: aiormq.abc.AbstractChannel, queue: str, n: int) -> None:
    """Publish n messages with confirms, 500 in flight at a time."""
    for start in range(0, n, 500):
        await asyncio.gather(
            *(
                channel.basic_publish(BODY, routing_key=queue, properties=properties_for(i))
                for i in range(start, min(n, start + 500))
            )
        )


def route_map(cluster: Cluster, names: dict[str, str], *, port: int) -> str:
    """One route on the cluster, every node's URL, defaults otherwise."""
    urls = "".join(f"\n    - '{url}'" for url in cluster.urls)
    return (
        f"broker:\n  urls:{urls}\n  prefetch: {PREFETCH}\n"
        f"http: {{listen: '127.0.0.1:{port}'}}\n"
        f"quarantine: {{exchange: {names['qx']}}}\n"
        "routes:\n"
        "  - name: bench\n"
        f"    from: {names['staging']}\n"
        f"    to: {{exchange: {names['x']}, routing_key: keep}}\n"
        "    publishers: acemq\n"
    )


def node_of(log: Path, cluster: Cluster) -> str:
    """The node a replica connected to, from its 'connected to' log line."""
    for node in cluster.nodes:
        if f"127.0.0.1:{node.amqp_port}" in log.read_text(errors="replace"):
            return node.name.partition("@")[0]
    return "?"


async def drain(cluster: Cluster, replicas: int, n: int) -> Drain:
    """Fill a fresh quorum topology, drain it with ``replicas`` processes, measure."""
    connection = await aiormq.connect(cluster.urls[0])
    channel = await connection.channel(publisher_confirms=True)
    run = f"bench.{uuid.uuid4().hex[:6]}"
    names = {"staging": f"{run}.staging", "target": f"{run}.target", "q": f"{run}.q"}
    names |= {"x": f"{run}.x", "qx": f"{run}.qx"}
    for queue in (names["staging"], names["target"], names["q"]):
        await channel.queue_declare(queue, durable=True, arguments=QUORUM)
    for exchange, queue in ((names["x"], names["target"]), (names["qx"], names["q"])):
        await channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
        await channel.queue_bind(queue, exchange, routing_key="")
    await fill(channel, names["staging"], n)
    relayed, quarantined = expected_split(n)
    folder = Path(tempfile.mkdtemp(prefix="acemq-scaling-"))
    beams = cluster.beam_pids()
    broker_before = sum(cpu_s(pid) for pid in beams)
    processes = []
    logs = []
    command = [str(Path(sys.executable).with_name("acemq-sidecar")), "run", "--config"]
    for index in range(replicas):
        config = folder / f"r{index}.yaml"
        config.write_text(route_map(cluster, names, port=free_port()))
        logs.append(folder / f"r{index}.log")
        with logs[-1].open("wb") as err:
            env = {**os.environ, "ACEMQ_LOG_LEVEL": "INFO"}
            processes.append(subprocess.Popen([*command, str(config)], env=env, stderr=err))
    try:
        start = await consumer_attached(channel, names["staging"])
        while True:
            counts = (await depth(channel, names["target"]), await depth(channel, names["q"]))
            if counts >= (relayed, quarantined) and await depth(channel, names["staging"]) == 0:
                break
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - start
        broker = sum(cpu_s(pid) for pid in beams) - broker_before
        sidecar = sum(cpu_s(process.pid) for process in processes)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
    nodes = tuple(node_of(log, cluster) for log in logs)
    for queue in (names["staging"], names["target"], names["q"]):
        await channel.queue_delete(queue)
    for exchange in (names["x"], names["qx"]):
        await channel.exchange_delete(exchange)
    await connection.close()
    return Drain(replicas, n, seconds, broker, sidecar, nodes)


async def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("messages", nargs="?", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[int, list[Drain]] = {1: [], 2: [], 3: []}
    with three_node_cluster() as cluster:
        for round_ in range(args.rounds):
            order = (1, 2, 3) if round_ % 2 == 0 else (3, 2, 1)
            for replicas in order:
                result = await drain(cluster, replicas, args.messages)
                results[replicas].append(result)
                print(
                    f"round {round_ + 1}, {replicas} replica(s) on {', '.join(result.nodes)}:"
                    f" {result.rate:,.0f} msg/s, broker {result.broker_us:.0f} us/msg,"
                    f" sidecars {result.sidecar_us:.0f} us/msg",
                    flush=True,
                )
    day = datetime.now(UTC).date().isoformat()
    print(f"\n{args.messages:,} messages per drain, {args.rounds} rounds, {day}, quorum queues")
    print("| replicas | msg/s (median; range) | broker CPU per message | sidecar CPU per message |")
    print("|---|---|---|---|")
    for replicas, drains in results.items():
        rates = [d.rate for d in drains]
        print(
            f"| {replicas} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
            f" | {statistics.median(d.broker_us for d in drains):.0f} us"
            f" | {statistics.median(d.sidecar_us for d in drains):.0f} us |"
        )


if __name__ == "__main__":
    asyncio.run(main())
