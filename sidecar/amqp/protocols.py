"""What the relay needs of the client, as Protocols: so a fake can stand in for the broker.

Exactly what :mod:`sidecar.relay.worker` uses of a channel and a connection, nothing more. The
client's :class:`~sidecar.amqp.channel.Channel` and
:class:`~sidecar.amqp.connection.Connection` satisfy them (checked by mypy in
:mod:`sidecar.amqp` and at run time by the unit tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.amqp.confirms import Settled
    from sidecar.amqp.stream import BodyStream
    from sidecar.wire import (
        Body,
        Delivery,
        FieldValue,
        PropertyValue,
        PublishOutcome,
        UndecodableTable,
    )

__all__ = ["AckChannel", "Consumer", "Publisher", "RelayChannel", "RelayConnection"]


@runtime_checkable
class Publisher(Protocol):
    """Publishes mandatory with confirms on one channel."""

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack and publish."""
        ...

    async def publish(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish and wait for the broker's settlement; ``on_slow`` once if it is slow."""
        ...

    def publish_now(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        settled: Settled,
        content_header: bytes | None = None,
    ) -> bool:
        """Publish without waiting, ``settled`` told the answer; False: not now (nothing sent)."""
        ...

    async def publish_through(
        self,
        stream: BodyStream,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
    ) -> PublishOutcome:
        """Publish a body passing through, frame by frame; wait for the settlement."""
        ...

    async def close(self) -> None:
        """Close the channel; what is unacked goes back to its queue."""
        ...


class AckChannel(Protocol):
    """What a delivery's settler needs of the channel it came on: any ``Consumer`` has it."""

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack."""
        ...

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery; False when the channel is gone (the broker redelivers it)."""
        ...

    def passing_body(self, delivery_tag: int) -> BodyStream | None:
        """Return the stream of a delivery whose body passes through, once; else None."""
        ...

    def try_ack(self, delivery_tag: int) -> bool | None:
        """Ack now if nothing holds acks back; None: ``ack`` must wait (nothing was done)."""
        ...

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Reject one delivery (``basic.reject``); False when the channel is gone."""
        ...

    async def close(self) -> None:
        """Close the channel; what is unacked goes back to its queue."""
        ...

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels the consumer."""
        ...

    async def wait_gone(self) -> None:
        """Return once the channel begins to close (a broker's cancel alone does not)."""
        ...


class DeliveryConsumer(Protocol):
    """What a consuming channel hands its deliveries to, from the frame handler that read them.

    The client starts no task for a delivery: what takes longer than the call is the
    consumer's to run, in tasks of its own.
    """

    def deliver(self, delivery: Delivery) -> None:
        """Take one whole delivery (its body passing through, if over ``max_body_bytes``)."""
        ...

    def body_size(self, size: int) -> None:
        """Hear a delivery's body size from its content header, before the body arrives.

        Called in the frame handler: quick, and never raising. Not told for a body that
        passes through.
        """
        ...


@runtime_checkable
class Consumer(Protocol):
    """Consumes one queue on one channel and acks what was settled."""

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack and publish."""
        ...

    async def consume(
        self,
        queue: str,
        consumer: DeliveryConsumer,
        *,
        consumer_tag: str,
        max_in_flight_bytes: int | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        """Start consuming; ``consumer`` gets each delivery and each body size, in turn.

        While the deliveries not yet settled hold ``max_in_flight_bytes`` of body, the
        connection reads nothing more: they never hold more than that plus one message.
        A body over ``max_body_bytes`` passes through (``passing_body``), never held.
        """
        ...

    async def cancel(self, consumer_tag: str, *, on_sent: Callable[[], None] | None = None) -> bool:
        """Stop deliveries; True once no more can arrive, False if unconfirmed after a bound.

        What was delivered before stays on the channel to be acked or rejected.
        ``on_sent`` is called once the cancel is written (what follows reaches the broker
        after it).
        """
        ...

    def has_room(self) -> bool:
        """Whether the connection reads the channel's next delivery now (under its budget)."""
        ...

    def carry(self, delta: int) -> None:
        """Count ``delta`` bytes held elsewhere against ``max_in_flight_bytes`` (or free them).

        The bodies of deliveries from a channel that closed, whose copies still wait for
        their confirms: with them counted, the consumer's bytes in flight stay within its
        budget across channels.
        """
        ...

    async def qos(self, prefetch_count: int) -> None:
        """Set the prefetch of consumers started after it (per consumer, not channel-wide)."""
        ...

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery; False when the channel is gone (the broker redelivers it)."""
        ...

    def try_ack(self, delivery_tag: int) -> bool:
        """Ack one delivery as ``ack`` does, without a coroutine."""
        ...

    def passing_body(self, delivery_tag: int) -> BodyStream | None:
        """Return the stream of a delivery whose body passes through, once; else None."""
        ...

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Reject one delivery (``basic.reject``); False when the channel is gone."""
        ...

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels the consumer."""
        ...

    async def wait_gone(self) -> None:
        """Return once the channel begins to close (a broker's cancel alone does not)."""
        ...

    @property
    def consumer_cancelled(self) -> bool:
        """Whether the broker cancelled the consumer while the channel stays open.

        Then ``wait_closed`` has returned, yet what is in flight can still be published,
        confirmed and acked: settle it (bounded), then close.
        """
        ...

    async def close(self) -> None:
        """Close the channel; what is unacked goes back to its queue."""
        ...


@runtime_checkable
class RelayChannel(Publisher, Consumer, Protocol):
    """One route's channel: it consumes staging and publishes the copies."""


@runtime_checkable
class RelayConnection(Protocol):
    """What the relay needs of a connection: its life, passive checks, a route's channel."""

    @property
    def is_open(self) -> bool:
        """Whether the connection is still usable."""
        ...

    async def wait_closed(self) -> BaseException | None:
        """Return when the connection closes, with the reason when there is one."""
        ...

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason while it blocks publishing (``connection.blocked``), else None."""
        ...

    async def wait_unblocked(self) -> None:
        """Return once publishing is unblocked (at once if it is not blocked) or it closed."""
        ...

    async def check_queue(self, name: str) -> None:
        """Raise MissingEntityError unless the queue exists."""
        ...

    async def check_exchange(self, name: str) -> None:
        """Raise MissingEntityError unless the exchange exists."""
        ...

    async def channel(self, *, prefetch: int) -> RelayChannel:
        """Open a confirm-mode channel with this prefetch."""
        ...
