"""The I/O loop of one route: consume, publish what settlement decides, ack on the confirm.

Its one rule: a delivery is acked only after the broker confirmed its normalised copy on
the target exchange, or its quarantine copy on the quarantine exchange. Anything else
leaves it unacked, and the broker redelivers it; the one exception is a delivery neither
the target nor quarantine takes before the broker's consumer_timeout would take it back,
which is rejected (requeue=false) to the staging queue's dead-letter exchange, logged
and counted. The decisions are ``sidecar.settlement``'s (pure, unit-tested); the wire is
the AMQP client's, seen through its Protocols (``Consumer``, ``Publisher``,
``RelayConnection``). A route consumes on one channel and publishes on others
(``sidecar.publish_lane``), so that a publish the broker refuses by closing its channel
requeues nothing. This module only carries decisions out, and keeps the route's state
(``RouteState``) and its rate-limited log lines (``RouteLog``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING, assert_never

from sidecar.amqp import ChannelClosedError, ChannelLostError, MissingEntityError
from sidecar.backoff import Backoff
from sidecar.contract import Policy
from sidecar.errors import WireError
from sidecar.producers import producer_of
from sidecar.publish_lane import PublishLane
from sidecar.route_log import RouteLog
from sidecar.route_state import HeldDelivery, RouteState
from sidecar.routes import Mode
from sidecar.settlement import (
    Alone,
    Copy,
    DeadLetter,
    Done,
    Hold,
    HoldLimits,
    Outcome,
    Quarantine,
    Target,
    Wait,
    after_hold,
    after_publish,
    after_refusal,
    blocked,
    in_flight_window,
    internal_error,
    plan_delivery,
    quarantine_copy,
    reason_only,
    slow_confirm,
    unencodable,
)
from sidecar.waits import first_of, sleep_unless

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp import Consumer, Publisher, RelayConnection
    from sidecar.clock import Clock
    from sidecar.contract import PropertyValue
    from sidecar.delivery import Delivery, PublishOutcome
    from sidecar.metrics import Metrics
    from sidecar.routes import Route
    from sidecar.settlement import Decision, Plan
    from sidecar.wire import FieldValue

__all__ = [
    "CONFIRM_TIMEOUT_S",
    "RouteWorker",
    "Settler",
]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 30.0  # after this a publish without a confirm is reported, not resent
QOS_TIMEOUT_S = 5.0  # a basic.qos the broker does not answer (an alarm) is given up
HEALTHY_CHANNEL_S = 30.0  # a channel that lived this long resets the reopen backoff


class InFlightWindow:
    """One route's prefetch as the byte budget allows it, from the largest body seen.

    Kept across the route's channels: the next channel starts from what the last learned.
    """

    def __init__(self, *, prefetch: int, budget_bytes: int) -> None:
        self._prefetch = prefetch
        self._budget = budget_bytes
        self.largest: int | None = None
        self.current: int | None = None

    def start(self) -> int:
        """Return the window a new channel starts with."""
        self.current = in_flight_window(
            prefetch=self._prefetch, budget_bytes=self._budget, largest_bytes=self.largest
        )
        return self.current

    def note(self, size: int) -> int | None:
        """Record a body's size; return the new window when it changes, else None."""
        if self.largest is not None and size <= self.largest:
            return None
        self.largest = size
        window = in_flight_window(
            prefetch=self._prefetch, budget_bytes=self._budget, largest_bytes=size
        )
        if window == self.current:
            return None
        self.current = window
        return window


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
        self._clock = clock
        self._backoff = Backoff(rng=rng or random.Random())  # noqa: S311 - jitter, not security
        self._stop = asyncio.Event()
        self._log = RouteLog(route.name)
        self.state = RouteState(route.name, metrics=metrics, log=self._log, clock=clock)
        self._settler = Settler(
            route,
            quarantine_exchange=quarantine_exchange,
            login=login,
            metrics=metrics,
            clock=clock,
            new_id=new_id,
            state=self.state,
            log=self._log,
            stop=self._stop,
            rng=self._backoff.rng,
        )
        self._consumer_tag = f"acemq-sidecar.{route.name}"
        self._window = InFlightWindow(
            prefetch=route.prefetch, budget_bytes=route.limits.max_in_flight_bytes
        )

    @property
    def pause_reason(self) -> str | None:
        """Why the route is not consuming, or None while it is (read by /readyz)."""
        return self.state.pause_reason

    def request_stop(self, *, replaced: bool = False) -> None:
        """Ask the worker to stop consuming and settle what it holds.

        ``replaced``: a successor runs the same route now (a reload), so this worker must
        no longer report the route up or down.
        """
        if replaced:
            self.state.hand_over()
        self.state.stopping = True
        self._stop.set()

    # --- the channels' lifecycle ---

    async def run(self, connection: RelayConnection, *, grace_s: float) -> None:
        """Consume until stopped or the connection drops; retry a paused route with backoff.

        The backoff is reset by progress (an ack), not by a channel that merely opened:
        a route whose every publish fails must not reopen (and requeue) in a tight loop.
        """
        state = self.state
        while not self._stop.is_set() and connection.is_open:
            try:
                opened = await self._open_unless_stopped(connection)
                if opened is None:
                    break
            except (MissingEntityError, ChannelLostError) as e:
                state.pause(str(e))
            except Exception as e:
                # Never let one route take the others down with it.
                log.exception("route %s: unexpected error while starting", self.route.name)
                state.pause(f"unexpected error while starting: {e!r}")
            else:
                consumer, lane = opened
                since = self._clock.monotonic()
                state.acked_since_open = False
                reason = await self._consume_until_closed(consumer, connection)
                if self._stop.is_set():
                    await self._drain(consumer, lane, connection, grace_s=grace_s)
                    break
                if state.acked_since_open or self._clock.monotonic() - since > HEALTHY_CHANNEL_S:
                    self._backoff.reset()  # it worked for a while: a fresh failure, not a loop
                state.channel_closed(reason)
                await consumer.close()
                await lane.close()
            await sleep_unless(self._stop, self._backoff.next_delay())
        state.stopped()
        self._log.stopped()

    async def _open_unless_stopped(
        self, connection: RelayConnection
    ) -> tuple[Consumer, PublishLane] | None:
        """Open the route's channels, or give up when a stop comes first.

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
            opened = opening.result()
            if not self._stop.is_set():
                return opened
            await _close_both(*opened)
            return None
        opening.cancel()
        await asyncio.wait((opening,))
        if not opening.cancelled() and opening.exception() is None:
            # Opened although cancelled (a cancellation lost in the library, or the open
            # finishing as it came): it must not go on consuming with a replaced config.
            await _close_both(*opening.result())
        return None

    async def _open(self, connection: RelayConnection) -> tuple[Consumer, PublishLane]:
        route = self.route
        await connection.check_queue(route.queue)
        await connection.check_exchange(route.exchange)
        await connection.check_exchange(self._quarantine_exchange)
        lane = PublishLane(connection)
        try:
            await lane.open()
            consumer: Consumer = await connection.channel(prefetch=route.prefetch)
        except BaseException:
            await lane.close()
            raise
        settler, window = self._settler, self._window
        try:
            await consumer.qos(window.start())
        except BaseException:
            await _close_both(consumer, lane)
            raise

        async def on_delivery(delivery: Delivery) -> None:
            if (size := window.note(len(delivery.body))) is not None:
                await _set_window(consumer, size)
            await settler.settle(consumer, delivery)

        settler.attach(connection, lane)
        # Up before the first delivery can arrive, so a delivery's pause is not undone.
        self.state.consuming(queue=route.queue, exchange=route.exchange)
        try:
            await consumer.consume(route.queue, on_delivery, consumer_tag=self._consumer_tag)
        except BaseException:
            await _close_both(consumer, lane)
            raise
        return consumer, lane

    async def _consume_until_closed(self, consumer: Consumer, connection: RelayConnection) -> str:
        """Wait until the channel or connection closes, or a stop; return what happened."""
        which, first = await first_of(
            consumer.wait_closed(), connection.wait_closed(), self._stop.wait()
        )
        return str(first.result()) if which == 0 else ("connection lost", "stopping")[which - 1]

    async def _drain(
        self, consumer: Consumer, lane: PublishLane, connection: RelayConnection, *, grace_s: float
    ) -> None:
        """Stop deliveries, settle in-flight work within the grace period, close.

        While the broker blocks the connection it reads nothing, so a cancel would only
        wait for its bound: the held deliveries are let go at once (they publish nothing
        while blocked) and the channels are left to the connection's close.
        """
        state = self.state
        deadline = asyncio.get_running_loop().time() + grace_s
        is_blocked = connection.blocked_reason is not None
        if not is_blocked:
            await consumer.cancel(self._consumer_tag)
        extra = {"route": self.route.name, "in_flight": state.in_flight}
        log.info(
            "route %s draining %d in-flight messages", self.route.name, state.in_flight, extra=extra
        )
        try:
            async with asyncio.timeout_at(deadline):
                await state.idle.wait()
        except TimeoutError:
            extra = {"route": self.route.name, "in_flight": state.in_flight}
            log.warning(
                "route %s: %d messages unsettled after %.1fs; the broker will redeliver them",
                self.route.name,
                state.in_flight,
                grace_s,
                extra=extra,
            )
        if not is_blocked:
            await _close_both(consumer, lane)


class _Retries:
    """How one delivery's current plan has been retried so far."""

    __slots__ = ("alone", "attempts", "backoff")

    def __init__(self, *, rng: random.Random) -> None:
        self.backoff = Backoff(rng=rng)
        self.attempts = 0  # publishes of this plan the broker held back
        self.alone = False  # publish on a channel of its own (once a refusal was ambiguous)

    def restart(self) -> None:
        """Count and back off afresh for a new plan (the quarantine copy); alone stays."""
        self.attempts = 0
        self.backoff.reset()


async def _set_window(consumer: Consumer, prefetch: int) -> None:
    """Change the consumer's prefetch; a channel gone or a broker silent leaves it as it was."""
    with contextlib.suppress(ChannelLostError, TimeoutError):
        async with asyncio.timeout(QOS_TIMEOUT_S):
            await consumer.qos(prefetch)


async def _close_both(consumer: Consumer, lane: PublishLane) -> None:
    await consumer.close()
    await lane.close()


class Settler:
    """Settles one route's deliveries: plan once, publish until the broker takes it, ack.

    The plan and the reading of every broker answer are ``sidecar.settlement``'s; this
    class does the I/O they call for: publishes on the route's publish lane, the ack (or
    the reject) on the channel the delivery came on.
    """

    def __init__(
        self,
        route: Route,
        *,
        quarantine_exchange: str,
        login: str,
        metrics: Metrics,
        clock: Clock,
        new_id: Callable[[], str],
        state: RouteState,
        log: RouteLog,
        stop: asyncio.Event,
        rng: random.Random,
    ) -> None:
        self.route = route
        self._target = Target(
            queue=route.queue,
            exchange=route.exchange,
            routing_key=route.routing_key,
            audit=route.mode is Mode.AUDIT,
            policy=Policy(publishers=route.publishers, origin=route.origin, login=login),
        )
        self._limits = HoldLimits(
            consumer_timeout_s=route.limits.consumer_timeout_s,
            nack_max_attempts=route.limits.nack_max_attempts,
            nack_max_s=route.limits.nack_max_s,
        )
        self._quarantine_exchange = quarantine_exchange
        self._login = login
        self._metrics = metrics
        self._clock = clock
        self._new_id = new_id
        self._state = state
        self._log = log
        self._stop = stop
        self._rng = rng
        self._lane: PublishLane | None = None
        self._connection: RelayConnection | None = None

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane`` from now on, and watch ``connection`` for a broker's block."""
        self._lane = lane
        self._connection = connection

    async def settle(self, consumer: Consumer, delivery: Delivery) -> None:
        """Settle one delivery: publish what the plan says until the broker takes it, then ack.

        The plan is made once. When the broker will not take a copy for now (``Hold``), the
        delivery is held and retried with its own backoff, bounded by the route's limits:
        closing its channel would requeue it, and a quorum queue counts every requeue
        against its delivery limit. A publish without a confirm is never sent twice: its
        first outcome is awaited however long it takes.
        """
        state, route = self._state, self.route.name
        state.begin()
        started = self._clock.monotonic()
        held = HeldDelivery(state)
        try:
            lane = self._lane
            assert lane is not None  # noqa: S101 - attached before consuming starts
            result = await self._carry_out(consumer, lane, delivery, held, started=started)
            if isinstance(result, DeadLetter):
                await self._dead_letter(consumer, delivery, result.reason)
            elif result is not None and await consumer.ack(delivery.delivery_tag):
                self._metrics.observe_message(route, result, self._clock.monotonic() - started)
                held.release()
                state.settled()
        except MissingEntityError as e:
            # The passive checks of a reopen say when it exists again; till then the
            # deliveries wait in staging, not here.
            state.pause(str(e))
            await consumer.close()
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", route, e)
        except Exception:
            log.exception("route %s: a delivery could not be settled", route)
            state.pause("internal error; see the log")
            await consumer.close()  # the broker redelivers it, after the route's backoff
        finally:
            held.release()
            state.end()

    def _plan(self, delivery: Delivery) -> Plan:
        """Plan the delivery once, counting and logging the contract's violations."""
        try:
            plan, verdict = plan_delivery(
                delivery, self._target, now_ms=self._clock.now_ms(), new_id=self._new_id
            )
        except Exception as e:
            log.exception("route %s: unexpected error while normalising", self.route.name)
            return internal_error(e)
        if verdict is not None and verdict.violations:
            producer = producer_of(
                delivery.headers, delivery.properties, publishers=self._target.policy.publishers
            )
            self._metrics.count_violations(
                self.route.name,
                [(str(v.kind), v.header) for v in verdict.violations],
                producer=producer,
            )
            self._log.violations(verdict, delivery, now=self._clock.monotonic())
        return plan

    async def _carry_out(
        self,
        consumer: Consumer,
        lane: PublishLane,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        started: float,
    ) -> Outcome | DeadLetter | None:
        """Publish what the plan says until the broker takes it; None when we must let go."""
        plan = self._plan(delivery)
        retries = _Retries(rng=self._rng)
        while True:
            if not await self._unblocked(held):
                return None  # stopping while blocked: the broker redelivers it
            decision = await self._attempt(lane, delivery, plan, held, alone=retries.alone)
            after: Wait | Quarantine | DeadLetter | None
            match decision:
                case Done(outcome=outcome):
                    if isinstance(plan, Quarantine):
                        self._log.quarantined(plan.reason, delivery, now=self._clock.monotonic())
                    return outcome
                case Alone():
                    after = self._alone(decision, retries)
                case Hold():
                    held.take(decision.reason)
                    after = await self._hold(consumer, decision, plan, retries, started=started)
                case _:
                    after = decision
            match after:
                case Wait():
                    continue
                case Quarantine():
                    plan = after
                    retries.restart()
                case DeadLetter() | None:
                    return after
                case _:
                    assert_never(after)

    def _alone(self, alone: Alone, retries: _Retries) -> Wait:
        """Publish the same plan again at once, alone on a channel of its own."""
        retries.alone = True
        if alone.may_duplicate:
            self._metrics.count_retried_copy(self.route.name)
        return Wait(0.0)

    async def _hold(
        self, consumer: Consumer, hold: Hold, plan: Plan, retries: _Retries, *, started: float
    ) -> Wait | Quarantine | DeadLetter | None:
        """Wait before the plan is published again, or say where the delivery goes instead.

        None: let it go (a stop, or the broker took the channel it came on away).
        """
        retries.attempts += 1
        after = after_hold(
            hold,
            plan,
            attempts=retries.attempts,
            held_s=self._clock.monotonic() - started,
            delay_s=retries.backoff.next_delay(),
            limits=self._limits,
        )
        if isinstance(after, Wait):
            await sleep_unless(self._stop, after.delay_s)
            if self._stop.is_set() or not consumer.is_open:
                return None  # the broker redelivers it
            if hold.may_duplicate:
                self._metrics.count_retried_copy(self.route.name)
        return after

    async def _unblocked(self, held: HeldDelivery) -> bool:
        """Wait while the broker blocks the connection; False when a stop comes first.

        Nothing new is published while blocked: a copy written then would sit in the
        socket and might reach the broker after a SIGTERM gave its delivery back.
        """
        connection = self._connection
        if connection is None:
            return True
        reason = connection.blocked_reason
        if reason is None:
            return True
        held.take(blocked(reason))
        await first_of(connection.wait_unblocked(), self._stop.wait())
        return not self._stop.is_set()

    async def _attempt(
        self, lane: PublishLane, delivery: Delivery, plan: Plan, held: HeldDelivery, *, alone: bool
    ) -> Decision:
        """Publish the plan once; return what settlement makes of the broker's answer."""
        exchange = (
            self._quarantine_exchange if isinstance(plan, Quarantine) else self.route.exchange
        )
        try:
            if alone:
                async with lane.alone() as publisher:
                    published = await self._publish_plan(publisher, delivery, plan, held)
            else:
                published = await self._publish_plan(await lane.publisher(), delivery, plan, held)
        except MissingEntityError:
            raise
        except ChannelClosedError as e:
            return after_refusal(e.code, e.text, plan, alone=alone, exchange=exchange)
        except ChannelLostError:
            if self._stop.is_set() or not lane.connection_open:
                raise
            # The shared channel was closed by another publish's refusal before or while
            # this one went out: it may have been routed, or not.
            return Hold("the publish channel closed; retrying on a new one", may_duplicate=True)
        except (WireError, ValueError, TypeError) as e:
            if isinstance(plan, Quarantine):
                raise
            return unencodable(e)
        except Exception as e:
            if isinstance(plan, Quarantine):
                raise
            log.exception("route %s: unexpected error while publishing", self.route.name)
            return internal_error(e)
        return after_publish(
            published,
            plan,
            exchange=self.route.exchange,
            quarantine_exchange=self._quarantine_exchange,
            route=self.route.name,
        )

    async def _publish_plan(
        self, publisher: Publisher, delivery: Delivery, plan: Plan, held: HeldDelivery
    ) -> PublishOutcome:
        match plan:
            case Quarantine(reason=reason):
                return await self._publish_quarantine(publisher, delivery, reason, held)
            case Copy():
                return await self._publish(
                    publisher,
                    delivery,
                    exchange=self.route.exchange,
                    routing_key=plan.routing_key,
                    properties=plan.properties,
                    headers=plan.headers,
                    held=held,
                    content_header=plan.content_header,
                )
            case _:
                assert_never(plan)

    async def _publish_quarantine(
        self, publisher: Publisher, delivery: Delivery, reason: str, held: HeldDelivery
    ) -> PublishOutcome:
        """Publish the original to quarantine; without its headers if they cannot be written.

        The original headers plus the reason may outgrow the broker's frame (or, a last
        resort, not encode): the body, the properties and the reason go rather than hold
        the message for ever; at the broker's smallest frame size, a short reason.
        """
        queue = self.route.queue
        properties, headers = quarantine_copy(
            delivery, reason=reason, queue=queue, login=self._login
        )

        async def publish(headers: dict[str, FieldValue]) -> PublishOutcome:
            return await self._publish(
                publisher,
                delivery,
                exchange=self._quarantine_exchange,
                routing_key=self.route.name,
                properties=properties,
                headers=headers,
                held=held,
            )

        try:
            return await publish(headers)
        except (WireError, ValueError, TypeError) as e:
            log.warning(
                "route %s: the quarantine copy cannot carry the original headers: %s",
                self.route.name,
                e,
                extra={"route": self.route.name},
            )
            try:
                return await publish(reason_only(reason, e, queue, short=False))
            except WireError:
                return await publish(reason_only(reason, e, queue, short=True))

    async def _publish(
        self,
        publisher: Publisher,
        delivery: Delivery,
        *,
        exchange: str,
        routing_key: str,
        properties: dict[str, PropertyValue],
        headers: dict[str, FieldValue],
        held: HeldDelivery,
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish a copy of the delivery's body; a confirm slower than the limit holds it."""
        return await publisher.publish(
            delivery.body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            slow_after_s=CONFIRM_TIMEOUT_S,
            on_slow=lambda: held.take(slow_confirm(exchange, limit_s=CONFIRM_TIMEOUT_S)),
            content_header=content_header,
        )

    async def _dead_letter(self, consumer: Consumer, delivery: Delivery, reason: str) -> None:
        """Reject a delivery nothing takes (requeue=false): the broker dead-letters it.

        Logged at error with the reason and counted, never silent. A channel already gone
        rejects nothing: the broker then redelivers the delivery.
        """
        route = self.route.name
        extra = {
            "route": route,
            "message_id": delivery.properties.get("message_id"),
            "queue": self.route.queue,
        }
        if await consumer.reject(delivery.delivery_tag, requeue=False):
            self._metrics.count_dead_lettered(route)
            log.error(
                "route %s rejected a message to the dead-letter exchange of queue %s"
                " (dropped by the broker if it has none): %s",
                route,
                self.route.queue,
                reason,
                extra=extra,
            )
