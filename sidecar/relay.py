"""The I/O loop: consume, normalise, publish with confirms, ack; quarantine what cannot go.

This module owns the settlement of every staging message. Its one rule: a delivery is
acked only after the broker confirmed its normalised copy on the target exchange, or its
quarantine copy on the quarantine exchange. Anything else leaves it unacked, and the
broker redelivers it. It must not know AMQP client objects (``sidecar.amqp`` does) or
contract rules (``sidecar.contract`` does); it only wires them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.amqp import (
    Channel,
    ChannelLostError,
    Connection,
    Delivery,
    MissingEntityError,
    PublishOutcome,
)
from sidecar.contract import ORIGIN, Policy, Reject, Relay, move_user_id, normalise
from sidecar.errors import WireError
from sidecar.metrics import Outcome
from sidecar.routes import Mode
from sidecar.waits import first_of, sleep_unless
from sidecar.wire import ByteArray

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.contract import PropertyValue, Verdict
    from sidecar.metrics import Metrics
    from sidecar.routes import Route
    from sidecar.wire import FieldValue

__all__ = ["Backoff", "Clock", "RouteWorker", "quarantine_copy"]

log = logging.getLogger(__name__)

QUARANTINED_FROM = "acemq-quarantined-from"
ERROR_HEADER = "x-acemq-error"
ORIGINAL_HEADERS = "acemq-original-headers"
ORIGINAL_ERROR = "acemq-original-error"
CONFIRM_TIMEOUT_S = 30.0  # after this a publish without a confirm is reported, not resent
HEALTHY_CHANNEL_S = 30.0  # a channel that lived this long resets the reopen backoff
VIOLATION_LOG_INTERVAL_S = 60.0
REASON_MAX = 4096  # characters of a reason kept in x-acemq-error and in a log line
SHORT_REASON_MAX = 300  # a reason and a note that fit the smallest frame the broker allows
ORIGIN_LOG_MAX = 200  # characters of an origin in a log line


@dataclass(frozen=True, slots=True, kw_only=True)
class Clock:
    """The two clocks the shell reads: wall time for the contract, monotonic for timing."""

    now_ms: Callable[[], int]
    monotonic: Callable[[], float]


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter: half the step fixed, half random, capped."""

    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """Return the next delay and step up; never zero, so a failing loop cannot spin."""
        step = min(self.cap_s, self.base_s * float(2**self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return step / 2 + self.rng.uniform(0, step / 2)

    def reset(self) -> None:
        """Start again from the base delay after a success."""
        self.attempt = 0


def publishable_properties(
    properties: Mapping[str, PropertyValue], headers: dict[str, FieldValue], *, login: str
) -> dict[str, PropertyValue]:
    """Return properties the broker will accept from our login (CONTRACT.md section 2).

    An original republished as it was (audit mode, quarantine) loses a foreign user_id
    to ``acemq-original-user-id`` just as a normalised copy does.
    """
    result = dict(properties)
    move_user_id(result, headers, login=login)
    return result


def quarantine_copy(
    delivery: Delivery, *, reason: str, queue: str, login: str
) -> tuple[dict[str, PropertyValue], dict[str, FieldValue]]:
    """Return the properties and headers of a delivery's quarantine copy (DESIGN.md).

    The headers are as received plus the reason and the staging queue; an envelope error
    already there moves to ``acemq-original-error``; a table the codec could not read
    travels whole, as a byte array, in ``acemq-original-headers``.
    """
    headers: dict[str, FieldValue] = dict(delivery.headers)
    if delivery.undecodable is not None:
        headers[ORIGINAL_HEADERS] = ByteArray(delivery.undecodable.raw)
    if ERROR_HEADER in headers:  # the envelope's own error is kept, not overwritten
        headers[ORIGINAL_ERROR] = headers[ERROR_HEADER]
    headers[ERROR_HEADER] = bounded(reason)
    headers[QUARANTINED_FROM] = queue
    return publishable_properties(delivery.properties, headers, login=login), headers


def bounded(text: str, limit: int = REASON_MAX) -> str:
    """Return ``text`` cut to ``limit`` characters, saying how much was cut.

    A reason can list thousands of header names, and an origin can be 64 KiB: in a header
    they could outgrow the broker's frame, in a log line they would flood the log.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def _reason_kind(reason: str) -> str:
    """Return the fixed start of a quarantine reason: what the sidecar wrote, not the data.

    Reasons quote names and values from the message after a colon or a double quote.
    """
    return re.split(r'[:"]', reason, maxsplit=1)[0][:80]


def _reason_only(reason: str, queue: str) -> dict[str, FieldValue]:
    """Return the headers of a quarantine copy that cannot carry the original ones."""
    return {ERROR_HEADER: reason, QUARANTINED_FROM: queue}


def _same_table(ours: Mapping[str, FieldValue], theirs: Mapping[str, FieldValue]) -> bool:
    """Return whether two tables would encode to the same bytes.

    Same names in the same order, each value the very same object or a text or integer of
    the same class and value (so a change of integer width is a change).
    """
    return len(ours) == len(theirs) and all(
        a == b and (x is y or (type(x) is type(y) and isinstance(x, str | int) and x == y))
        for (a, x), (b, y) in zip(ours.items(), theirs.items(), strict=True)
    )


def _origin(verdict: Verdict, delivery: Delivery) -> object:
    """Return the origin for a log line: the normalised one, else the one it arrived with."""
    headers = verdict.headers if isinstance(verdict, Relay) else delivery.headers
    origin = headers.get(ORIGIN)
    if not isinstance(origin, str):
        origin = delivery.properties.get("app_id")
    return bounded(origin, ORIGIN_LOG_MAX) if isinstance(origin, str) else origin


def _slow_reason(exchange: str) -> str:
    return (
        f"no confirm from the broker within {CONFIRM_TIMEOUT_S:.0f}s for a publish to exchange"
        f' "{exchange}" (a memory or disk alarm?); still waiting, it will not be sent twice'
    )


class RoutePausedError(Exception):
    """The broker will not take this route's copies for now; the route must pause."""


class QuarantineFailedError(RoutePausedError):
    """The quarantine exchange did not take a copy; the route must pause."""


@dataclass(slots=True)
class _RateLimit:
    """Lets a key through at most once per interval (a violation kind, a pause reason).

    ``admit`` returns None for a key to stay quiet about, else how many times the key was
    kept quiet since it was last let through, so the line can say what it stands for.
    """

    interval_s: float
    last: dict[tuple[str, str], float] = field(default_factory=dict)
    quiet: dict[tuple[str, str], int] = field(default_factory=dict)

    def admit(self, key: tuple[str, str], now: float) -> int | None:
        seen = self.last.get(key)
        if seen is not None and now - seen < self.interval_s:
            self.quiet[key] = self.quiet.get(key, 0) + 1
            return None
        self.last[key] = now
        return self.quiet.pop(key, 0)

    def take_quiet(self) -> dict[tuple[str, str], int]:
        """Return the keys kept quiet since their last line, with how often; forget them."""
        quiet, self.quiet = self.quiet, {}
        return quiet


@dataclass(frozen=True, slots=True, kw_only=True)
class _Copy:
    """What to publish to the target for one delivery, decided once."""

    properties: dict[str, PropertyValue]
    headers: dict[str, FieldValue]
    routing_key: str
    outcome: Outcome
    # The delivery's own content header when the copy changes nothing in it: sent as it
    # came, byte for byte, instead of encoding the same properties and headers again.
    content_header: bytes | None = None


@dataclass(frozen=True, slots=True)
class _ToQuarantine:
    """The delivery goes to quarantine with this reason."""

    reason: str


class _Hold:
    """One delivery's share in the route's count of held deliveries."""

    __slots__ = ("_held", "_worker")

    def __init__(self, worker: RouteWorker) -> None:
        self._worker = worker
        self._held = False

    def take(self, reason: str) -> None:
        """Count the delivery as held (once) and report the route paused with the reason."""
        if not self._held:
            self._held = True
            self._worker._held += 1  # noqa: SLF001 - the worker's own bookkeeping
        self._worker._pause(reason)  # noqa: SLF001

    def release(self) -> None:
        """Stop counting the delivery as held (it was settled or let go)."""
        if self._held:
            self._held = False
            self._worker._held -= 1  # noqa: SLF001


class RouteWorker:
    """Consumes one route's staging queue and settles every delivery it receives."""

    def __init__(
        self,
        route: Route,
        *,
        quarantine_exchange: str,
        login: str,
        metrics: Metrics,
        clock: Clock,
        new_id: Callable[[], str],
        rng: random.Random | None = None,
    ) -> None:
        self.route = route
        self._quarantine_exchange = quarantine_exchange
        self._login = login
        self._policy = Policy(publishers=route.publishers, origin=route.origin, login=login)
        self._metrics = metrics
        self._clock = clock
        self._new_id = new_id
        self._backoff = Backoff(rng=rng or random.Random())  # noqa: S311 - jitter, not security
        self._stop = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self._pause_reason: str | None = "starting"
        self._violation_log = _RateLimit(VIOLATION_LOG_INTERVAL_S)
        self._pause_log = _RateLimit(VIOLATION_LOG_INTERVAL_S)
        self._quarantine_log = _RateLimit(VIOLATION_LOG_INTERVAL_S)
        self._consumer_tag = f"acemq-sidecar.{route.name}"
        # False once a reload has handed the route's gauge to this worker's successor.
        self._owns_gauge = True
        self._held = 0  # deliveries waiting for the broker to take their copy
        self._acked_since_open = False

    # --- state read by /readyz (from the HTTP thread: plain attribute reads only) ---

    @property
    def pause_reason(self) -> str | None:
        """Why the route is not consuming, or None while it is."""
        return self._pause_reason

    # --- lifecycle ---

    def request_stop(self, *, replaced: bool = False) -> None:
        """Ask the worker to stop consuming and settle what it holds.

        ``replaced``: a successor runs the same route now (a reload), so this worker must
        no longer report the route up or down.
        """
        if replaced:
            self._owns_gauge = False
        self._stop.set()

    def _set_gauge(self, *, up: bool) -> None:
        if self._owns_gauge:
            self._metrics.set_route_up(self.route.name, up=up)

    async def run(self, connection: Connection, *, grace_s: float) -> None:
        """Consume until stopped or the connection drops; retry a paused route with backoff.

        The backoff is reset by progress (an ack), not by a channel that merely opened:
        a route whose every publish fails must not reopen (and requeue) in a tight loop.
        """
        while not self._stop.is_set() and connection.is_open:
            try:
                channel = await self._open_unless_stopped(connection)
                if channel is None:
                    break
            except (MissingEntityError, ChannelLostError) as e:
                self._pause(str(e))
            except Exception as e:
                # Never let one route take the others down with it.
                log.exception("route %s: unexpected error while starting", self.route.name)
                self._pause(f"unexpected error while starting: {e!r}")
            else:
                opened = self._clock.monotonic()
                self._acked_since_open = False
                reason = await self._consume_until_closed(channel, connection)
                if self._stop.is_set():
                    await self._drain(channel, grace_s=grace_s)
                    break
                if self._acked_since_open or self._clock.monotonic() - opened > HEALTHY_CHANNEL_S:
                    self._backoff.reset()  # it worked for a while: a fresh failure, not a loop
                self._pause(reason)
                await channel.close()
            await sleep_unless(self._stop, self._backoff.next_delay())
        self._set_gauge(up=False)
        if self._pause_reason is None:
            self._pause_reason = "stopped"
        self._log_quiet()

    def _log_quiet(self) -> None:
        """Say how many lines the rate limits held back, so a stop loses no count."""
        route = self.route.name
        for (kind, header), count in self._violation_log.take_quiet().items():
            log.info(
                "route %s: %d more %s on %s since the last line",
                route,
                count,
                kind,
                header,
                extra={"route": route, "kind": kind, "header": header, "suppressed": count},
            )
        for (_, reason), count in self._quarantine_log.take_quiet().items():
            log.info(
                "route %s quarantined %d more messages (%s...) since the last line",
                route,
                count,
                reason,
                extra={"route": route, "suppressed": count},
            )

    async def _open_unless_stopped(self, connection: Connection) -> Channel | None:
        """Open the route's channel, or give up when a stop comes first.

        A broker under an alarm may never answer the opening handshake; SIGTERM must not
        wait for it.
        """
        opening = asyncio.create_task(self._open(connection), name=f"open:{self.route.name}")
        stopping = asyncio.create_task(self._stop.wait(), name=f"stop:{self.route.name}")
        try:
            await asyncio.wait((opening, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if opening.done():
            channel = opening.result()
            if not self._stop.is_set():
                return channel
            await channel.close()
            return None
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await opening
        return None

    async def _open(self, connection: Connection) -> Channel:
        route = self.route
        await connection.check_queue(route.queue)
        await connection.check_exchange(route.exchange)
        await connection.check_exchange(self._quarantine_exchange)
        channel = await connection.channel(prefetch=route.prefetch)

        async def on_delivery(delivery: Delivery) -> None:
            await self._settle(channel, delivery)

        # Up before the first delivery can arrive, so a delivery's pause is not undone.
        self._set_up()
        try:
            await channel.consume(route.queue, on_delivery, consumer_tag=self._consumer_tag)
        except BaseException:
            await channel.close()
            raise
        return channel

    async def _consume_until_closed(self, channel: Channel, connection: Connection) -> str:
        """Wait until the channel or connection closes, or a stop; return what happened."""
        which, first = await first_of(
            channel.wait_closed(), connection.wait_closed(), self._stop.wait()
        )
        return str(first.result()) if which == 0 else ("connection lost", "stopping")[which - 1]

    async def _drain(self, channel: Channel, *, grace_s: float) -> None:
        """Stop deliveries, settle in-flight work within the grace period, close."""
        deadline = asyncio.get_running_loop().time() + grace_s
        await channel.cancel(self._consumer_tag)
        log.info(
            "route %s draining %d in-flight messages",
            self.route.name,
            self._in_flight,
            extra={"route": self.route.name, "in_flight": self._in_flight},
        )
        try:
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        except TimeoutError:
            log.warning(
                "route %s: %d messages unsettled after %.1fs; the broker will redeliver them",
                self.route.name,
                self._in_flight,
                grace_s,
                extra={"route": self.route.name, "in_flight": self._in_flight},
            )
        await channel.close()

    def _set_up(self) -> None:
        if self._held == 0:  # deliveries held on an old channel keep the route paused
            self._pause_reason = None
            self._set_gauge(up=True)
        log.info(
            "route %s consuming %s -> exchange %r",
            self.route.name,
            self.route.queue,
            self.route.exchange,
            extra={"route": self.route.name},
        )

    def _pause(self, reason: str) -> None:
        if self._stop.is_set():
            return
        self._set_gauge(up=False)
        now = self._clock.monotonic()
        # Held deliveries may alternate reasons at every retry: log each at most per interval.
        if self._pause_reason is None or self._pause_log.admit(("pause", reason), now) is not None:
            log.warning(
                "route %s paused: %s; retrying with backoff",
                self.route.name,
                reason,
                extra={"route": self.route.name},
            )
        self._pause_reason = reason

    # --- one delivery ---

    async def _settle(self, channel: Channel, delivery: Delivery) -> None:
        """Settle one delivery: publish a copy, wait for the confirm, then ack.

        The copy is decided once. When the broker will not take it for now (a nack, a
        quarantine that does not route), the delivery is held and retried with its own
        backoff on this channel: closing the channel would requeue it, and a quorum queue
        counts every requeue against its delivery limit. A publish without a confirm is
        never sent twice: its first outcome is awaited however long it takes.
        """
        route = self.route.name
        self._in_flight += 1
        self._idle.clear()
        self._metrics.add_in_flight(route, 1)
        started = self._clock.monotonic()
        hold = _Hold(self)
        try:
            outcome = await self._carry_out(channel, delivery, self._plan(delivery), hold)
            if outcome is not None and await channel.ack(delivery.delivery_tag):
                self._metrics.observe_message(route, outcome, self._clock.monotonic() - started)
                hold.release()
                self._progressed(channel)
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", route, e)
        except MissingEntityError as e:
            self._pause(str(e))
        except Exception:
            log.exception("route %s: a delivery could not be settled", route)
            self._pause("internal error; see the log")
            await channel.close()  # the broker redelivers it, after the route's backoff
        finally:
            hold.release()
            self._in_flight -= 1
            self._metrics.add_in_flight(route, -1)
            if self._in_flight == 0:
                self._idle.set()

    def _plan(self, delivery: Delivery) -> _Copy | _ToQuarantine:
        """Decide, once per delivery, what to publish: a copy for the target, or quarantine."""
        try:
            return self._decide(delivery)
        except Exception as e:
            # A bug, not a message problem: requeueing would spin on the same message.
            log.exception("route %s: unexpected error while normalising", self.route.name)
            return _ToQuarantine(f"internal error: {e!r}")

    def _decide(self, delivery: Delivery) -> _Copy | _ToQuarantine:
        if delivery.undecodable is not None:
            return _ToQuarantine(f"header table cannot be decoded: {delivery.undecodable.error}")
        verdict = normalise(
            delivery.routing_key,
            delivery.properties,
            delivery.headers,
            policy=self._policy,
            now_ms=self._clock.now_ms(),
            new_id=self._new_id,
        )
        if verdict.violations:
            self._record_violations(verdict, delivery)
        audit = self.route.mode is Mode.AUDIT
        match verdict:
            case Reject() if not audit:
                return _ToQuarantine(verdict.reason)
            case Relay() if not audit:
                properties, headers = dict(verdict.properties), dict(verdict.headers)
                outcome = Outcome.RELAYED
            case _:
                headers = dict(delivery.headers)
                properties = publishable_properties(delivery.properties, headers, login=self._login)
                outcome = Outcome.AUDITED
        routing_key = self.route.routing_key
        if routing_key is None:
            routing_key = delivery.routing_key
        if self.route.exchange == "" and routing_key == self.route.queue:
            return _ToQuarantine(
                f'the copy would go back into staging queue "{self.route.queue}" (default'
                f' exchange, routing key "{routing_key}"); set to.routing_key to its target queue'
            )
        unchanged = properties == delivery.properties and _same_table(headers, delivery.headers)
        return _Copy(
            properties=properties,
            headers=headers,
            routing_key=routing_key,
            outcome=outcome,
            content_header=delivery.content_header if unchanged else None,
        )

    async def _carry_out(
        self, channel: Channel, delivery: Delivery, plan: _Copy | _ToQuarantine, hold: _Hold
    ) -> Outcome | None:
        """Publish what the plan says until the broker takes it; None when we must let go."""
        backoff: Backoff | None = None
        while True:
            try:
                if isinstance(plan, _ToQuarantine):
                    return await self._quarantine(channel, delivery, reason=plan.reason, hold=hold)
                result = await self._publish_copy(channel, delivery, plan, hold)
            except RoutePausedError as e:
                hold.take(str(e))
                backoff = backoff or Backoff(rng=self._backoff.rng)
                await sleep_unless(self._stop, backoff.next_delay())
                if self._stop.is_set() or not channel.is_open:
                    return None  # the broker redelivers it
                continue
            except (ChannelLostError, MissingEntityError):
                raise
            except Exception as e:
                if isinstance(plan, _ToQuarantine):
                    raise
                log.exception("route %s: unexpected error while publishing", self.route.name)
                plan = _ToQuarantine(f"internal error: {e!r}")
                continue
            if isinstance(result, _ToQuarantine):
                plan = result  # returned or unwritable: the original goes to quarantine
                continue
            return result

    async def _publish_copy(
        self, channel: Channel, delivery: Delivery, copy: _Copy, hold: _Hold
    ) -> Outcome | _ToQuarantine:
        try:
            published = await self._publish(
                channel,
                delivery,
                exchange=self.route.exchange,
                routing_key=copy.routing_key,
                properties=copy.properties,
                headers=copy.headers,
                hold=hold,
                content_header=copy.content_header,
            )
        except (WireError, ValueError, TypeError) as e:
            # The normalised copy cannot be written (a 300-byte id cannot be a message_id).
            return _ToQuarantine(f"the normalised message cannot be encoded: {e}")
        match published:
            case PublishOutcome.CONFIRMED:
                return copy.outcome
            case PublishOutcome.RETURNED:
                return _ToQuarantine(
                    f'unroutable: exchange "{self.route.exchange}" has no binding for'
                    f' routing key "{copy.routing_key}"'
                )
            case PublishOutcome.NACKED:
                raise RoutePausedError(
                    f'the broker refused (nacked) a publish to exchange "{self.route.exchange}";'
                    " is a target queue full with overflow reject-publish?"
                )

    async def _publish(
        self,
        channel: Channel,
        delivery: Delivery,
        *,
        exchange: str,
        routing_key: str,
        properties: dict[str, PropertyValue],
        headers: dict[str, FieldValue],
        hold: _Hold,
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish a copy of the delivery's body; a confirm slower than the limit holds it."""
        return await channel.publish(
            delivery.body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            slow_after_s=CONFIRM_TIMEOUT_S,
            on_slow=lambda: hold.take(_slow_reason(exchange)),
            content_header=content_header,
        )

    def _progressed(self, channel: Channel) -> None:
        """Note a settled delivery: once nothing is held, the route works (again)."""
        self._acked_since_open = True
        if (
            self._pause_reason is not None
            and self._held == 0
            and channel.is_open
            and not self._stop.is_set()
        ):
            log.info("route %s resumed", self.route.name, extra={"route": self.route.name})
            self._pause_reason = None
            self._set_gauge(up=True)

    async def _quarantine(
        self, channel: Channel, delivery: Delivery, *, reason: str, hold: _Hold
    ) -> Outcome:
        properties, headers = quarantine_copy(
            delivery, reason=reason, queue=self.route.queue, login=self._login
        )

        async def quarantine(headers: dict[str, FieldValue]) -> PublishOutcome:
            return await self._publish(
                channel,
                delivery,
                exchange=self._quarantine_exchange,
                routing_key=self.route.name,
                properties=properties,
                headers=headers,
                hold=hold,
            )

        try:
            published = await quarantine(headers)
        except (WireError, ValueError, TypeError) as e:
            # The original headers plus the reason outgrow the broker's frame (or, a last
            # resort, do not encode): keep the body, the properties and the reason rather
            # than hold the message forever; at the broker's smallest frame size, a short
            # reason.
            log.warning(
                "route %s: the quarantine copy cannot carry the original headers: %s",
                self.route.name,
                e,
                extra={"route": self.route.name},
            )
            note = f" (the original headers could not be written: {e})"
            try:
                published = await quarantine(
                    _reason_only(f"{bounded(reason)}{note}", self.route.queue)
                )
            except WireError:
                short = f"{bounded(reason, SHORT_REASON_MAX)}{bounded(note, SHORT_REASON_MAX)}"
                published = await quarantine(_reason_only(short, self.route.queue))
        if published is not PublishOutcome.CONFIRMED:
            raise QuarantineFailedError(
                f'quarantine exchange "{self._quarantine_exchange}" {published.value} the copy'
                f' (routing key "{self.route.name}"); bind a queue to it. Messages stay in'
                " staging until it takes them"
            )
        # One line per kind of reason per interval: the quarantine queue keeps every reason.
        suppressed = self._quarantine_log.admit(
            ("quarantine", _reason_kind(reason)), self._clock.monotonic()
        )
        if suppressed is not None:
            log.info(
                "route %s quarantined a message: %s",
                self.route.name,
                bounded(reason),
                extra={
                    "route": self.route.name,
                    "message_id": delivery.properties.get("message_id"),
                    "suppressed": suppressed,
                },
            )
        return Outcome.QUARANTINED

    def _record_violations(self, verdict: Verdict, delivery: Delivery) -> None:
        """Count every violation; log each (kind, header) at most once per interval.

        The log line carries what a metric label must not: the real names of stripped
        reserved headers and a reject's reason (CONTRACT.md section 6).
        """
        route = self.route.name
        pairs = [(str(v.kind), v.header) for v in verdict.violations]
        self._metrics.count_violations(route, pairs)
        now = self._clock.monotonic()
        origin = _origin(verdict, delivery)
        for kind, header in pairs:
            suppressed = self._violation_log.admit((kind, header), now)
            if suppressed is None:
                continue
            extra: dict[str, object] = {
                "route": route,
                "kind": kind,
                "header": header,
                "message_id": delivery.properties.get("message_id"),
                "origin": origin,
                "suppressed": suppressed,
            }
            match verdict:
                case Relay(stripped=stripped) if stripped and kind == "unknown_reserved":
                    extra["names"] = ", ".join(stripped)
                case Reject(reason=reason):
                    extra["reason"] = bounded(reason)
            log.info("route %s: %s on %s", route, kind, header, extra=extra)
