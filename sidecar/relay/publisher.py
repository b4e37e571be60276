"""Publishing one delivery's plan: the I/O of it, no decision.

``PlanPublisher`` does the publishing ``sidecar.relay.settler``'s settle loop asks for: the
normalised copy on the target exchange, or the original on the quarantine exchange (without
its headers when they cannot be written), on the route's shared publish channel or alone
on a channel of its own (``sidecar.relay.lane``); and the reject (requeue=false) that
dead-letters a delivery nothing takes. It returns the broker's raw outcome or raises; the
settler reads either into an answer, and ``sidecar.settle.step`` decides what it means.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.errors import ChannelLostError, WireError
from sidecar.settle import Copy, Quarantine, quarantine_copy, reason_only, slow_confirm
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from sidecar.amqp import AckChannel, BodyStream, Publisher
    from sidecar.contract import PropertyValue
    from sidecar.relay.context import RouteContext
    from sidecar.relay.lane import PublishLane
    from sidecar.relay.state import HeldDelivery
    from sidecar.settle import Plan
    from sidecar.wire import Delivery, FieldValue

__all__ = ["CONFIRM_TIMEOUT_S", "PlanPublisher"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them

CONFIRM_TIMEOUT_S = 30.0  # after this a publish without a confirm is reported, not resent


class PlanPublisher:
    """Publishes one route's plans and dead-letters what nothing takes; see the module docstring."""

    def __init__(self, context: RouteContext) -> None:
        self.route = context.route
        self._quarantine_exchange = context.quarantine_exchange
        self._login = context.login
        self._metrics = context.metrics

    async def publish(
        self,
        lane: PublishLane,
        delivery: Delivery,
        plan: Plan,
        held: HeldDelivery,
        *,
        alone: bool,
        stream: BodyStream | None = None,
    ) -> PublishOutcome:
        """Publish the plan once and return the broker's settlement of it, or raise.

        ``alone``: on a channel of its own rather than the shared one. ``stream``: the
        delivery's body passing through (its delivery's ``body`` is empty). What the
        outcome or the exception means is the settler's to read (``sidecar.settle.step``'s
        to decide).
        """
        if alone:
            async with lane.alone(in_turn=stream is None) as publisher:
                return await self._publish_plan(publisher, delivery, plan, held, stream)
        async with lane.shared() as publisher:
            published = await self._publish_plan(publisher, delivery, plan, held, stream)
            if published is PublishOutcome.NACKED:
                lane.retire(publisher)  # the retry goes on a new channel (see PublishLane)
            return published

    async def _publish_plan(
        self,
        publisher: Publisher,
        delivery: Delivery,
        plan: Plan,
        held: HeldDelivery,
        stream: BodyStream | None,
    ) -> PublishOutcome:
        match plan:
            case Quarantine(reason=reason):
                return await self._publish_quarantine(publisher, delivery, reason, held, stream)
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
        self,
        publisher: Publisher,
        delivery: Delivery,
        reason: str,
        held: HeldDelivery,
        stream: BodyStream | None,
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

        if stream is None and delivery.unread_body is not None:
            # Its body is not held: without its stream there is nothing to publish.
            raise ChannelLostError("the body passing through is no longer on its way")

        async def publish(headers: dict[str, FieldValue]) -> PublishOutcome:
            if stream is not None:
                exchange = self._quarantine_exchange
                return await publisher.publish_through(
                    stream,
                    exchange=exchange,
                    routing_key=self.route.name,
                    properties=properties,
                    headers=headers,
                    slow_after_s=CONFIRM_TIMEOUT_S,
                    on_slow=lambda: held.take(slow_confirm(exchange, limit_s=CONFIRM_TIMEOUT_S)),
                )
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

    async def dead_letter(self, consumer: AckChannel, delivery: Delivery, reason: str) -> None:
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

    async def requeue(self, consumer: AckChannel, delivery: Delivery, reason: str) -> None:
        """Give a delivery back to its queue (reject, requeue=true), logged with the reason.

        A channel already gone rejects nothing: the broker then redelivers it anyway.
        """
        route = self.route.name
        if await consumer.reject(delivery.delivery_tag, requeue=True):
            log.warning(
                "route %s gave a message back to queue %s: %s",
                route,
                self.route.queue,
                reason,
                extra={
                    "route": route,
                    "message_id": delivery.properties.get("message_id"),
                    "queue": self.route.queue,
                },
            )
