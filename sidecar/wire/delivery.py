"""The values the transport hands the relay: a consumed message and a publish's outcome.

Pure data in the project's own types, so the pure decisions (``sidecar.settle.settlement``) and
tests can use them without the AMQP client; ``sidecar.amqp`` makes and re-exports them.
"""

from __future__ import annotations

# Mapping and the wire types are read at run time too: the compiled build (scripts/compile)
# builds the dataclasses below from their annotations.
from collections.abc import Mapping  # noqa: TC003
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from sidecar.wire.fields import FieldValue, PropertyValue  # noqa: TC001
from sidecar.wire.frames import UndecodableTable  # noqa: TC001

__all__ = ["Body", "Delivery", "PublishOutcome", "UnreadBody", "UnreadHeader"]

# A message body: a consumed one is the buffer its frames were received into, never
# copied on its way to the publish (docs/memory.md).
Body: TypeAlias = bytes | bytearray


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadHeader:
    """A content header too large to read: passed over unread, only its size is known.

    Its properties and header table are lost with it; the delivery carries the body.
    """

    size: int  # the frame's payload, in bytes
    limit: int  # the most the client reads of one content header


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadBody:
    """A body over the consumer's ``max_body_bytes``: passed through in frames, never held.

    The delivery's ``body`` is empty; the body's frames wait on the connection until a
    publish takes them, frame by frame (``sidecar.amqp``'s ``BodyStream``).
    """

    size: int  # the body size its content header announced
    limit: int  # the most the consumer holds of one body


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Delivery:
    """One message consumed from a staging queue, in our own types.

    Made once per message: its ``__init__`` is written out (``init=False``) because the
    compiled build compiles a written ``__init__`` and runs a generated one as Python
    (docs/decisions/0063-values-made-per-message.md).
    """

    delivery_tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    properties: Mapping[str, PropertyValue]
    headers: Mapping[str, FieldValue]
    body: Body
    undecodable: UndecodableTable | None
    # Set when the content header was too large to read: properties and headers are empty.
    unread_header: UnreadHeader | None
    # Set when the body is over the consumer's max_body_bytes: ``body`` is empty.
    unread_body: UnreadBody | None
    content_header: bytes  # as received: republished as it is when nothing changed

    def __init__(
        self,
        *,
        delivery_tag: int,
        exchange: str,
        routing_key: str,
        redelivered: bool,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue],
        body: Body,
        undecodable: UndecodableTable | None = None,
        unread_header: UnreadHeader | None = None,
        unread_body: UnreadBody | None = None,
        content_header: bytes = b"",
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "delivery_tag", delivery_tag)
        object.__setattr__(self, "exchange", exchange)
        object.__setattr__(self, "routing_key", routing_key)
        object.__setattr__(self, "redelivered", redelivered)
        object.__setattr__(self, "properties", properties)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "undecodable", undecodable)
        object.__setattr__(self, "unread_header", unread_header)
        object.__setattr__(self, "unread_body", unread_body)
        object.__setattr__(self, "content_header", content_header)


class PublishOutcome(StrEnum):
    """How the broker settled one publish."""

    CONFIRMED = "confirmed"
    RETURNED = "returned"  # mandatory and unroutable
    NACKED = "nacked"
