"""The soak's flow and its books: the fault suite's mixed flow, plus a dead-letter queue.

``SoakFlow`` is tests/faults/conftest.py's ``MixedFlow`` (two lanes, each message planned
with its fate and counted by id) with the staging queues dead-lettering to a queue of the
test's own, messages a condition needs spread through the backlog, and the few ways a
condition may change where a message ends, each said by the test that allows it: a
message no broker channel would take dead-lettered, a copy nacked past its retries in
quarantine with the copies its retries left in the target. Everything else must end where
its plan says: ``MixedFlow.check`` (none lost, none misplaced, duplicates bounded).
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.e2e.conftest import ID_HEADER, Sidecar, eventually
from tests.faults.conftest import (
    Copy,
    Fate,
    FaultRecord,
    Lane,
    MixedFlow,
    declare_quarantine_exchange,
    declare_target,
    envelope,
    scrape,
)
from tests.faults.test_refusals import Tally, dead_letter_queue

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from tests.faults.conftest import RabbitCtl
    from tests.faults.private_node import PrivateNode
    from tests.support import Broker

PREFETCH = 100
ROUTES = 2
IN_FLIGHT_BOUND = PREFETCH * ROUTES  # what one lost channel or connection can leave unacked
SETTLE_TIMEOUT_S = 120.0
GRACE_S = 10.0
SPREAD = 8  # a condition's messages go in after every eighth of the backlog
ERROR_HEADER = "x-acemq-error"


@dataclass
class SoakFlow(MixedFlow):
    """The mixed flow with a dead-letter queue behind both staging queues.

    ``dead_lettered`` holds the ids found there that the test allowed there; they leave
    ``fates`` (so ``check`` does not count them lost) but stay in ``published``.
    ``reasons`` keeps the ``x-acemq-error`` of every quarantined copy, by id.
    """

    per_lane: int = 10_000
    dead_letter_queue: str = ""
    staging_type: str = "classic"
    dead_lettered: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def published(self) -> int:
        """How many messages were published (the dead-lettered included)."""
        return len(self.fates) + len(self.dead_lettered)

    async def add(
        self,
        lane: Lane,
        ids: Iterable[str],
        *,
        routing_key: str,
        fate: Fate,
        headers: dict[str, Any] | None = None,
        body: bytes = b"{}",
    ) -> None:
        """Publish (confirmed) one message per id on ``lane``, planned to end at ``fate``.

        On an acemq lane each carries a canonical envelope; ``headers`` are added.
        """
        for id_ in ids:
            own = envelope(id_) if lane.publishers == "acemq" else {}
            await self.broker.publish(
                lane.staging,
                body=body,
                headers={**own, **(headers or {})},
                exchange=lane.staging_exchange,
                routing_key=routing_key,
                message_id=id_,
            )
            self.fates[id_] = fate
            self.lane_of[id_] = lane.name

    async def publish_spread(self, lane: Lane, ids: list[str], **message: Any) -> None:
        """Publish the whole backlog with ``ids`` (see ``add``) spread evenly through ``lane``."""
        step = self.per_lane // SPREAD
        for part in range(SPREAD):
            await self.publish(step)
            await self.add(lane, ids[part::SPREAD], **message)
        await self.publish(self.per_lane - step * SPREAD)

    async def collect(self) -> None:
        """Take the targets; take the quarantine keeping each copy's reason."""
        for lane in self.lanes:
            await self._take(lane.target, Fate.TARGET)
        tally = Tally()
        await tally.take(self.broker, self.quarantined)
        for id_ in tally.ids:
            headers = tally.headers[id_]
            self.copies.append(Copy(id_, headers.get(ID_HEADER), Fate.QUARANTINE))
            self.reasons[id_] = str(headers.get(ERROR_HEADER))

    async def take_dead_letters(self, *, allowed: Iterable[str] = ()) -> int:
        """Take the dead-letter queue: every id there must be allowed there and nowhere else.

        Call once the sidecar has stopped. Return how many copies were there.
        """
        tally = Tally()
        await tally.take(self.broker, self.dead_letter_queue)
        copies = tally.copies()
        unexpected = sorted(set(copies) - set(allowed))
        assert not unexpected, f"{len(unexpected)} dead-lettered, e.g. {unexpected[:5]}"
        await self.collect()
        elsewhere = sorted({copy.id for copy in self.copies} & set(copies))
        assert not elsewhere, f"dead-lettered and also relayed or quarantined: {elsewhere[:5]}"
        for id_, count in copies.items():
            self.dead_lettered[id_] = count
            del self.fates[id_]
        return sum(copies.values())

    def replan_quarantined(self, ids: Iterable[str], *, reason: str) -> list[str]:
        """Let those of ``ids`` planned for the target but quarantined for ``reason`` be so.

        Their copies in the target are taken off the books; return the ids replanned.
        """
        allowed = {id_ for id_ in ids if self.fates.get(id_) is Fate.TARGET}
        moved = sorted(
            {c.id for c in self.copies if c.place is Fate.QUARANTINE and c.id in allowed}
        )
        for id_ in moved:
            assert reason in self.reasons[id_], f"{id_} quarantined for {self.reasons[id_]!r}"
            self.fates[id_] = Fate.QUARANTINE
        self.copies = [c for c in self.copies if not (c.id in moved and c.place is Fate.TARGET)]
        return moved

    def target_copies(self, ids: Iterable[str]) -> Counter[str]:
        """How many copies of each of ``ids`` are in their target queue."""
        wanted = set(ids)
        return Counter(c.id for c in self.copies if c.place is Fate.TARGET and c.id in wanted)

    def relayed(self, lane: Lane) -> int:
        """Distinct ids of ``lane`` found in its target queue."""
        return len(
            {
                c.id
                for c in self.copies
                if c.place is Fate.TARGET and self.lane_of.get(c.id) == lane.name
            }
        )

    def ids_of(self, lane: Lane) -> list[str]:
        """Every id published on ``lane`` (the dead-lettered included)."""
        return [i for i, name in self.lane_of.items() if name == lane.name]


async def declare_soak_flow(
    broker: Broker, *, per_lane: int, staging: dict[str, Any] | None = None, fanout: str = ""
) -> SoakFlow:
    """Declare the quarantine, a dead-letter queue and the two lanes.

    ``staging`` adds queue arguments to both staging queues (which dead-letter to the
    queue; quorum queues at the broker's defaults under ``ACEMQ_SOAK_STAGING=quorum``
    unless ``staging`` names a type); the lane called ``fanout`` gets a fanout target
    exchange instead of a topic one.
    """
    from tests.soak.conftest import STAGING_TYPE  # noqa: PLC0415 - the conftest imports us

    quarantine = broker.name("quarantine")
    quarantined = await broker.queue("quarantined")
    await declare_quarantine_exchange(broker, quarantine, quarantined)
    dlx, dlq = await dead_letter_queue(broker)
    arguments = {"x-dead-letter-exchange": dlx, "x-queue-type": STAGING_TYPE, **(staging or {})}
    lanes = []
    for name, publishers in (("orders", "acemq"), ("invoices", "apps")):
        stage = await broker.exchange(f"{name}.stage")
        lane = Lane(
            name=name,
            publishers=publishers,
            staging=await broker.queue(f"{name}.staging", **arguments),
            staging_exchange=stage,
            exchange=broker.name(f"{name}.exchange"),
            target=await broker.queue(f"{name}.target"),
        )
        await broker.bind(lane.staging, stage, "#")
        if name == fanout:
            await broker.exchange(f"{name}.exchange", kind="fanout")
            await broker.bind(lane.target, lane.exchange, routing_key="")
        else:
            await declare_target(broker, lane)
        lanes.append(lane)
    return SoakFlow(
        broker,
        tuple(lanes),
        quarantine,
        quarantined,
        per_lane=per_lane,
        dead_letter_queue=dlq,
        staging_type=str(arguments["x-queue-type"]),
    )


# --- the sidecar through a run ---------------------------------------------------------------


async def start(
    flow: SoakFlow, sidecar: Sidecar, *, wait_ready: bool = True, **broker: Any
) -> None:
    """Write the route map (prefetch 100, ``broker`` settings added) and start the sidecar."""
    route_map = flow.route_map(sidecar, prefetch=PREFETCH, shutdown_grace_s=GRACE_S)
    route_map["broker"].update(broker)
    sidecar.write(route_map)
    await sidecar.start(wait_ready=wait_ready)


async def wait_settled(flow: SoakFlow, sidecar: Sidecar) -> float:
    """Wait until both staging queues are empty and nothing is in flight; return when."""

    async def settled() -> bool:
        assert sidecar.is_running(), f"the sidecar died\n{sidecar.output()}"
        if await flow.staging_depth():
            return False
        metrics = await scrape(sidecar)
        return all(
            metrics.value("acemq_sidecar_in_flight", route=lane.name) == 0 for lane in flow.lanes
        )

    await eventually(
        settled,
        timeout_s=SETTLE_TIMEOUT_S,
        what="staging empty, nothing in flight",
        context=sidecar.output,
    )
    return time.monotonic()


async def held_still(sidecar: Sidecar, ctl: RabbitCtl, *args: str) -> None:
    """Run one rabbitmqctl command with the sidecar stopped (SIGSTOP), then let it go.

    rabbitmqctl takes a second or two to start, in which the sidecar would relay a few
    thousand: held still, the condition lands mid-flow, with deliveries in flight.
    """
    sidecar.send(signal.SIGSTOP)
    try:
        await ctl.run(*args)
    finally:
        sidecar.send(signal.SIGCONT)


async def books(
    flow: SoakFlow,
    sidecar: Sidecar,
    record: Callable[..., FaultRecord],
    *,
    bound: int,
    faults: int,
    resumed_s: Iterable[float] = (),
    note: str = "",
) -> int:
    """With the sidecar stopped: every id where it belongs, duplicates within ``bound``.

    Records the numbers (the note gets each route's relayed count) and returns the
    duplicates.
    """
    assert await flow.staging_depth() == 0, "staging is not empty"
    await flow.collect()
    duplicates = flow.check(max_duplicates=bound, context=sidecar.output)
    counts = ", ".join(f"{lane.name} {flow.relayed(lane)} relayed" for lane in flow.lanes)
    record(
        messages=flow.published,
        faults=faults,
        duplicates=duplicates,
        duplicate_bound=bound,
        recovery_s=tuple(resumed_s),
        note=(
            f"lost 0; {counts}; quarantined {len(set(flow.reasons))}; {note};"
            f" staging {flow.staging_type}"
        ),
    )
    return duplicates


@dataclass
class Moving:
    """A lane's target depth at a moment, to tell whether copies arrived since."""

    flow: SoakFlow
    lane: Lane
    depth: int = 0

    async def mark(self) -> Moving:
        """Note the lane's target depth now."""
        self.depth = await self.flow.broker.depth(self.lane.target)
        return self

    async def moved(self) -> int:
        """Copies that arrived on the lane's target since the mark."""
        return await self.flow.broker.depth(self.lane.target) - self.depth

    async def wait_moved(self, more: int, *, context: Callable[[], str]) -> float:
        """Wait for ``more`` copies since the mark (or an empty staging queue); return when."""

        async def moved() -> bool:
            if await self.moved() >= more:
                return True
            return await self.flow.broker.depth(self.lane.staging) == 0

        await eventually(
            moved,
            timeout_s=SETTLE_TIMEOUT_S,
            what=f"{more} more copies on {self.lane.name}",
            context=context,
        )
        return time.monotonic()


async def memory_watermark(ctl: RabbitCtl) -> tuple[str, ...]:
    """The node's memory watermark as ``set_vm_memory_high_watermark``'s arguments."""
    setting = await ctl.rabbit_env("vm_memory_high_watermark") or "0.4"
    absolute = re.fullmatch(r"\{absolute,\s*\"?([^\"}]+)\"?\}", setting)
    return ("absolute", absolute.group(1)) if absolute else (setting,)


def node_log_lines(node: PrivateNode, text: str | re.Pattern[str]) -> list[str]:
    """The private node's log lines that contain ``text`` (or match it), oldest first."""
    return [
        line
        for path in sorted(node.base.glob("log/*.log"))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
        if (text in line if isinstance(text, str) else text.search(line) is not None)
    ]
