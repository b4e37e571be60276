"""One AMQP channel in confirm mode: consume, publish mandatory, ack.

On top of a channel's life (:mod:`sidecar.amqp.lifecycle`): only an open channel
publishes and acks; a closing one still hands over the deliveries already on the wire
(their acks are refused, and the broker redelivers them). Acks made in one turn leave
together (:mod:`sidecar.amqp.acks`); publishing is :mod:`sidecar.amqp.publishing`'s;
deliveries and returns, as they come in, go to their consumer and their publish
(:mod:`sidecar.amqp.inbound`); a body over ``max_body_bytes`` passes through
(``passing_body``, :mod:`sidecar.amqp.stream`). A consumer the broker cancels (its queue
deleted) ends ``wait_closed`` but not the channel: ``consumer_cancelled`` says so, and
what is in flight can still be published, confirmed and acked before the owner closes it.

Delivery tags belong to the channel, not to a consumer: after our own ``cancel`` the
deliveries already received stay unacked on the channel and are acked or rejected as any
other, also once a later ``consume`` (after a ``qos``: RabbitMQ applies a per-consumer
prefetch to consumers created after it) delivers on the same channel under a new tag.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from sidecar.amqp import codec
from sidecar.amqp.acks import Acks
from sidecar.amqp.confirms import NOT_FOUND
from sidecar.amqp.inbound import Inbound
from sidecar.amqp.lifecycle import CLOSE_TIMEOUT_S, ChannelState
from sidecar.amqp.publishing import PublishingChannel
from sidecar.errors import (
    ChannelClosedError,
    ChannelLostError,
    MissingEntityError,
)
from sidecar.wire import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_RETURN,
    PublishOutcome,
    parse_confirm,
    parse_deliver,
    parse_return,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp.lifecycle import ChannelLink
    from sidecar.amqp.protocols import DeliveryConsumer
    from sidecar.amqp.stream import BodyStream
    from sidecar.wire import UnreadHeader

__all__ = ["Channel"]


class Channel(PublishingChannel):
    """One AMQP channel in confirm mode: consume, publish mandatory, ack."""

    def __init__(self, link: ChannelLink, number: int) -> None:
        super().__init__(link, number)
        self._acks = Acks(number, loop=link.loop, write=link.write)
        self._inbound = Inbound(
            self, loop=link.loop, acks=self._acks, confirms=self._confirms, room=link.resume_reading
        )
        self._cancelled_by_broker = False
        self._consuming = False

    @property
    def consumer_cancelled(self) -> bool:
        """Whether the broker cancelled the consumer (its queue deleted) on an open channel.

        ``wait_closed`` has returned then, but the channel still publishes, confirms and
        acks: settle what is in flight (wait for it, bounded), then close it.
        """
        return self._cancelled_by_broker

    async def consume(
        self,
        queue: str,
        consumer: DeliveryConsumer,
        *,
        consumer_tag: str,
        max_in_flight_bytes: int | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        """Start consuming ``queue``; ``consumer`` gets each delivery and body size.

        Both from the frame handler (``DeliveryConsumer``): the client starts no task for a
        delivery. While the deliveries not acked or rejected hold ``max_in_flight_bytes``
        of body, the connection reads nothing more: never more than that plus one message.
        A body over ``max_body_bytes`` is not held: its delivery carries an ``UnreadBody``
        and its frames wait for ``passing_body``'s stream to be published or discarded.
        All of them apply to every delivery on the channel from now on, whatever its tag.
        """
        self._consuming = True
        self._inbound.consume(
            consumer,
            budget_bytes=max_in_flight_bytes,
            max_body_bytes=max_body_bytes,
        )
        try:
            await self.rpc(codec.basic_consume(queue, consumer_tag=consumer_tag))
        except ChannelClosedError as e:
            if e.code == NOT_FOUND:
                raise MissingEntityError(kind="queue", name=queue) from e
            raise

    async def cancel(self, consumer_tag: str, *, on_sent: Callable[[], None] | None = None) -> bool:
        """Stop deliveries to a consumer; True once none can arrive, False after a bound.

        The cancel-ok comes after the consumer's last delivery, each handed to its consumer
        by then (which stays: deliveries on the wire are settled, not redelivered). After
        the broker's own cancel nothing is sent (True). False: no answer within the bound
        or the channel ended first. ``on_sent`` is called once the cancel is written: an
        ack written from then on reaches the broker after it (a channel's frames in order).
        """
        if self._cancelled_by_broker:
            return True
        with contextlib.suppress(TimeoutError, ChannelLostError):
            await self.rpc(
                codec.basic_cancel(consumer_tag), timeout_s=CLOSE_TIMEOUT_S, sent=on_sent
            )
            return True
        return False

    async def qos(self, prefetch_count: int) -> None:
        """Set the prefetch of the consumers this channel starts from now on (``basic.qos``).

        Per consumer (``global`` false): RabbitMQ applies it to later consumers only, a
        running one keeps its own; a channel-wide one would close the connection on a
        quorum queue (540). So a new window takes a new consumer: qos, cancel, consume.
        """
        await self.rpc(codec.basic_qos(prefetch_count))

    def passing_body(self, delivery_tag: int) -> BodyStream | None:
        """Return the body stream of a delivery over ``max_body_bytes``, once; else None.

        Its frames hold the connection's reading until it is published or discarded
        (acking or rejecting the delivery discards it).
        """
        return self._inbound.passing_body(delivery_tag)

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery; False when the channel is not open (the broker will redeliver).

        Acks made in one turn of the event loop leave together at its end: the leading run
        of acked deliveries as one ``multiple`` ack, any acked behind an unacked one singly.
        """
        return self.try_ack(delivery_tag)

    def try_ack(self, delivery_tag: int) -> bool:
        """Ack one delivery, as ``ack`` does, without a coroutine (never None: nothing waits)."""
        if not self.is_open:  # a closing channel: the broker would discard the ack
            return False
        self._acks.ack(delivery_tag)
        self._inbound.settled(delivery_tag)
        return True

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Reject one delivery (``requeue=False``: to the queue's dead-letter exchange).

        ``requeue=True`` goes as a ``basic.nack``, which RabbitMQ 4.3+ does not count
        against a quorum queue's delivery limit (a ``basic.reject`` it counts; before 4.3
        both count). False when the channel is not open: the broker redelivers it then.
        The acks made before it in this turn still leave at its end; none of them covers
        this delivery.
        """
        if not self.is_open:
            return False
        self._acks.forget(delivery_tag)
        if requeue:
            frame = codec.basic_nack(self.number, delivery_tag, multiple=False)
        else:
            frame = codec.basic_reject(self.number, delivery_tag, requeue=False)
        self._link.write(frame)
        self._inbound.settled(delivery_tag)
        return True

    def _before_close(self) -> None:
        if self._pass_on.stream is not None and self.is_open:
            # A close now would fall inside a message's content: a connection error.
            self._pass_on.give_up()
            return
        self._acks.flush()  # the acks already made leave before the close
        if self._consuming and self._link.nack_is_free and self.is_open:
            # What is still unacked goes back by a nack, not by the close: a quorum queue
            # of RabbitMQ 4.3+ then spends no attempt of its delivery limit on it (before
            # 4.3 it spends one either way, and the nack may reorder the queue).
            self._link.write(codec.basic_nack(self.number, 0, multiple=True))
        self._link.resume_reading()  # closing: its budget holds the reading no more

    # --- frames from the broker ---

    def on_method(self, method_id: int, payload: bytes) -> bool:
        """Handle a hot-path method frame for this channel; False for any other method."""
        if method_id == BASIC_DELIVER:
            self._inbound.begin(parse_deliver(payload))
        elif method_id == BASIC_ACK:
            tag, multiple = parse_confirm(payload)
            self._confirms.settle(tag, multiple=multiple, outcome=PublishOutcome.CONFIRMED)
        elif method_id == BASIC_NACK:
            tag, multiple = parse_confirm(payload)
            self._confirms.settle(tag, multiple=multiple, outcome=PublishOutcome.NACKED)
        elif method_id == BASIC_RETURN:
            self._inbound.begin(parse_return(payload))
        elif method_id == BASIC_CANCEL:
            # The queue was deleted: the channel stays open (in-flight deliveries can still
            # be settled) but nothing more will arrive, so the route must treat it as lost.
            self._cancelled_by_broker = True
            self._finish("the broker cancelled the consumer (was the queue deleted?)")
        else:
            return False
        return True

    def on_header(self, payload: bytes) -> None:
        """Handle a content header frame: the properties of the pending delivery or return."""
        self._inbound.on_header(payload)

    def on_body(self, payload: memoryview) -> bool:
        """Handle a content body frame; False when it must wait (a body passing through)."""
        return self._inbound.on_body(payload)

    @property
    def consuming(self) -> bool:
        """Whether a consumer was started on the channel (the link then reads for it)."""
        return self._consuming

    def has_room(self) -> bool:
        """Whether the link may read the next delivery (see ``consume``); closing, always."""
        return self.state is not ChannelState.OPEN or self._inbound.has_room()

    def carry(self, delta: int) -> None:
        """Count ``delta`` bytes the consumer holds elsewhere against this channel's budget."""
        self._inbound.carry(delta)

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> None:
        """Handle a content header too large to read (passed over): its size and body size."""
        self._inbound.on_unread_header(unread, body_size=body_size)

    def _lost(self, error: ChannelLostError) -> None:
        self._confirms.fail(error)
        self._acks.stop()
        self._inbound.settle_all()
