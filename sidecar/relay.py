"""The I/O loop of one route: consume, publish what settlement decides, ack on the confirm.

Its one rule: a delivery is acked only after the broker confirmed its normalised copy on
the target exchange, or its quarantine copy on the quarantine exchange. Anything else
leaves it unacked, and the broker redelivers it. The decisions are ``sidecar.settlement``'s
(pure, unit-tested); the wire is the AMQP client's, seen through its ``Publisher`` and
``Consumer`` face. This module only carries decisions out, and keeps the route's state
(``RouteState``) and its rate-limited log lines (``RouteLog``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, assert_never

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.backoff import Backoff
from sidecar.contract import Policy
from sidecar.errors import WireError
from sidecar.producers import producer_of
from sidecar.route_log import RouteLog
from sidecar.route_state import HeldDelivery, RouteState
from sidecar.routes import Mode
from sidecar.settlement import (
    Copy,
    Done,
    Hold,
    Outcome,
    Quarantine,
    Target,
    after_publish,
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

    from sidecar.amqp import Channel, Connection
    from sidecar.clock import Clock
    from sidecar.contract import PropertyValue
    from sidecar.delivery import Delivery, PublishOutcome
    from sidecar.metrics import Metrics
    from sidecar.routes import Route
    from sidecar.settlement import Decision, Plan
    from sidecar.wire import FieldValue

__all__ = ["CONFIRM_TIMEOUT_S", "RouteWorker", "Settler"]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 30.0  # after this a publish without a confirm is reported, not resent
HEALTHY_CHANNEL_S = 30.0  # a channel that lived this long resets the reopen backoff


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

    # --- the channel's lifecycle ---

    async def run(self, connection: Connection, *, grace_s: float) -> None:
        """Consume until stopped or the connection drops; retry a paused route with backoff.

        The backoff is reset by progress (an ack), not by a channel that merely opened:
        a route whose every publish fails must not reopen (and requeue) in a tight loop.
        """
        state = self.state
        while not self._stop.is_set() and connection.is_open:
            try:
                channel = await self._open_unless_stopped(connection)
                if channel is None:
                    break
            except (MissingEntityError, ChannelLostError) as e:
                state.pause(str(e))
            except Exception as e:
                # Never let one route take the others down with it.
                log.exception("route %s: unexpected error while starting", self.route.name)
                state.pause(f"unexpected error while starting: {e!r}")
            else:
                opened = self._clock.monotonic()
                state.acked_since_open = False
                reason = await self._consume_until_closed(channel, connection)
                if self._stop.is_set():
                    await self._drain(channel, grace_s=grace_s)
                    break
                if state.acked_since_open or self._clock.monotonic() - opened > HEALTHY_CHANNEL_S:
                    self._backoff.reset()  # it worked for a while: a fresh failure, not a loop
                state.pause(reason)
                await channel.close()
            await sleep_unless(self._stop, self._backoff.next_delay())
        state.stopped()
        self._log.stopped()

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
        await asyncio.wait((opening,))
        if not opening.cancelled() and opening.exception() is None:
            # Opened although cancelled (a cancellation lost in the library, or the open
            # finishing as it came): it must not go on consuming with a replaced config.
            await opening.result().close()
        return None

    async def _open(self, connection: Connection) -> Channel:
        route = self.route
        await connection.check_queue(route.queue)
        await connection.check_exchange(route.exchange)
        await connection.check_exchange(self._quarantine_exchange)
        channel = await connection.channel(prefetch=route.prefetch)

        async def on_delivery(delivery: Delivery) -> None:
            await self._settler.settle(channel, delivery)

        # Up before the first delivery can arrive, so a delivery's pause is not undone.
        self.state.consuming(queue=route.queue, exchange=route.exchange)
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
        state = self.state
        deadline = asyncio.get_running_loop().time() + grace_s
        await channel.cancel(self._consumer_tag)
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
        await channel.close()


class Settler:
    """Settles one route's deliveries: plan once, publish until the broker takes it, ack.

    The plan and the reading of every broker answer are ``sidecar.settlement``'s; this
    class does the I/O they call for, on the channel the delivery came on.
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
        self._quarantine_exchange = quarantine_exchange
        self._login = login
        self._metrics = metrics
        self._clock = clock
        self._new_id = new_id
        self._state = state
        self._log = log
        self._stop = stop
        self._rng = rng

    async def settle(self, channel: Channel, delivery: Delivery) -> None:
        """Settle one delivery: publish what the plan says until the broker takes it, then ack.

        The plan is made once. When the broker will not take a copy for now (``Hold``), the
        delivery is held and retried with its own backoff on this channel: closing the
        channel would requeue it, and a quorum queue counts every requeue against its
        delivery limit. A publish without a confirm is never sent twice: its first outcome
        is awaited however long it takes.
        """
        state, route = self._state, self.route.name
        state.begin()
        started = self._clock.monotonic()
        held = HeldDelivery(state)
        try:
            outcome = await self._carry_out(channel, delivery, self._plan(delivery), held)
            if outcome is not None and await channel.ack(delivery.delivery_tag):
                self._metrics.observe_message(route, outcome, self._clock.monotonic() - started)
                held.release()
                state.settled(channel_open=channel.is_open)
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", route, e)
        except MissingEntityError as e:
            state.pause(str(e))
        except Exception:
            log.exception("route %s: a delivery could not be settled", route)
            state.pause("internal error; see the log")
            await channel.close()  # the broker redelivers it, after the route's backoff
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
        self, channel: Channel, delivery: Delivery, plan: Plan, held: HeldDelivery
    ) -> Outcome | None:
        """Publish what the plan says until the broker takes it; None when we must let go."""
        backoff: Backoff | None = None
        while True:
            decision = await self._attempt(channel, delivery, plan, held)
            match decision:
                case Done(outcome=outcome):
                    if isinstance(plan, Quarantine):
                        self._log.quarantined(plan.reason, delivery, now=self._clock.monotonic())
                    return outcome
                case Quarantine():
                    plan = decision  # returned, unwritable or a bug: the original goes there
                case Hold(reason=reason):
                    held.take(reason)
                    backoff = backoff or Backoff(rng=self._rng)
                    await sleep_unless(self._stop, backoff.next_delay())
                    if self._stop.is_set() or not channel.is_open:
                        return None  # the broker redelivers it
                case _:
                    assert_never(decision)

    async def _attempt(
        self, channel: Channel, delivery: Delivery, plan: Plan, held: HeldDelivery
    ) -> Decision:
        """Publish the plan once; return what settlement makes of the broker's answer."""
        try:
            if isinstance(plan, Quarantine):
                published = await self._publish_quarantine(channel, delivery, plan.reason, held)
            else:
                published = await self._publish_copy(channel, delivery, plan, held)
        except (ChannelLostError, MissingEntityError):
            raise
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

    async def _publish_copy(
        self, channel: Channel, delivery: Delivery, copy: Copy, held: HeldDelivery
    ) -> PublishOutcome:
        return await self._publish(
            channel,
            delivery,
            exchange=self.route.exchange,
            routing_key=copy.routing_key,
            properties=copy.properties,
            headers=copy.headers,
            held=held,
            content_header=copy.content_header,
        )

    async def _publish_quarantine(
        self, channel: Channel, delivery: Delivery, reason: str, held: HeldDelivery
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
                channel,
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
        channel: Channel,
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
        return await channel.publish(
            delivery.body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            slow_after_s=CONFIRM_TIMEOUT_S,
            on_slow=lambda: held.take(slow_confirm(exchange, limit_s=CONFIRM_TIMEOUT_S)),
            content_header=content_header,
        )
