"""A channel's publishes in flight: settled by the broker's confirms, marked by its returns.

Publisher confirms settle by delivery tag, ``multiple`` included. A mandatory publish that
does not route comes back as a ``basic.return`` before its confirm; the return marks the
publish it is for, and the confirm then settles it as returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.delivery import PublishOutcome
from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError

if TYPE_CHECKING:
    import asyncio

    from sidecar.frames import BasicReturn, ContentHeader

__all__ = ["Confirms"]

NOT_FOUND: Final = 404


@dataclass(slots=True)
class _Publish:
    """A publish waiting for its confirm; what a return is matched against."""

    future: asyncio.Future[PublishOutcome]
    exchange: str
    routing_key: str
    header: bytes  # the content header's payload as sent
    body: bytes
    returned: bool = False


class Confirms:
    """The unconfirmed publishes of one channel, by delivery tag."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._next_tag = 0
        self._unconfirmed: dict[int, _Publish] = {}

    def track(
        self, *, exchange: str, routing_key: str, header: bytes, body: bytes
    ) -> asyncio.Future[PublishOutcome]:
        """Take the next delivery tag for a publish about to be sent; return its outcome."""
        self._next_tag += 1
        future: asyncio.Future[PublishOutcome] = self._loop.create_future()
        self._unconfirmed[self._next_tag] = _Publish(future, exchange, routing_key, header, body)
        return future

    def mark_returned(self, method: BasicReturn, header: ContentHeader, body: bytes) -> bool:
        """Mark the publish a return is for; False when it matches none in flight.

        The return holds the message as published: the unconfirmed publish to the same
        exchange and routing key with the same content header and body bytes. Only a
        byte-identical message could be mistaken for it, and then which of the two counts
        as returned makes no difference.
        """
        for publish in self._unconfirmed.values():
            if (
                not publish.returned
                and publish.routing_key == method.routing_key
                and publish.exchange == method.exchange
                and publish.header == header.payload
                and publish.body == body
            ):
                publish.returned = True
                return True
        return False

    def settle(self, tag: int, *, multiple: bool, outcome: PublishOutcome) -> None:
        """Settle the publish with this tag (and every earlier one, with ``multiple``)."""
        unconfirmed = self._unconfirmed
        if multiple:
            tags = [t for t in unconfirmed if t <= tag]
        else:
            tags = [tag] if tag in unconfirmed else []
        for t in tags:
            publish = unconfirmed.pop(t)
            if not publish.future.done():
                returned = publish.returned and outcome is PublishOutcome.CONFIRMED
                publish.future.set_result(PublishOutcome.RETURNED if returned else outcome)

    def fail(self, error: ChannelLostError) -> None:
        """Fail every publish in flight: the channel ended before the broker settled them."""
        for publish in self._unconfirmed.values():
            if not publish.future.done():
                publish.future.set_exception(_publish_error(error, publish.exchange))
        self._unconfirmed.clear()


def _publish_error(error: ChannelLostError, exchange: str) -> ChannelLostError | MissingEntityError:
    """Return the error a publish sees when its channel ends; a missing exchange names itself."""
    if (
        isinstance(error, ChannelClosedError)
        and error.code == NOT_FOUND
        and f"exchange '{exchange}'" in error.text
    ):
        missing = MissingEntityError(kind="exchange", name=exchange)
        missing.__cause__ = error
        return missing
    return error
