"""Publishing one delivery's plan: the I/O of it, no decision.

``PlanPublisher`` does the publishing a delivery's steps ask for: the normalised copy on
the target exchange (``publish_now`` from a frame handler, on the shared channel, or
``publish`` from the delivery's task), or the original on the quarantine exchange (in
the format ``sidecar.settle.quarantine_format`` makes), on the route's shared publish
channel or alone on a channel of its own (``sidecar.relay.lane``). It returns the
broker's raw outcome or raises; the delivery's ``Settling`` reads either into an answer,
and ``sidecar.settle.step`` decides what it means.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, assert_never

from sidecar.errors import ChannelLostError, WireError
from sidecar.settle import Copy, Quarantine, fallbacks, quarantine_copy

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp import BodyStream, Publisher
    from sidecar.contract import PropertyValue
    from sidecar.relay.context import RouteContext
    from sidecar.relay.lane import PublishLane
    from sidecar.settle import Plan
    from sidecar.wire import Delivery, FieldValue, PublishOutcome

__all__ = ["CONFIRM_TIMEOUT_S", "PlanPublisher"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them

CONFIRM_TIMEOUT_S = 30.0  # after this a publish without a confirm is reported, not resent


class PlanPublisher:
    """Publishes one route's plans; see the module docstring."""

    def __init__(self, context: RouteContext) -> None:
        self.route = context.route
        self._quarantine_exchange = context.quarantine_exchange
        self._login = context.login

    async def publish(
        self,
        lane: PublishLane,
        delivery: Delivery,
        plan: Plan,
        *,
        alone: bool,
        on_slow: Callable[[], None],
        stream: BodyStream | None = None,
    ) -> PublishOutcome:
        """Publish the plan once and return the broker's settlement of it, or raise.

        ``alone``: on a channel of its own rather than the shared one. ``on_slow``: called
        once a confirm is slower than ``CONFIRM_TIMEOUT_S``. ``stream``: the delivery's
        body passing through (its delivery's ``body`` is empty).
        """
        if alone:
            async with lane.alone(in_turn=stream is None) as publisher:
                return await self._publish_plan(publisher, delivery, plan, on_slow, stream)
        async with lane.shared() as publisher:
            published = await self._publish_plan(publisher, delivery, plan, on_slow, stream)
            lane.answered(publisher, published)
            return published

    def publish_now(
        self,
        publisher: Publisher,
        delivery: Delivery,
        copy: Copy,
        settled: Callable[[PublishOutcome | BaseException], None],
    ) -> bool:
        """Publish the copy on the shared channel now, from a frame handler; False: not sent.

        As the client's ``Publisher.publish_now``: ``settled`` hears the broker's answer.
        """
        return publisher.publish_now(
            delivery.body,
            exchange=self.route.exchange,
            routing_key=copy.routing_key,
            properties=copy.properties,
            headers=copy.headers,
            settled=settled,
            content_header=copy.content_header,
        )

    async def _publish_plan(
        self,
        publisher: Publisher,
        delivery: Delivery,
        plan: Plan,
        on_slow: Callable[[], None],
        stream: BodyStream | None,
    ) -> PublishOutcome:
        match plan:
            case Quarantine(reason=reason):
                return await self._publish_quarantine(publisher, delivery, reason, on_slow, stream)
            case Copy():
                return await self._publish(
                    publisher,
                    delivery,
                    exchange=self.route.exchange,
                    routing_key=plan.routing_key,
                    properties=plan.properties,
                    headers=plan.headers,
                    on_slow=on_slow,
                    content_header=plan.content_header,
                )
            case _:
                assert_never(plan)

    async def _publish_quarantine(
        self,
        publisher: Publisher,
        delivery: Delivery,
        reason: str,
        on_slow: Callable[[], None],
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
                return await publisher.publish_through(
                    stream,
                    exchange=self._quarantine_exchange,
                    routing_key=self.route.name,
                    properties=properties,
                    headers=headers,
                    slow_after_s=CONFIRM_TIMEOUT_S,
                    on_slow=on_slow,
                )
            return await self._publish(
                publisher,
                delivery,
                exchange=self._quarantine_exchange,
                routing_key=self.route.name,
                properties=properties,
                headers=headers,
                on_slow=on_slow,
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
            *larger, last = fallbacks(reason, e, queue)
            for fallback in larger:
                with contextlib.suppress(WireError):
                    return await publish(fallback)
            return await publish(last)

    async def _publish(
        self,
        publisher: Publisher,
        delivery: Delivery,
        *,
        exchange: str,
        routing_key: str,
        properties: dict[str, PropertyValue],
        headers: dict[str, FieldValue],
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish a copy of the delivery's body; ``on_slow`` once its confirm is late."""
        return await publisher.publish(
            delivery.body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            slow_after_s=CONFIRM_TIMEOUT_S,
            on_slow=on_slow,
            content_header=content_header,
        )
