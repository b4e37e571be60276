"""The I/O of ``acemq-sidecar quarantine list`` and ``replay``: read a queue, put it back.

The queue is read without changing it (:mod:`sidecar.quarantine.reader`): none of its
messages is acked (``list``), or only a replayed one, after the broker confirmed its
original back in staging (``replay``); closing the channels gives every other message
back to the broker, in order, and a command ends once the queue counts them ready again.
A kill at any moment loses nothing: the broker requeues what the connection held. The
rows, the filters (:mod:`sidecar.quarantine.rows`) and the original's headers
(:mod:`sidecar.settle.settlement`, :mod:`sidecar.contract`) are the pure core's; this module must
not decide what a row says or how a replay is stamped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TextIO

from sidecar.amqp import ChannelLostError, ClientOptions, PublishOutcome, connect
from sidecar.broker import nack_is_free
from sidecar.contract import ID, stamp_replay
from sidecar.errors import WireError
from sidecar.quarantine.reader import (
    INTERRUPTIONS,
    RETURN_WAIT_S,
    QuarantineInputError,
    QueueReader,
    queue_depth,
)
from sidecar.quarantine.rows import row_of
from sidecar.settle import (
    ORIGINAL_HEADER_BYTES,
    QUARANTINED_FROM,
    QUEUE_COUNTERS,
    original_headers,
)

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from sidecar.amqp import Channel, Connection, Delivery
    from sidecar.broker import BrokerAddress
    from sidecar.clock import Clock
    from sidecar.contract import PropertyValue
    from sidecar.quarantine.reader import Held
    from sidecar.quarantine.rows import QuarantinedMessage, Selection
    from sidecar.wire import FieldValue

__all__ = [
    "BrokerTarget",
    "ReadReport",
    "Replay",
    "ReplayReport",
    "Unreplayable",
    "list_messages",
    "open_connection",
    "plan_replay",
    "replay_messages",
]

PUBLISHES_IN_FLIGHT: Final = 256  # replays published and awaiting their confirm at once
SLOW_CONFIRM_S: Final = 30.0
CONNECTION_NAME: Final = "acemq-sidecar quarantine"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerTarget:
    """Where the broker is and how to reach it; show ``address.masked()``, never the URL."""

    address: BrokerAddress
    ssl_context: ssl.SSLContext | None = None
    heartbeat_s: int = 30
    connect_timeout_s: float = 10.0


async def open_connection(target: BrokerTarget) -> Connection:
    """Connect; a failure is a ConnectionError whose text never holds the password."""
    return await connect(
        target.address,
        heartbeat_s=target.heartbeat_s,
        connect_timeout_s=target.connect_timeout_s,
        ssl_context=target.ssl_context,
        name=CONNECTION_NAME,
        options=ClientOptions(match_header=ID, nack_is_free=nack_is_free),  # as the relay's
    )


# --- list -----------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class ReadReport:
    """What a command read: how many at the start, how many read, how many selected."""

    at_start: int
    consumers: int
    read: int = 0
    selected: int = 0
    shrank: bool = False
    interrupted: str | None = None  # why the reading stopped early: the connection, the queue
    not_back: int = 0  # given back, but not yet counted ready again when the command ended

    def notes(self) -> list[str]:
        """Return the lines that tell the operator what the reading could not see."""
        lines = [f"read {self.read} of the {self.at_start} message(s) the queue held at the start"]
        if self.consumers:
            lines.append(
                f"the queue has {self.consumers} other consumer(s): the messages they hold"
                " unacked were not seen"
            )
        if self.shrank:
            lines.append("the queue held fewer messages than at the start (another consumer?)")
        if self.interrupted is not None:
            lines.append(
                f"interrupted: {self.interrupted}; every message not acked is back in the queue"
            )
        if self.not_back:
            lines.append(
                f"{self.not_back} message(s) given back were not yet counted ready in the queue"
                f" after {RETURN_WAIT_S:g}s (another consumer may hold them): a command started"
                " now may not see them"
            )
        return lines


async def list_messages(
    connection: Connection,
    queue: str,
    selection: Selection,
    *,
    now_ms: int,
    on_row: Callable[[QuarantinedMessage], None],
) -> ReadReport:
    """Hand each selected row to ``on_row`` in queue order; ack nothing, change nothing."""
    at_start, consumers = await queue_depth(connection, queue)
    report = ReadReport(at_start=at_start, consumers=consumers)
    if at_start == 0 or selection.limit == 0:
        return report
    reader = QueueReader(
        connection, queue, total=at_start, tag="acemq-sidecar.quarantine.rows.list"
    )
    try:
        async with contextlib.aclosing(reader.deliveries()) as stream:
            async for held in stream:
                row = _row(held.delivery, reader.read, now_ms)
                if selection.matches(row):
                    report.selected += 1
                    on_row(row)
                    if selection.limit is not None and report.selected >= selection.limit:
                        break
    except INTERRUPTIONS as e:
        report.interrupted = str(e)
    finally:
        report.read, report.shrank = reader.read, reader.shrank
        await reader.close()
        report.not_back = reader.not_back
    return report


def _row(delivery: Delivery, position: int, now_ms: int) -> QuarantinedMessage:
    return row_of(
        position=position,
        routing_key=delivery.routing_key,
        properties=delivery.properties,
        headers=delivery.headers,
        now_ms=now_ms,
    )


# --- replay ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """Publish this original to ``queue`` through the default exchange."""

    queue: str
    properties: dict[str, PropertyValue]
    headers: dict[str, FieldValue]


@dataclass(frozen=True, slots=True)
class Unreplayable:
    """A quarantine copy that cannot be replayed; it stays in quarantine."""

    reason: str


def plan_replay(
    delivery: Delivery, *, quarantine: str, to: str | None, now_ms: int
) -> Replay | Unreplayable:
    """Decide what to publish for one quarantine copy: its original, stamped as a replay.

    The quarantine's headers come off and the envelope error it displaced goes back
    (``original_headers``); ``x-delivery-count`` and ``x-acquired-count`` go too, as a
    quorum quarantine queue counts its own deliveries in them and the staging queue keeps
    its own count. Body and
    properties are the copy's, so the same as the original's.
    """
    if delivery.undecodable is not None:
        return Unreplayable("the quarantine copy's header table cannot be decoded")
    destination = to
    if destination is None:
        source = delivery.headers.get(QUARANTINED_FROM)
        destination = source if isinstance(source, str) and source else None
    if destination is None:
        return Unreplayable(f"no {QUARANTINED_FROM} header: give --to QUEUE")
    if ORIGINAL_HEADER_BYTES in delivery.headers:
        return Unreplayable(
            "unread original: its content header was too large to read, its properties and"
            " headers are lost with it; only the body was kept"
        )
    original = original_headers(delivery.headers)
    if original is None:
        return Unreplayable(
            "undecodable original: its header table travels as raw bytes in"
            " acemq-original-headers, there is no table to restore"
        )
    for counter in QUEUE_COUNTERS:
        original.pop(counter, None)
    headers = stamp_replay(original, replayed_from=quarantine, now_ms=now_ms)
    return Replay(queue=destination, properties=dict(delivery.properties), headers=headers)


@dataclass(slots=True, kw_only=True)
class ReplayReport:
    """What a replay did; ``failed`` counts by reason, each failure left in quarantine."""

    read: ReadReport
    dry_run: bool
    replayed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0  # replayed but the quarantine copy could not be acked: it is still there

    @property
    def skipped(self) -> int:
        """Messages read but not selected: left in quarantine as they were."""
        return self.read.read - self.read.selected

    @property
    def all_replayed(self) -> bool:
        """Whether every selected message was replayed (or, dry, would be)."""
        return not self.failed and self.replayed == self.read.selected

    def summary(self) -> list[str]:
        """Return the summary lines printed at the end."""
        verb = "would replay" if self.dry_run else "replayed"
        failed = sum(self.failed.values())
        head = (
            f"{verb} {self.replayed}, skipped {self.skipped} (not selected),"
            f" failed {failed}, of {self.read.read} read"
        )
        lines = [head]
        lines += [f"  failed {count}: {reason}" for reason, count in sorted(self.failed.items())]
        if self.duplicates:
            lines.append(
                f"  {self.duplicates} replayed but still in quarantine (its ack was lost):"
                " replaying again would duplicate it"
            )
        return lines


class Progress:
    """A progress line on a terminal (stderr); nothing when it is not a terminal."""

    def __init__(self, stream: TextIO, *, total: int) -> None:
        self._stream = stream
        self._total = total
        self._shown = -1
        self._on = stream.isatty() and total > 0

    def update(self, report: ReplayReport) -> None:
        """Redraw when the share read moved by a percent."""
        if not self._on:
            return
        done = report.read.read
        percent = done * 100 // self._total
        if percent == self._shown:
            return
        self._shown = percent
        bar = "#" * (percent // 4)
        failed = sum(report.failed.values())
        self._stream.write(
            f"\r[{bar:<25}] {done}/{self._total} read, {report.replayed} replayed, {failed} failed"
        )
        self._stream.flush()

    def end(self) -> None:
        """Leave the line, so the summary starts on its own."""
        if self._on and self._shown >= 0:
            self._stream.write("\n")
            self._stream.flush()


async def replay_messages(
    connection: Connection,
    queue: str,
    selection: Selection,
    *,
    to: str | None,
    dry_run: bool,
    clock: Clock,
    progress: TextIO,
) -> ReplayReport:
    """Replay each selected message to its staging queue; ack its copy only after the confirm.

    Every other message, and every one whose replay failed, goes back to the queue when the
    channels close. A crash anywhere leaves a message in quarantine, in staging, or (between
    a confirm and its ack) in both: a duplicate, never a loss.
    """
    at_start, consumers = await queue_depth(connection, queue)
    if to is not None:
        await queue_depth(connection, to)  # a --to that does not exist is bad input
    report = ReplayReport(read=ReadReport(at_start=at_start, consumers=consumers), dry_run=dry_run)
    if at_start == 0 or selection.limit == 0:
        return report
    bar = Progress(progress, total=at_start)
    reader = QueueReader(
        connection, queue, total=at_start, tag="acemq-sidecar.quarantine.rows.replay"
    )
    publisher = await connection.channel(prefetch=1)
    staging_exists: dict[str, bool] = {}
    room = asyncio.Semaphore(PUBLISHES_IN_FLIGHT)
    try:
        async with asyncio.TaskGroup() as tasks, contextlib.aclosing(reader.deliveries()) as stream:
            async for held in stream:
                report.read.read = reader.read
                row = _row(held.delivery, reader.read, clock.now_ms())
                if not selection.matches(row):
                    bar.update(report)
                    continue
                report.read.selected += 1
                plan = plan_replay(held.delivery, quarantine=queue, to=to, now_ms=clock.now_ms())
                if isinstance(plan, Unreplayable):
                    report.failed[plan.reason] += 1
                elif dry_run:
                    await _dry(connection, plan, report, staging_exists)
                else:
                    await room.acquire()  # in order: publishes leave in the queue's order
                    tasks.create_task(
                        _replay_one(
                            held, plan, reader=reader, publisher=publisher, report=report, room=room
                        ),
                        name=f"replay-{reader.read}",
                    )
                bar.update(report)
                if selection.limit is not None and report.read.selected >= selection.limit:
                    break
    except* INTERRUPTIONS as group:
        report.read.interrupted = str(group.exceptions[0])
    finally:
        report.read.read, report.read.shrank = reader.read, reader.shrank
        bar.update(report)
        bar.end()
        await reader.close()
        report.read.not_back = reader.not_back
        await publisher.close()
    return report


async def _dry(
    connection: Connection, plan: Replay, report: ReplayReport, exists: dict[str, bool]
) -> None:
    if plan.queue not in exists:
        try:
            await queue_depth(connection, plan.queue)
            exists[plan.queue] = True
        except QuarantineInputError:
            exists[plan.queue] = False
    if exists[plan.queue]:
        report.replayed += 1
    else:
        report.failed[f'staging queue "{plan.queue}" does not exist'] += 1


async def _replay_one(
    held: Held,
    plan: Replay,
    *,
    reader: QueueReader,
    publisher: Channel,
    report: ReplayReport,
    room: asyncio.Semaphore,
) -> None:
    try:
        outcome = await publisher.publish(
            held.delivery.body,
            exchange="",
            routing_key=plan.queue,
            properties=plan.properties,
            headers=plan.headers,
            slow_after_s=SLOW_CONFIRM_S,
            on_slow=lambda: None,
        )
    except WireError as e:
        report.failed[f"the original cannot be encoded: {e}"] += 1
        return
    except ChannelLostError as e:
        report.failed[f"the publish channel closed: {e}"] += 1
        return
    finally:
        room.release()
    match outcome:
        case PublishOutcome.CONFIRMED:
            # Only now: the original is in staging, so the copy can go.
            if await reader.ack(held):
                report.replayed += 1
            else:
                report.duplicates += 1
                report.failed[
                    "replayed, but the quarantine copy's channel closed before its ack"
                ] += 1
        case PublishOutcome.RETURNED:
            report.failed[
                f'returned: the staging queue "{plan.queue}" does not exist'
                " (create it, or give --to QUEUE)"
            ] += 1
        case PublishOutcome.NACKED:
            report.failed[f'the broker refused (nacked) the publish to "{plan.queue}"'] += 1
