"""A channel's publishes in flight: settled by the broker's confirms, marked by its returns.

Publisher confirms settle by delivery tag, ``multiple`` included. A mandatory publish that
does not route comes back as a ``basic.return`` before its confirm; the return marks the
publish it is for, and the confirm then settles it as returned.

A return is matched only to the publish it provably is, among the unconfirmed ones to
the same exchange and routing key with the same body (a body passed through, ``through``:
by its size) and value of the match header (``ClientOptions.match_header``, the relay's
``x-acemq-id``; as written: a NaN is not equal to itself, its bytes are):
the one whose content header is the returned one byte for byte, else the one whose
properties and header table the returned ones contain (a broker's interceptor adds
``timestamp_in_ms`` on the way). Two such candidates cannot be told apart; publish order
does not decide (docs/decisions/0073). An unmatched return's confirm could settle the
very publish that did not route: ``fail`` then fails every unconfirmed publish at once
(their deliveries are given back, never acked without a copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeAlias, cast

from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError, WireError
from sidecar.wire import (
    PublishOutcome,
    UndecodableTable,
    encode_table,
    parse_content_header,
)

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from sidecar.wire import BasicReturn, Body, ContentHeader, FieldValue

__all__ = ["Confirms"]

NOT_FOUND: Final = 404
# What RabbitMQ's message interceptors write into a message as it comes in, each added or,
# set to overwrite, replaced: the timestamp (a header and a property) and the routing node.
BROKER_HEADERS: Final = frozenset({"timestamp_in_ms", "x-routed-by"})
BROKER_PROPERTIES: Final = frozenset({"timestamp"})


# Told a publish's settlement: its outcome, or the error its channel ended with.
Settled: TypeAlias = "Callable[[PublishOutcome | BaseException], None]"


class _Publish:
    """A publish waiting for its confirm; what a return is matched against.

    One per publish: a plain class, whose ``__init__`` the compiled build compiles
    (docs/decisions/0063).
    """

    __slots__ = (
        "body",
        "exchange",
        "header",
        "matched",
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
        matched: object,
        through: int,
    ) -> None:
        self.settled = settled  # called once, with the outcome or the channel's error
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header  # the content header's payload as sent
        self.body = body
        self.matched = matched  # the match header's value as sent, None without one
        self.through = through  # the size of a body passed through (``body`` is empty then)
        self.returned = False


class Confirms:
    """The unconfirmed publishes of one channel, by delivery tag."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, match_header: str | None = None) -> None:
        self._loop = loop
        self._match_header = match_header  # ClientOptions.match_header
        self._next_tag = 0
        self._unconfirmed: dict[int, _Publish] = {}

    def track(
        self,
        *,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: Body,
        matched: object = None,
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
            matched=matched,
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
        matched: object = None,
        through: int = 0,
    ) -> None:
        """Take the next delivery tag for a publish about to be sent; tell ``settled`` once.

        ``settled`` is called from the frame handler with the outcome, or with the error
        the channel ended with: it must be quick and must not raise.
        """
        self._next_tag += 1
        self._unconfirmed[self._next_tag] = _Publish(
            settled, exchange, routing_key, header, body, matched, through
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
        """Mark the publish a return is for; False unless it is provably one (module doc).

        ``body`` is None for a return whose body passes through: candidates then match by
        its size.
        """
        headers = header.headers
        name = self._match_header
        returned = headers.get(name) if name is not None and isinstance(headers, dict) else None
        returned_id = _id_bytes(returned)
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
            and _id_bytes(publish.matched) == returned_id
        ]
        exact = [publish for publish in candidates if publish.header == header.payload]
        if not exact:
            exact = [publish for publish in candidates if _contained(publish.header, header)]
        if len(exact) != 1:
            return False
        exact[0].returned = True
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


def _contained(sent: bytes, returned: ContentHeader) -> bool:
    """Whether a publish's properties and headers are all in a returned message, as sent.

    Values compare as the bytes they are written as. What RabbitMQ's interceptors write
    (``BROKER_HEADERS``, ``BROKER_PROPERTIES``) may have been added or overwritten on the
    way: it is left out. A table that cannot be decoded contains nothing (only the exact
    match).
    """
    mine = parse_content_header(sent)
    theirs = returned.headers
    if isinstance(mine.headers, UndecodableTable) or isinstance(theirs, UndecodableTable):
        return False
    if any(
        returned.properties.get(name) != value
        for name, value in mine.properties.items()
        if name not in BROKER_PROPERTIES
    ):
        return False
    theirs = theirs or {}
    return all(
        name in BROKER_HEADERS
        or (name in theirs and encode_table({name: value}) == encode_table({name: theirs[name]}))
        for name, value in (mine.headers or {}).items()
    )


def _id_bytes(value: object) -> bytes | None:
    """Return the bytes a match header's value is written as; None for none.

    Equal bytes are the same id on the wire, whatever ``==`` says of the decoded values (a
    float NaN, a ``Decimal`` at another scale). A value that cannot be written compares by
    its class and ``repr``: it was never sent, so it matches no return.
    """
    if value is None:
        return None
    try:
        return encode_table({"": cast("FieldValue", value)})
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
