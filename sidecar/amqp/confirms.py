"""A channel's publishes in flight: settled by the broker's confirms, marked by its returns.

Publisher confirms settle by delivery tag, ``multiple`` included. A mandatory publish that
does not route comes back as a ``basic.return`` before its confirm; the return marks the
publish it is for, and the confirm then settles it as returned.

A return is matched by what a broker never changes: the exchange, the routing key, the
body and the sidecar's own ``x-acemq-id`` (compared as the bytes it is written as: a float
NaN is not equal to itself, its bytes are). A broker may add headers on the way (RabbitMQ's
message interceptors stamp a timestamp or the routing node), so the content header's bytes
only break a tie; then, as RabbitMQ returns in publish order on a channel and before the
confirm, the earliest unconfirmed candidate is the one. A body that was passed through
(``through``: its size) is not held to compare: its return is matched by its size.

A return that matches no publish in flight cannot be told from any of them, so its
confirm could settle the very publish that did not route: ``fail`` then fails every
unconfirmed publish at once (their deliveries are given back, never acked without a copy),
and the confirms that follow for them find nothing to settle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeAlias, cast

from sidecar.contract import ID
from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError, WireError
from sidecar.wire import PublishOutcome, encode_table

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from sidecar.wire import BasicReturn, Body, ContentHeader, FieldValue

__all__ = ["Confirms"]

NOT_FOUND: Final = 404


# Told a publish's settlement: its outcome, or the error its channel ended with.
Settled: TypeAlias = "Callable[[PublishOutcome | BaseException], None]"


class _Publish:
    """A publish waiting for its confirm; what a return is matched against.

    One per publish: a plain class, whose ``__init__`` the compiled build compiles
    (docs/decisions/0063).
    """

    __slots__ = (
        "acemq_id",
        "body",
        "exchange",
        "header",
        "returned",
        "routing_key",
        "settled",
        "through",
    )

    def __init__(  # noqa: PLR0917 - the publish's parts, in the order they are sent
        self,
        settled: Settled,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: Body,
        acemq_id: object,
        through: int,
    ) -> None:
        self.settled = settled  # called once, with the outcome or the channel's error
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header  # the content header's payload as sent
        self.body = body
        self.acemq_id = acemq_id  # the x-acemq-id header as sent, None without one
        self.through = through  # the size of a body passed through (``body`` is empty then)
        self.returned = False


class Confirms:
    """The unconfirmed publishes of one channel, by delivery tag."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._next_tag = 0
        self._unconfirmed: dict[int, _Publish] = {}

    def track(
        self,
        *,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: Body,
        acemq_id: object = None,
        through: int = 0,
    ) -> asyncio.Future[PublishOutcome]:
        """Take the next delivery tag for a publish about to be sent; return its outcome.

        ``through``: the size of a body passed through in frames (``body`` is empty).
        """
        future: asyncio.Future[PublishOutcome] = self._loop.create_future()
        self.track_call(
            _resolve(future),
            exchange=exchange,
            routing_key=routing_key,
            header=header,
            body=body,
            acemq_id=acemq_id,
            through=through,
        )
        return future

    def track_call(
        self,
        settled: Settled,
        *,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: Body,
        acemq_id: object = None,
        through: int = 0,
    ) -> None:
        """Take the next delivery tag for a publish about to be sent; tell ``settled`` once.

        ``settled`` is called from the frame handler with the outcome, or with the error
        the channel ended with: it must be quick and must not raise.
        """
        self._next_tag += 1
        self._unconfirmed[self._next_tag] = _Publish(
            settled, exchange, routing_key, header, body, acemq_id, through
        )

    def passed_through(self, method: BasicReturn, body_size: int) -> bool:
        """Whether a return of this size is for a publish whose body was passed through."""
        return any(
            publish.through == body_size
            and publish.routing_key == method.routing_key
            and publish.exchange == method.exchange
            for publish in self._unconfirmed.values()
        )

    def mark_returned(self, method: BasicReturn, header: ContentHeader, body: Body | None) -> bool:
        """Mark the publish a return is for; False when it matches none in flight.

        The candidates are the unconfirmed publishes, not yet returned, to the same
        exchange and routing key with the same body (``None``: one passed through, of the
        same size) and ``x-acemq-id`` (or none). Of those,
        one with the very content header bytes wins (two copies that differ only in a
        header a headers exchange routes by); else the earliest, by RabbitMQ's order. Two
        candidates alike in all of that are the same message to the relay.
        """
        headers = header.headers
        returned_id = _id_bytes(headers.get(ID) if isinstance(headers, dict) else None)
        candidates = [
            publish
            for publish in self._unconfirmed.values()
            if not publish.returned
            and publish.routing_key == method.routing_key
            and publish.exchange == method.exchange
            and (
                publish.through == header.body_size
                if body is None
                else not publish.through and publish.body == body
            )
            and _id_bytes(publish.acemq_id) == returned_id
        ]
        if not candidates:
            return False
        exact = (publish for publish in candidates if publish.header == header.payload)
        next(exact, candidates[0]).returned = True
        return True

    def settle(self, tag: int, *, multiple: bool, outcome: PublishOutcome) -> None:
        """Settle the publish with this tag (and every earlier one, with ``multiple``)."""
        unconfirmed = self._unconfirmed
        if multiple:
            tags = [t for t in unconfirmed if t <= tag]
        else:
            tags = [tag] if tag in unconfirmed else []
        for t in tags:
            publish = unconfirmed.pop(t)
            returned = publish.returned and outcome is PublishOutcome.CONFIRMED
            publish.settled(PublishOutcome.RETURNED if returned else outcome)

    def fail(self, error: ChannelLostError) -> None:
        """Fail every publish in flight: the channel ended before the broker settled them."""
        unconfirmed, self._unconfirmed = self._unconfirmed, {}
        for publish in unconfirmed.values():
            publish.settled(_publish_error(error, publish.exchange))


def _id_bytes(value: object) -> bytes | None:
    """Return the bytes an ``x-acemq-id`` value is written as; None for none.

    Equal bytes are the same id on the wire, whatever ``==`` says of the decoded values (a
    float NaN, a ``Decimal`` at another scale). A value that cannot be written compares by
    its class and ``repr``: it was never sent, so it matches no return.
    """
    if value is None:
        return None
    try:
        return encode_table({ID: cast("FieldValue", value)})
    except WireError:
        return f"{type(value).__qualname__}:{value!r}".encode()


def _resolve(future: asyncio.Future[PublishOutcome]) -> Settled:
    """Return a ``settled`` that resolves ``future`` (unless it was cancelled)."""

    def settled(result: PublishOutcome | BaseException) -> None:
        if future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    return settled


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
