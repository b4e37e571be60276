"""A channel's incoming messages: each delivery to its consumer, each return to its publish.

The channel hands it the frames of its deliveries and returns, and
:class:`~sidecar.amqp.content.ContentReader` puts each message together. A delivery's body
size is told as its content header arrives, before the body does. A whole delivery is
expected by the channel's acks and handed to the consumer's callback as a task of its own;
none is handed over once the channel is closed (the broker redelivers it). The bytes of
the deliveries not yet settled (acked, rejected, or given back with the channel) are
counted against the channel's budget, if it has one, from each content header on. A
return marks
the publish it is for (:class:`~sidecar.amqp.confirms.Confirms`); one that matches none
closes the channel, so that every unconfirmed publish is redelivered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.amqp.content import Content, ContentReader, delivery_of
from sidecar.amqp.lifecycle import ChannelState
from sidecar.wire import BasicDeliver, BasicReturn

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine

    from sidecar.amqp.acks import Acks
    from sidecar.amqp.confirms import Confirms
    from sidecar.wire import Delivery, UnreadHeader

__all__ = ["Inbound", "InboundChannel"]

log = logging.getLogger(__name__)


class InboundChannel(Protocol):
    """What the incoming messages need of their channel."""

    number: int

    @property
    def state(self) -> ChannelState:
        """Where the channel is in its life."""

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
        self._content = ContentReader(channel.number)
        self._callback: Callable[[Delivery], Coroutine[Any, Any, None]] | None = None
        self._on_body_size: Callable[[int], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._room = room  # called when a settlement made room under the budget
        self.budget_bytes: int | None = None  # no more is read while this much is unsettled
        self.held_bytes = 0  # the body sizes of the deliveries received and not settled
        self._sizes: dict[int, int] = {}  # by delivery tag
        self._tag = 0  # the pending delivery's

    def consume(
        self,
        callback: Callable[[Delivery], Coroutine[Any, Any, None]],
        *,
        on_body_size: Callable[[int], None] | None,
        budget_bytes: int | None = None,
    ) -> None:
        """Hand every delivery from now on to ``callback``, its body size to ``on_body_size``.

        ``budget_bytes``: read no further content while the deliveries unsettled hold this
        many bytes of body (see ``has_room``).
        """
        self._callback = callback
        self._on_body_size = on_body_size
        self.budget_bytes = budget_bytes

    def has_room(self) -> bool:
        """Whether another delivery may be read now: the bytes unsettled are under budget."""
        budget = self.budget_bytes
        return budget is None or self.held_bytes < budget

    def settled(self, delivery_tag: int) -> None:
        """Count a delivery's bytes out (acked or rejected); call ``room`` if that made room."""
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
        if (size := self._content.announced) is not None:
            if size:
                self._sizes[self._tag] = size
                self.held_bytes += size
            if self._on_body_size is not None:
                self._on_body_size(size)
        if content is not None:
            self._complete(content)

    def on_body(self, payload: memoryview) -> None:
        """Take a body frame of the pending message."""
        if (content := self._content.on_body(payload)) is not None:
            self._complete(content)

    def _complete(self, content: Content) -> None:
        method = content.method
        if isinstance(method, BasicReturn):
            self._on_return(content, method)
        elif self._callback is not None and self._channel.state is not ChannelState.CLOSED:
            self._acks.expect(method.delivery_tag)
            delivery = delivery_of(method, content.header, content.body, content.unread)
            self._spawn(self._callback(delivery))

    def _on_return(self, content: Content, method: BasicReturn) -> None:
        """Mark the publish a return is for, which is still unconfirmed (its confirm follows).

        One that matches nothing cannot be told from the publishes still in flight: the
        channel is closed, so none of them is acked and the broker redelivers them all
        (duplicates, never a loss).
        """
        if self._confirms.mark_returned(method, content.header, content.body):
            return
        log.warning(
            "channel %d: a returned message matches no publish in flight; closing the channel"
            " so that every unconfirmed one is redelivered",
            self._channel.number,
        )
        self._spawn(self._channel.close())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
