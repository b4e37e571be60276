"""A channel's incoming messages: each delivery to its consumer, each return to its publish.

The channel hands it the frames of its deliveries and returns, and
:class:`~sidecar.amqp.content.ContentReader` puts each message together. A delivery's body
size is told as its content header arrives, before the body does. A whole delivery is
expected by the channel's acks and handed to the consumer (``DeliveryConsumer``), which
runs whatever takes longer in tasks of its own; none is handed over once the channel is
closed (the
broker redelivers it). The bytes of the deliveries not yet settled (acked, rejected, or
given back with the channel) are counted against the channel's budget, if it has one,
from each content header on. A delivery whose body is over the consumer's
``max_body_bytes`` is handed over at its header with its body passing through
(:mod:`sidecar.amqp.stream`; ``passing_body`` gives the stream to the publish that takes
it): not held, not counted. A return marks the publish it is for
(:class:`~sidecar.amqp.confirms.Confirms`); one that matches none fails every unconfirmed
publish at once and closes the channel. The return of a body that was published
passing through is not held either: its frames are dropped as they come.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.amqp.content import Content, ContentReader, delivery_of
from sidecar.amqp.lifecycle import ChannelState
from sidecar.errors import ChannelLostError
from sidecar.wire import BasicDeliver, BasicReturn, UnreadBody

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine

    from sidecar.amqp.acks import Acks
    from sidecar.amqp.confirms import Confirms
    from sidecar.amqp.protocols import DeliveryConsumer
    from sidecar.amqp.stream import BodyStream
    from sidecar.wire import UnreadHeader

__all__ = ["Inbound", "InboundChannel"]

log = logging.getLogger(__name__)


class InboundChannel(Protocol):
    """What the incoming messages need of their channel."""

    number: int

    @property
    def state(self) -> ChannelState:
        """Where the channel is in its life."""

    def begin_close(self) -> None:
        """Start closing the channel now: nothing more is published or acked on it."""

    async def close(self) -> None:
        """Close the channel; unacked deliveries go back to their queues."""


class Inbound:
    """One channel's incoming deliveries and returns; see the module docstring."""

    def __init__(
        self,
        channel: InboundChannel,
        *,
        loop: asyncio.AbstractEventLoop,
        acks: Acks,
        confirms: Confirms,
        room: Callable[[], None] = lambda: None,
    ) -> None:
        self._channel = channel
        self._loop = loop
        self._acks = acks
        self._confirms = confirms
        self._content = ContentReader(channel.number, passes=self._passes, resume=room)
        self._consumer: DeliveryConsumer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._room = room  # called when a settlement made room under the budget
        self.budget_bytes: int | None = None  # no more is read while this much is unsettled
        self.max_body_bytes: int | None = None  # a larger body passes through, not held
        self._streams: dict[int, BodyStream] = {}  # passing through, by delivery tag
        self.held_bytes = 0  # the body sizes of the deliveries received and not settled
        self.carried_bytes = 0  # held for the consumer elsewhere (``carry``)
        self._sizes: dict[int, int] = {}  # by delivery tag
        self._tag = 0  # the pending delivery's

    def consume(
        self,
        consumer: DeliveryConsumer,
        *,
        budget_bytes: int | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        """Hand every delivery from now on, and its body size, to ``consumer``.

        ``budget_bytes``: read no further content while the deliveries unsettled hold this
        many bytes of body (see ``has_room``). ``max_body_bytes``: a larger body passes
        through (its size is not told).
        """
        self._consumer = consumer
        self.budget_bytes = budget_bytes
        self.max_body_bytes = max_body_bytes

    def _passes(self, method: BasicDeliver | BasicReturn, body_size: int) -> bool:
        if isinstance(method, BasicReturn):
            return self._confirms.passed_through(method, body_size)
        limit = self.max_body_bytes
        return limit is not None and body_size > limit

    def passing_body(self, delivery_tag: int) -> BodyStream | None:
        """Return the stream of a delivery whose body passes through, once; else None."""
        return self._streams.pop(delivery_tag, None)

    def has_room(self) -> bool:
        """Whether another delivery may be read now: the bytes unsettled are under budget."""
        budget = self.budget_bytes
        return budget is None or self.held_bytes + self.carried_bytes < budget

    def carry(self, delta: int) -> None:
        """Count ``delta`` bytes held elsewhere against the budget; call ``room`` if freed."""
        full = not self.has_room()
        self.carried_bytes += delta
        if full and self.has_room():
            self._room()

    def settled(self, delivery_tag: int) -> None:
        """Count a delivery's bytes out (acked or rejected); call ``room`` if that made room."""
        if self._streams and (stream := self._streams.pop(delivery_tag, None)) is not None:
            stream.discard()  # settled without a publish taking its body
        size = self._sizes.pop(delivery_tag, 0)
        if size:
            full = not self.has_room()
            self.held_bytes -= size
            if full and self.has_room():
                self._room()

    def settle_all(self) -> None:
        """Count every delivery's bytes out (the channel ended: the broker has them back)."""
        self._sizes.clear()
        self.held_bytes = 0
        self._content.cut_off()
        self._streams.clear()
        self._room()

    def begin(self, method: BasicDeliver | BasicReturn) -> None:
        """Start a delivery or a return: its content header and body frames come next."""
        self._content.begin(method)
        if isinstance(method, BasicDeliver):
            self._tag = method.delivery_tag

    def on_header(self, payload: bytes) -> None:
        """Take the pending message's content header."""
        self._took_header(self._content.on_header(payload))

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> None:
        """Take the pending message's content header, too large to read: its size only."""
        self._took_header(self._content.on_unread_header(unread, body_size=body_size))

    def _took_header(self, content: Content | None) -> None:
        if content is not None and content.stream is not None:
            self._complete(content)
            return
        if (size := self._content.announced) is not None:
            if size:
                self._sizes[self._tag] = size
                self.held_bytes += size
            if (consumer := self._consumer) is not None:
                consumer.body_size(size)
        if content is not None:
            self._complete(content)

    def on_body(self, payload: memoryview) -> bool:
        """Take a body frame of the pending message; False when it must wait (see stream)."""
        reader = self._content
        if reader.stream is not None:
            return reader.pass_through(payload)
        if (content := reader.on_body(payload)) is not None:
            self._complete(content)
        return True

    def _complete(self, content: Content) -> None:
        method, stream = content.method, content.stream
        if isinstance(method, BasicReturn):
            if stream is not None:
                stream.discard()
            self._on_return(content, method)
        elif (consumer := self._consumer) is not None and (
            self._channel.state is not ChannelState.CLOSED
        ):
            self._acks.expect(method.delivery_tag)
            unread_body = None
            if stream is not None:
                self._streams[method.delivery_tag] = stream
                unread_body = UnreadBody(size=stream.size, limit=self.max_body_bytes or 0)
            delivery = delivery_of(
                method, content.header, content.body, content.unread, unread_body
            )
            consumer.deliver(delivery)
        elif stream is not None:
            stream.discard()  # not handed over: the broker redelivers it

    def _on_return(self, content: Content, method: BasicReturn) -> None:
        """Mark the publish a return is for, which is still unconfirmed (its confirm follows).

        One that matches nothing cannot be told from the publishes still in flight: each of
        them fails here and now, before the confirm that follows in the same read could
        settle one, and the channel is closed. None of their deliveries is acked: each is
        published again or redelivered (duplicates, never a loss).
        """
        body = None if content.stream is not None else content.body
        if self._confirms.mark_returned(method, content.header, body):
            return
        number = self._channel.number
        log.warning(
            "channel %d: a returned message matches no publish in flight; failing every"
            " unconfirmed publish and closing the channel",
            number,
        )
        self._confirms.fail(
            ChannelLostError(
                f"channel {number}: a returned message matched no publish in flight, so no"
                " unconfirmed publish of the channel can be taken as confirmed"
            )
        )
        self._channel.begin_close()  # no publish takes this channel from here on
        self._spawn(self._channel.close(), name=f"channel-{number}-close")

    def _spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        task = self._loop.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
