"""Fixtures for the fault tests: a mixed two-route flow, rabbitmqctl on the right node, a tally.

The flow has one ``publishers: acemq`` route and one ``publishers: apps`` route. Each message
is planned up front with its fate (relayed to the target, or quarantined) and an id carried
in ``message_id`` (and, where the route allows it, ``x-acemq-id``), so that after a fault
every copy can be accounted for by id: none lost, none misplaced, duplicates counted.

The sidecar process and the waits come from tests/e2e/conftest.py, the ``rabbitmqctl``
fixture (for the broker under test alone) from tests/conftest.py.
Every test's numbers are printed and summarised at the end of the run (and written as JSON
lines to ``ACEMQ_FAULTS_REPORT`` when that is set), for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import aiormq.abc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.wire import Int32, Int64, Timestamp
from tests.e2e.conftest import Flow, Sidecar, eventually
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path


ID_HEADER = "x-acemq-id"
ROUTABLE = "ok.#"  # the target queues' binding; "bad.*" routing keys come back unroutable
FIRST_SEEN = 1_767_323_045_678
PUBLISH_BATCH = 250
COLLECT_TIMEOUT_S = 30.0
RABBITMQCTL_TIMEOUT_S = 90.0
RECOVERY_TIMEOUT_S = 45.0


# --- rabbitmqctl on the node under test --------------------------------------------------


@dataclass(frozen=True, slots=True)
class RabbitCtl:
    """``rabbitmqctl`` (with ``-n RABBITMQCTL_NODE`` when set) for the broker under test."""

    command: tuple[str, ...]
    vhost: str

    async def run(self, *args: str) -> str:
        """Run one rabbitmqctl command; fail the test with its output if it fails."""
        process = await asyncio.create_subprocess_exec(
            *self.command,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(RABBITMQCTL_TIMEOUT_S):
            output, _ = await process.communicate()
        text = output.decode(errors="replace")
        assert process.returncode == 0, f"{' '.join(self.command)} {' '.join(args)}: {text}"
        return text

    async def close_all_connections(self) -> None:
        """Close every client connection on the vhost under test (the sidecar's too)."""
        await self.run("close_all_connections", "--vhost", self.vhost, "fault test")

    async def rabbit_env(self, key: str) -> str | None:
        """The node's ``rabbit`` setting ``key`` as Erlang prints it; None when it is unset."""
        printed = (await self.run("eval", f"application:get_env(rabbit, {key}).")).strip()
        found = re.fullmatch(r"\{ok,(.*)\}", printed.splitlines()[-1] if printed else "")
        return None if found is None else found.group(1)

    @contextlib.asynccontextmanager
    async def rabbit_env_set(self, key: str, value: str) -> AsyncIterator[None]:
        """Set the node's ``rabbit`` setting ``key`` for the block; put it back, whatever happened.

        Put back as it was read (each version has its own defaults: 4.0's largest message
        is 16 MiB, 3.10's 128 MiB).
        """
        before = await self.rabbit_env(key)
        await self.run("eval", f"application:set_env(rabbit, {key}, {value}).")
        try:
            yield
        finally:
            if before is None:
                await self.run("eval", f"application:unset_env(rabbit, {key}).")
            else:
                await self.run("eval", f"application:set_env(rabbit, {key}, {before}).")

    @contextlib.asynccontextmanager
    async def app_stopped(self) -> AsyncIterator[None]:
        """Stop the RabbitMQ application for the block; start it again whatever happens."""
        await self.run("stop_app")
        try:
            yield
        finally:
            await self.run("start_app")
            await self.run("await_startup")


# --- the mixed flow ----------------------------------------------------------------------


class Fate(StrEnum):
    """Where a message must end."""

    TARGET = "target"
    QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True)
class Lane(Flow):
    """One route: staging exchange (keeps routing keys) -> staging -> target exchange -> queue."""

    publishers: str
    staging_exchange: str

    def route(self) -> dict[str, Any]:
        """Return this lane as a route-map entry, with its publishers."""
        return {**Flow.route(self), "publishers": self.publishers}


async def declare_target(broker: Broker, lane: Lane) -> None:
    """Declare a lane's target topic exchange, binding its queue to ``ok.#`` only."""
    await broker.channel.exchange_declare(lane.exchange, exchange_type="topic", durable=True)
    if lane.exchange not in broker.exchanges:
        broker.exchanges.append(lane.exchange)
    await broker.bind(lane.target, lane.exchange, ROUTABLE)


async def declare_quarantine_exchange(broker: Broker, exchange: str, queue: str) -> None:
    """Declare the quarantine fanout exchange and bind its queue."""
    await broker.channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
    if exchange not in broker.exchanges:
        broker.exchanges.append(exchange)
    await broker.bind(queue, exchange, routing_key="")


@dataclass(frozen=True, slots=True)
class Planned:
    """One message to publish, with the fate the contract and the topology give it."""

    id: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    fate: Fate
    kind: str


def envelope(msg_id: str) -> dict[str, Any]:
    """Return a canonical AceMQ envelope, as the Java library writes it."""
    return {
        ID_HEADER: msg_id,
        "x-acemq-type": "order.placed",
        "x-acemq-version": Int32(1),
        "x-acemq-correlation": msg_id,
        "x-acemq-attempt": Int32(1),
        "x-acemq-first-seen": Int64(FIRST_SEEN),
    }


def plan(lane: Lane, index: int) -> Planned:
    """Plan message ``index`` of a lane: 6 in 10 good, 3 repairable, 1 quarantined.

    acemq lane: canonical; drifted (text attempt, zero first-seen, legacy and unknown
    reserved names); unroutable. apps lane: plain; zero timestamp with type and app_id;
    an application-set reserved header.
    """
    msg_id = f"{lane.name}-{index:05d}"
    properties: dict[str, Any] = {"message_id": msg_id}
    slot = index % 10
    acemq = lane.publishers == "acemq"
    if slot < 6:
        kind, key, fate = "good", "ok.good", Fate.TARGET
        headers = envelope(msg_id) if acemq else {"x-tenant": "acme"}
    elif slot < 9:
        kind, key, fate = "repairable", "ok.repair", Fate.TARGET
        if acemq:
            headers = {
                ID_HEADER: msg_id,
                "x-acemq-attempt": " 4 ",
                "x-acemq-first-seen": 0,
                "x-acemq-replayed-at": "2026-02-03T04:05:06.7891234+00:00",
                "x-acemq-zone": "eu-1",
            }
        else:
            headers = {"x-tenant": "acme"}
            properties |= {"timestamp": Timestamp(0), "message_type": "x.y", "app_id": "billing"}
    elif acemq:
        kind, key, fate = "unroutable", "bad.unroutable", Fate.QUARANTINE
        headers = envelope(msg_id)
    else:
        kind, key, fate = "reserved", "ok.reserved", Fate.QUARANTINE
        headers = {"x-acemq-tenant": "acme"}
    return Planned(msg_id, key, headers, properties, fate, kind)


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy found downstream: its id (``message_id``) and its ``x-acemq-id``, if any."""

    id: str
    acemq_id: object
    place: Fate


@dataclass
class MixedFlow:
    """The two lanes, the quarantine, and every message published and copy found."""

    broker: Broker
    lanes: tuple[Lane, ...]
    quarantine: str
    quarantined: str
    fates: dict[str, Fate] = field(default_factory=dict)
    lane_of: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    published_per_lane: int = 0

    def lane(self, name: str) -> Lane:
        """The lane called ``name``."""
        return next(lane for lane in self.lanes if lane.name == name)

    def route_map(
        self, sidecar: Sidecar, *, prefetch: int, shutdown_grace_s: float = 10.0
    ) -> dict[str, Any]:
        """Return the route map for both lanes, listening on the sidecar's port."""
        return {
            "broker": {"url": sidecar.amqp_url, "prefetch": prefetch, "connect_timeout_s": 5},
            "http": {"listen": f"127.0.0.1:{sidecar.port}"},
            "mode": "enforce",
            "quarantine": {"exchange": self.quarantine},
            "shutdown_grace_s": shutdown_grace_s,
            "routes": [lane.route() for lane in self.lanes],
        }

    async def publish(self, per_lane: int) -> None:
        """Publish ``per_lane`` more planned messages on every lane, confirmed."""
        start = self.published_per_lane
        planned = [
            (lane, plan(lane, index))
            for index in range(start, start + per_lane)
            for lane in self.lanes
        ]
        self.published_per_lane += per_lane
        for first in range(0, len(planned), PUBLISH_BATCH):
            await asyncio.gather(
                *(
                    self.broker.publish(
                        lane.staging,
                        body=f'{{"id": "{message.id}", "kind": "{message.kind}"}}'.encode(),
                        headers=message.headers,
                        exchange=lane.staging_exchange,
                        routing_key=message.routing_key,
                        **message.properties,
                    )
                    for lane, message in planned[first : first + PUBLISH_BATCH]
                )
            )
        for lane, message in planned:
            self.fates[message.id] = message.fate
            self.lane_of[message.id] = lane.name

    @property
    def published(self) -> int:
        """How many messages were published."""
        return len(self.fates)

    async def _take(self, queue: str, place: Fate) -> None:
        """Consume (no ack) at least what the queue holds now; record each copy.

        Only called while no fault is under way: a cut would lose what is on the wire.
        """
        depth = await self.broker.depth(queue)
        if depth == 0:
            return
        got = 0
        enough = asyncio.Event()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal got
            properties = message.header.properties
            headers = properties.headers if isinstance(properties.headers, dict) else {}
            self.copies.append(Copy(str(properties.message_id), headers.get(ID_HEADER), place))
            got += 1
            if got >= depth:
                enough.set()

        ok = await self.broker.channel.basic_consume(queue, on_message, no_ack=True)
        try:
            async with asyncio.timeout(COLLECT_TIMEOUT_S):
                await enough.wait()
        finally:
            assert ok.consumer_tag is not None
            await self.broker.channel.basic_cancel(ok.consumer_tag)

    async def downstream(self) -> int:
        """Copies waiting in the target and quarantine queues (read without taking them)."""
        queues = [lane.target for lane in self.lanes] + [self.quarantined]
        return sum([await self.broker.depth(queue) for queue in queues])

    async def collect(self) -> None:
        """Take every copy waiting in the target queues and the quarantine queue."""
        for lane in self.lanes:
            await self._take(lane.target, Fate.TARGET)
        await self._take(self.quarantined, Fate.QUARANTINE)

    async def staging_depth(self) -> int:
        """Messages ready in the staging queues."""
        return sum([await self.broker.depth(lane.staging) for lane in self.lanes])

    def missing(self) -> set[str]:
        """Ids not yet found where they belong."""
        found = {(copy.id, copy.place) for copy in self.copies}
        return {id_ for id_, fate in self.fates.items() if (id_, fate) not in found}

    async def wait_complete(self, *, timeout_s: float, context: Callable[[], str]) -> None:
        """Collect until every id is where it belongs and staging is empty."""

        async def complete() -> bool:
            await self.collect()
            return not self.missing() and await self.staging_depth() == 0

        def why() -> str:
            gone = sorted(self.missing())
            return f"{len(gone)} of {self.published} not found yet, e.g. {gone[:5]}\n{context()}"

        await eventually(complete, timeout_s=timeout_s, what="every id accounted for", context=why)

    def duplicates(self) -> int:
        """Copies beyond the first of every id, target and quarantine together."""
        return sum(count - 1 for count in Counter(copy.id for copy in self.copies).values())

    def check(self, *, max_duplicates: int, context: Callable[[], str]) -> int:
        """Assert zero lost, none misplaced or unknown, bounded duplicates with one x-acemq-id.

        Return the number of duplicates.
        """
        places: dict[str, set[Fate]] = defaultdict(set)
        acemq_ids: dict[str, set[str]] = defaultdict(set)
        for copy in self.copies:
            places[copy.id].add(copy.place)
            if copy.acemq_id is not None:
                acemq_ids[copy.id].add(str(copy.acemq_id))
        lost = sorted(set(self.fates) - set(places))
        assert not lost, f"{len(lost)} lost, e.g. {lost[:5]}\n{context()}"
        unknown = sorted(set(places) - set(self.fates))
        assert not unknown, f"{len(unknown)} copies of ids never published: {unknown[:5]}"
        misplaced = sorted(i for i, where in places.items() if where != {self.fates[i]})
        assert not misplaced, (
            f"{len(misplaced)} in the wrong place, e.g."
            f" {[(i, self.fates[i], places[i]) for i in misplaced[:5]]}\n{context()}"
        )
        changed = {i: ids for i, ids in acemq_ids.items() if ids != {i}}
        assert not changed, f"x-acemq-id differs from the message id: {list(changed.items())[:5]}"
        duplicates = self.duplicates()
        assert duplicates <= max_duplicates, (
            f"{duplicates} duplicates, more than the {max_duplicates} in flight at the faults"
            f"\n{context()}"
        )
        return duplicates


async def declare_mixed_flow(broker: Broker, **staging_arguments: Any) -> MixedFlow:
    """Declare the quarantine and the two lanes (acemq, apps) of a mixed flow.

    ``staging_arguments``: the staging queues' (``x-queue-type``...).
    """
    quarantine = broker.name("quarantine")
    quarantined = await broker.queue("quarantined")
    await declare_quarantine_exchange(broker, quarantine, quarantined)
    lanes = []
    for name, publishers in (("orders", "acemq"), ("invoices", "apps")):
        staging = await broker.queue(f"{name}.staging", **staging_arguments)
        staging_exchange = await broker.exchange(f"{name}.stage")
        await broker.bind(staging, staging_exchange, "#")
        target = await broker.queue(f"{name}.target")
        lane = Lane(
            name=name,
            publishers=publishers,
            staging=staging,
            staging_exchange=staging_exchange,
            exchange=broker.name(f"{name}.exchange"),
            target=target,
        )
        await declare_target(broker, lane)
        lanes.append(lane)
    return MixedFlow(broker, tuple(lanes), quarantine, quarantined)


@pytest.fixture
async def flow(broker: Broker) -> MixedFlow:
    """A declared mixed flow (nothing published yet)."""
    return await declare_mixed_flow(broker)


@pytest.fixture
async def sidecar(amqp_url: str, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar process on a route map in tmp_path, killed at teardown whatever happened."""
    process = Sidecar(amqp_url=amqp_url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


# --- metrics -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scrape:
    """One /metrics scrape."""

    samples: tuple[tuple[str, dict[str, str], float], ...]
    text: str

    def value(self, name: str, **labels: str) -> float:
        """Return the sum of the samples called ``name`` with these labels; fail if none."""
        values = [
            value
            for sample, got, value in self.samples
            if sample == name and labels.items() <= got.items()
        ]
        assert values, f"no sample {name}{labels} in /metrics:\n{self.text}"
        return sum(values)


async def scrape(sidecar: Sidecar) -> Scrape:
    """Scrape the sidecar's /metrics."""
    text = await sidecar.metrics_text()
    samples = tuple(
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    return Scrape(samples, text)


async def wait_nothing_in_flight(
    sidecar: Sidecar, flow: MixedFlow, *, context: Callable[[], str]
) -> None:
    """Wait until no route holds a delivery: a redelivered copy may still wait on a return."""

    async def nothing_in_flight() -> bool:
        metrics = await scrape(sidecar)
        lanes = flow.lanes
        return all(metrics.value("acemq_sidecar_in_flight", route=n.name) == 0 for n in lanes)

    await eventually(nothing_in_flight, timeout_s=10, what="nothing in flight", context=context)


async def wait_recovered(
    sidecar: Sidecar,
    flow: MixedFlow,
    *,
    since: float,
    reconnects: float = 0,
    timeout_s: float = RECOVERY_TIMEOUT_S,
) -> float:
    """Wait for /readyz 200, broker_connected 1, every route_up 1 and enough reconnects.

    Return the seconds from ``since`` (a ``time.monotonic()``) until then.
    """
    last: list[str] = []

    async def recovered() -> bool:
        assert sidecar.is_running(), f"the sidecar died\n{sidecar.output()}"
        status, body = await sidecar.get("/readyz")
        metrics = await scrape(sidecar)
        last[:] = [f"/readyz {status}: {body}", metrics.text]
        return (
            status == 200
            and metrics.value("acemq_sidecar_broker_connected") == 1
            and metrics.value("acemq_sidecar_reconnects_total") >= reconnects
            and all(
                metrics.value("acemq_sidecar_route_up", route=lane.name) == 1 for lane in flow.lanes
            )
        )

    await eventually(
        recovered,
        timeout_s=timeout_s,
        what=f"recovery (readyz, broker_connected, route_up, reconnects >= {reconnects:g})",
        context=lambda: "\n".join([*last, sidecar.output()]),
    )
    return time.monotonic() - since


# --- the numbers for docs/reliability.md -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRecord:
    """What one fault test measured."""

    test: str
    messages: int
    faults: int
    duplicates: int
    duplicate_bound: int
    recovery_s: tuple[float, ...]
    note: str = ""

    def line(self) -> str:
        """One printable line."""
        recovery = ", ".join(f"{seconds:.2f}" for seconds in self.recovery_s) or "-"
        return (
            f"{self.test}: {self.messages} messages, {self.faults} fault(s), {self.duplicates}"
            f" duplicates (bound {self.duplicate_bound}), recovery s: {recovery}"
            + (f"; {self.note}" if self.note else "")
        )


RECORDS = pytest.StashKey[list[FaultRecord]]()


def recorder(
    request: pytest.FixtureRequest, records: pytest.StashKey[list[FaultRecord]], *, report: str
) -> Callable[..., FaultRecord]:
    """Return what records a test's numbers.

    Each entry is printed, kept under ``records`` for the summary, and appended as a JSON
    line to the file the environment variable ``report`` names.
    """

    def write(**numbers: Any) -> FaultRecord:
        entry = FaultRecord(test=request.node.nodeid, **numbers)
        request.config.stash.setdefault(records, []).append(entry)
        print(entry.line())  # noqa: T201 - the measurement the suite reports
        path = os.environ.get(report)
        if path:
            with open(path, "a", encoding="utf-8") as out:  # noqa: PTH123
                out.write(json.dumps(asdict(entry)) + "\n")
        return entry

    return write


def summarise(
    terminalreporter: Any,
    config: pytest.Config,
    records: pytest.StashKey[list[FaultRecord]],
    *,
    title: str,
) -> None:
    """Print the numbers kept under ``records`` in a section of the terminal summary."""
    entries = config.stash.get(records, [])
    if entries:
        terminalreporter.section(title)
        for entry in entries:
            terminalreporter.write_line(entry.line())


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., FaultRecord]:
    """Record (print, keep for the summary, append to ACEMQ_FAULTS_REPORT) a test's numbers."""
    return recorder(request, RECORDS, report="ACEMQ_FAULTS_REPORT")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print every fault test's numbers at the end of the run."""
    summarise(terminalreporter, config, RECORDS, title="fault test numbers")
