"""The I/O of one delivery: carry out what the settle step decides, until it is settled.

``Settler`` runs ``sidecar.settle.step`` for each delivery a route's ``RouteWorker`` hands
it: ``begin``, then each action carried out (a publish by ``PlanPublisher`` on the route's
publish lane, a wait, the ack or reject on the channel the delivery came on) and each
publish's result or exception read into an answer, in one place (``publish_answer``), for
``after``. What the step observed goes to metrics, the route log and the route's state in
one place too (``_observe``). Its one rule is the relay's: a delivery is acked only after
the broker confirmed its normalised copy, or its quarantine copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.amqp import ChannelClosedError, ChannelLostError, MissingEntityError
from sidecar.contract import Policy, producer_of
from sidecar.errors import WireError
from sidecar.relay.publisher import PlanPublisher
from sidecar.relay.state import HeldDelivery
from sidecar.relay.waits import first_of, sleep_unless
from sidecar.routemap import Mode
from sidecar.settle import (
    BUG_REASON,
    PUBLISHED,
    Ack,
    Blocked,
    Bug,
    DeadLetter,
    Failed,
    GiveBack,
    Held,
    HoldLimits,
    Left,
    LetGo,
    Lost,
    Publish,
    Quarantined,
    Refused,
    Requeue,
    RetriedCopy,
    Target,
    Unwritable,
    Violations,
    Wait,
    WaitUnblocked,
    after,
    backoff_s,
    begin,
)

if TYPE_CHECKING:
    import asyncio

    from sidecar.amqp import AckChannel, BodyStream, RelayConnection
    from sidecar.observe import RouteLog
    from sidecar.relay.context import RouteContext
    from sidecar.relay.lane import PublishLane
    from sidecar.relay.state import RouteState
    from sidecar.settle import Answer, Event
    from sidecar.wire import Delivery

__all__ = ["Settler", "publish_answer"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


class Settler:
    """Settles one route's deliveries: the settle step's actions carried out, its events sunk.

    What to do with each delivery is ``sidecar.settle.step``'s; this class publishes (by
    its ``PlanPublisher``), waits, acks and rejects as the step says.
    """

    def __init__(
        self,
        context: RouteContext,
        *,
        state: RouteState,
        log: RouteLog,
        stop: asyncio.Event,
    ) -> None:
        route = self.route = context.route
        self._target = Target(
            queue=route.queue,
            exchange=route.exchange,
            routing_key=route.routing_key,
            audit=route.mode is Mode.AUDIT,
            policy=Policy(publishers=route.publishers, origin=route.origin, login=context.login),
        )
        # Lowered by the worker once the broker took a delivery back (its consumer_timeout).
        self.limits = HoldLimits(
            consumer_timeout_s=route.limits.consumer_timeout_s,
            nack_max_attempts=route.limits.nack_max_attempts,
            nack_max_s=route.limits.nack_max_s,
        )
        self._quarantine_exchange = context.quarantine_exchange
        self._metrics = context.metrics
        self._clock = context.clock
        self._new_id = context.new_id
        self._state = state
        self._log = log
        self._stop = stop
        self._rng = context.rng
        self._publisher = PlanPublisher(context)
        self._lane: PublishLane | None = None
        self._connection: RelayConnection | None = None

    def attach(self, connection: RelayConnection, lane: PublishLane) -> None:
        """Publish on ``lane`` from now on, and watch ``connection`` for a broker's block."""
        self._lane = lane
        self._connection = connection

    async def settle(self, consumer: AckChannel, delivery: Delivery) -> None:
        """Settle one delivery: carry out the settle step's actions until it is settled.

        The plan is made once. A held delivery stays unacked on its channel and is
        published again after the step's wait: closing its channel would requeue it, and a
        quorum queue counts every requeue against its delivery limit. A publish without a
        confirm is never sent twice: its first outcome is awaited however long it takes.
        """
        state = self._state
        state.begin()
        started = self._clock.monotonic()
        held = HeldDelivery(state)
        # A body over max_body_bytes: its frames wait on the connection for the publish
        # that takes them, or are dropped at the end if none did.
        stream = consumer.passing_body(delivery.delivery_tag) if delivery.unread_body else None
        try:
            lane = self._lane
            assert lane is not None  # noqa: S101 - attached before consuming starts
            await self._carry_out(consumer, lane, delivery, held, started=started, stream=stream)
        except MissingEntityError as e:
            # The passive checks of a reopen say when it exists again; till then the
            # deliveries wait in staging, not here.
            state.pause(str(e))
            await consumer.close()
        except ChannelLostError as e:
            log.debug("route %s: delivery left to the broker: %s", self.route.name, e)
        except Exception:
            log.exception("route %s: a delivery could not be settled", self.route.name)
            state.pause(BUG_REASON)
            await consumer.close()  # the broker redelivers it, after the route's backoff
        finally:
            if stream is not None:
                stream.discard()
            held.release()
            state.end()

    async def _carry_out(
        self,
        consumer: AckChannel,
        lane: PublishLane,
        delivery: Delivery,
        held: HeldDelivery,
        *,
        started: float,
        stream: BodyStream | None,
    ) -> None:
        """Carry out each action of the settle step, from ``begin`` to the last one."""
        clock, route = self._clock, self.route
        step = begin(delivery, self._target, now_ms=clock.now_ms(), new_id=self._new_id)
        while True:
            if step.events:
                self._observe(step.events, delivery, held)
            action = step.action
            match action:
                case Publish():
                    answer = await publish_answer(
                        self._publisher,
                        lane,
                        delivery,
                        action,
                        held,
                        consumer=consumer,
                        stop=self._stop,
                        connection=self._connection,
                        stream=stream,
                    )
                    step = after(
                        step.attempt,
                        answer,
                        held_s=clock.monotonic() - started,
                        delay_s=backoff_s(step.attempt.holds, rng=self._rng),
                        limits=self.limits,
                        exchange=route.exchange,
                        quarantine_exchange=self._quarantine_exchange,
                        route=route.name,
                    )
                case Wait(delay_s=wait_s, then=then):
                    await sleep_unless(self._stop, wait_s)
                    if self._stop.is_set() or not consumer.is_open:
                        return  # the broker redelivers it
                    step = then
                case WaitUnblocked(then=then):
                    if not await self._unblocked():
                        return  # stopping while blocked: the broker redelivers it
                    step = then
                case _:
                    await self._finish(consumer, delivery, held, action, started=started)
                    return

    async def _finish(
        self,
        consumer: AckChannel,
        delivery: Delivery,
        held: HeldDelivery,
        action: Ack | DeadLetter | GiveBack | LetGo | Requeue,
        *,
        started: float,
    ) -> None:
        """Carry out the step's last action: ack, reject, requeue, give back or let go."""
        match action:
            case Ack(outcome=outcome):
                if await consumer.ack(delivery.delivery_tag):
                    elapsed_s = self._clock.monotonic() - started
                    self._metrics.observe_message(self.route.name, outcome, elapsed_s)
                    held.release()
                    self._state.settled()
            case DeadLetter(reason=reason):
                await self._publisher.dead_letter(consumer, delivery, reason)
            case GiveBack(reason=reason):
                self._state.pause(reason)
                await consumer.close()  # the broker redelivers it, after the route's backoff
            case LetGo():
                pass  # the broker redelivers it
            case Requeue(reason=reason):
                await self._publisher.requeue(consumer, delivery, reason)
            case _:
                assert_never(action)

    async def _unblocked(self) -> bool:
        """Wait until the broker unblocks the connection; False when a stop comes first."""
        connection = self._connection
        assert connection is not None  # noqa: S101 - only a connection says Blocked
        await first_of(connection.wait_unblocked(), self._stop.wait())
        return not self._stop.is_set()

    def _observe(self, events: tuple[Event, ...], delivery: Delivery, held: HeldDelivery) -> None:
        """Hand what the step saw to metrics, the route log and the route's state."""
        route = self.route.name
        for event in events:
            match event:
                case Held(reason=reason):
                    held.take(reason)
                case RetriedCopy():
                    self._metrics.count_retried_copy(route)
                case Violations(verdict=verdict):
                    producer = producer_of(
                        delivery.headers,
                        delivery.properties,
                        publishers=self._target.policy.publishers,
                    )
                    self._metrics.count_violations(
                        route,
                        [(str(v.kind), v.header) for v in verdict.violations],
                        producer=producer,
                    )
                    self._log.violations(verdict, delivery, now=self._clock.monotonic())
                case Quarantined(reason=reason):
                    self._log.quarantined(reason, delivery, now=self._clock.monotonic())
                case Bug(while_=while_, error=error):
                    log.error("route %s: %s", route, while_, exc_info=error)
                case Left(reason=reason):
                    log.debug("route %s: delivery left to the broker: %s", route, reason)
                case _:
                    assert_never(event)


async def publish_answer(
    publisher: PlanPublisher,
    lane: PublishLane,
    delivery: Delivery,
    publish: Publish,
    held: HeldDelivery,
    *,
    consumer: AckChannel,
    stop: asyncio.Event,
    connection: RelayConnection | None,
    stream: BodyStream | None = None,
) -> Answer:
    """Publish once; return the broker's answer. Every exception of a publish ends here.

    Nothing is published for a delivery whose channel is closing (its ack would be refused
    and the broker redelivers it: the copy would be a certain duplicate), nor while
    ``connection`` is blocked (a copy written then would sit in the socket and might reach
    the broker after a SIGTERM gave its delivery back). A missing entity is the route's,
    not the delivery's: it goes up to pause the route. ``stream``: the delivery's body,
    passing through.
    """
    if (not_now := _not_now(consumer, connection)) is not None:
        return not_now
    try:
        published = await publisher.publish(
            lane, delivery, publish.plan, held, alone=publish.alone, stream=stream
        )
    except MissingEntityError:
        raise
    except ChannelClosedError as e:
        return Refused(e.code, e.text)
    except ChannelLostError as e:
        return Lost(gone=stop.is_set() or not lane.connection_open, error=str(e))
    except (WireError, ValueError, TypeError) as e:
        return Unwritable(str(e))
    except Exception as e:  # noqa: BLE001 - a bug while publishing: the step decides, Bug logs it
        return Failed(e)
    return PUBLISHED[published]


def _not_now(consumer: AckChannel, connection: RelayConnection | None) -> Answer | None:
    """Return the answer for a publish that must not be written now; None: publish it."""
    if not consumer.is_open:
        return Lost(gone=True, error="the channel it came on is closing")
    if connection is not None and (reason := connection.blocked_reason) is not None:
        return Blocked(reason)
    return None
