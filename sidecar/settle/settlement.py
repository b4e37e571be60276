"""What becomes of one delivery: the pure decisions of the relay, with no I/O.

The relay (``sidecar.relay.worker``) carries these decisions out on the wire; this module makes
them. Two questions, each a total function over closed sets:

- ``plan_delivery``: what to publish for a delivery that just arrived, a ``Copy`` for the
  target exchange or a ``Quarantine`` of the original;
- what the broker's answers to that publish mean, in the words the route says them:
  ``unroutable`` (``Quarantine`` the original instead), ``nacked`` and ``untaken``
  (``Hold`` the delivery unacked and try the same publish again later).

Which answer to which plan takes which of these is ``sidecar.settle.table``'s; what a
refused or held delivery becomes next (``after_refusal``, ``after_hold``) is decided in
``sidecar.settle.holds``.

The one shape of a quarantine copy is ``sidecar.settle.quarantine_format``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final, TypeAlias

from sidecar.contract import ORIGIN, Policy, Reject, Relay, move_user_id, normalise
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.contract import PropertyValue, Verdict
    from sidecar.wire import Delivery, FieldValue, UnreadBody, UnreadHeader

__all__ = [
    "DEFAULT_DELIVERY_LIMIT",
    "DELIVERY_COUNT",
    "QUEUE_COUNTERS",
    "Alone",
    "Copy",
    "DeadLetter",
    "Hold",
    "Outcome",
    "Quarantine",
    "Target",
    "bounded",
    "log_origin",
    "nacked",
    "plan_delivery",
    "publishable_properties",
    "reason_kind",
    "same_table",
    "unroutable",
    "untaken",
]

REASON_MAX = 4096  # characters of a reason kept in x-acemq-error and in a log line
ORIGIN_LOG_MAX = 200  # characters of an origin in a log line
DELIVERY_COUNT: Final = "x-delivery-count"  # a quorum queue's count of a message's returns
# What a quorum queue writes into a message it delivers again: its own bookkeeping, never
# the application's. A copy leaves without them, so the next hop reads only its own queue's.
QUEUE_COUNTERS: Final = (DELIVERY_COUNT, "x-acquired-count")
DEFAULT_DELIVERY_LIMIT: Final = 20  # a quorum queue's x-delivery-limit from RabbitMQ 4.0


class Outcome(StrEnum):
    """What became of one consumed message; the values are the ``outcome`` metric label."""

    RELAYED = "relayed"
    QUARANTINED = "quarantined"
    AUDITED = "audited"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a route's copies go, and what the contract needs to know about the route."""

    queue: str
    exchange: str
    routing_key: str | None  # None: keep the delivery's own routing key
    audit: bool
    policy: Policy
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT  # the staging queue's; 0: none is assumed


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Copy:
    """Publish this copy to the target; on its confirm the delivery counts ``outcome``.

    Made once per message: ``__init__`` written out (docs/decisions/0063).
    """

    properties: dict[str, PropertyValue]
    headers: dict[str, FieldValue]
    routing_key: str
    outcome: Outcome
    # The delivery's own content header when the copy changes nothing in it: sent as it
    # came, byte for byte, instead of encoding the same properties and headers again.
    content_header: bytes | None

    def __init__(
        self,
        *,
        properties: dict[str, PropertyValue],
        headers: dict[str, FieldValue],
        routing_key: str,
        outcome: Outcome,
        content_header: bytes | None = None,
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "properties", properties)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "routing_key", routing_key)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "content_header", content_header)


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Publish the original to the quarantine exchange with this reason.

    ``passing``: its body is not held but passed through as it arrives, so the copy is
    published once; another try takes the broker's redelivery.
    """

    reason: str
    passing: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """The broker will not take the copy for now: keep the delivery, retry the same publish.

    The delivery stays unacked on its channel (no requeue, so a quorum queue's delivery
    limit is not spent); ``reason`` is what /readyz and the log say meanwhile.
    ``may_duplicate``: the broker may have routed the refused copy to some queues (a nack,
    a channel lost before its confirm), so the retry may make a second copy there.
    """

    reason: str
    may_duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Alone:
    """Publish the same plan again, alone on a fresh channel, to see whose refusal it was.

    The broker closed a channel that carried other publishes too; only one of them may be
    the one it refuses. ``may_duplicate`` as for ``Hold``.
    """

    reason: str
    may_duplicate: bool = True


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Neither the target nor quarantine takes the delivery: reject it, requeue=false.

    The broker dead-letters it to the staging queue's dead-letter exchange when the queue
    has one (and drops it when it has none); the sidecar logs and counts it either way.
    """

    reason: str


Plan: TypeAlias = Copy | Quarantine


def plan_delivery(
    delivery: Delivery, target: Target, *, now_ms: int, new_id: Callable[[], str]
) -> tuple[Plan, Verdict | None]:
    """Decide, once per delivery, what to publish; return it with the contract's verdict.

    The verdict (None for a table that could not be decoded) carries the violations the
    caller counts and logs. In audit mode the original goes to the target unchanged
    whatever the verdict says, but for the staging queue's counters (``QUEUE_COUNTERS``),
    which no copy carries on.
    """
    if delivery.unread_body is not None:
        return Quarantine(body_too_large(delivery.unread_body), passing=True), None
    if delivery.unread_header is not None:
        return Quarantine(unread_header(delivery.unread_header)), None
    if delivery.undecodable is not None:
        reason = f"header table cannot be decoded: {delivery.undecodable.error}"
        return Quarantine(reason), None
    verdict = normalise(
        delivery.routing_key,
        delivery.properties,
        delivery.headers,
        policy=target.policy,
        now_ms=now_ms,
        new_id=new_id,
    )
    match verdict:
        case Reject() if not target.audit:
            return Quarantine(verdict.reason), verdict
        case Relay() if not target.audit:
            properties, headers = dict(verdict.properties), dict(verdict.headers)
            outcome = Outcome.RELAYED
        case _:
            headers = dict(delivery.headers)
            properties = publishable_properties(
                delivery.properties, headers, login=target.policy.login
            )
            outcome = Outcome.AUDITED
    for counter in QUEUE_COUNTERS:
        if counter in headers:
            del headers[counter]
    routing_key = delivery.routing_key if target.routing_key is None else target.routing_key
    if target.exchange == "" and routing_key == target.queue:
        loop = (
            f'the copy would go back into staging queue "{target.queue}" (default exchange,'
            f' routing key "{routing_key}"); set to.routing_key to its target queue'
        )
        return Quarantine(loop), verdict
    unchanged = properties == delivery.properties and same_table(headers, delivery.headers)
    copy = Copy(
        properties=properties,
        headers=headers,
        routing_key=routing_key,
        outcome=outcome,
        content_header=delivery.content_header if unchanged else None,
    )
    return copy, verdict


def unroutable(exchange: str, routing_key: str) -> Quarantine:
    """Return where a copy the broker returned goes: nothing takes its routing key."""
    return Quarantine(
        f'unroutable: exchange "{exchange}" has no binding for routing key "{routing_key}"'
    )


def nacked(exchange: str) -> Hold:
    """Return the hold of a copy the broker nacked (it may have routed it to some queues)."""
    return Hold(
        f'the broker refused (nacked) a publish to exchange "{exchange}"; is a target queue'
        " full with overflow reject-publish?",
        may_duplicate=True,
    )


def untaken(published: PublishOutcome, *, exchange: str, route: str, passing: bool) -> Hold:
    """Return the hold of a quarantine copy the broker returned or nacked (``published``).

    ``passing``: its body passed through and is not held, so the message goes back to its
    staging queue meanwhile.
    """
    meanwhile = (
        "The message goes back to its staging queue meanwhile (its body passed through and"
        " is not held), to pass through again"
        if passing
        else "The message is held meanwhile (until broker.consumer_timeout_s x 0.75, then"
        " dead-lettered)"
    )
    return Hold(
        f'quarantine exchange "{exchange}" {published.value} the copy (routing key "{route}");'
        f" bind a queue to it. {meanwhile}",
        may_duplicate=published is PublishOutcome.NACKED,
    )


def body_too_large(unread: UnreadBody) -> str:
    """Return the reason a delivery whose body is over ``max_body_bytes`` is quarantined."""
    return (
        f"body too large to hold: {unread.size} bytes, over broker.max_body_bytes of"
        f" {unread.limit}; passed through to quarantine as it came (to relay such bodies,"
        " raise max_body_bytes and the memory limit with it: docs/memory.md)"
    )


def unread_header(unread: UnreadHeader) -> str:
    """Return the reason a delivery whose content header was too large to read is quarantined."""
    return (
        f"content header too large to read: {unread.size} bytes, over the limit of"
        f" {unread.limit}; its properties and headers could not be read, only the body is kept"
    )


def unwritable_quarantine(reason: str, error: Exception | str) -> DeadLetter:
    """Return the decision for a quarantine copy that cannot be written as AMQP at all.

    Not even without its headers: there is nowhere left to send it, and a redelivery
    would meet the same copy again.
    """
    return DeadLetter(f"{bounded(reason)}; and the quarantine copy cannot be written: {error}")


def unencodable(error: Exception | str) -> Quarantine:
    """Return the decision for a normalised copy that cannot be written as AMQP."""
    return Quarantine(f"the normalised message cannot be encoded: {error}")


def internal_error(error: Exception) -> Quarantine:
    """Return the decision for a bug met while planning or publishing one delivery.

    Quarantine, not requeue: a requeued message would meet the same bug again, for ever.
    """
    return Quarantine(f"internal error: {error!r}")


# --- what may be republished ----------------------------------------------------------------


def publishable_properties(
    properties: Mapping[str, PropertyValue], headers: dict[str, FieldValue], *, login: str | None
) -> dict[str, PropertyValue]:
    """Return properties the broker will accept from our login (docs/contract.md section 2).

    An original republished as it was (audit mode, quarantine) loses a foreign user_id
    to ``acemq-original-user-id`` just as a normalised copy does.
    """
    result = dict(properties)
    move_user_id(result, headers, login=login)
    return result


def bounded(text: str, limit: int = REASON_MAX) -> str:
    """Return ``text`` cut to ``limit`` characters, saying how much was cut.

    A reason can list thousands of header names, and an origin can be 64 KiB: in a header
    they could outgrow the broker's frame, in a log line they would flood the log.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def reason_kind(reason: str) -> str:
    """Return the fixed start of a quarantine reason: what the sidecar wrote, not the data.

    Reasons quote names and values from the message after a colon or a double quote.
    """
    return re.split(r'[:"]', reason, maxsplit=1)[0][:80]


def log_origin(verdict: Verdict | None, delivery: Delivery) -> object:
    """Return the origin for a log line: the normalised one, else the one it arrived with."""
    headers = verdict.headers if isinstance(verdict, Relay) else delivery.headers
    origin = headers.get(ORIGIN)
    if not isinstance(origin, str):
        origin = delivery.properties.get("app_id")
    return bounded(origin, ORIGIN_LOG_MAX) if isinstance(origin, str) else origin


def same_table(ours: Mapping[str, FieldValue], theirs: Mapping[str, FieldValue]) -> bool:
    """Return whether two tables would encode to the same bytes.

    Same names in the same order, each value the very same object or a text or integer of
    the same class and value (so a change of integer width is a change).
    """
    if len(ours) != len(theirs):
        return False
    for (a, x), (b, y) in zip(ours.items(), theirs.items(), strict=True):  # a loop: no generator
        if a != b:
            return False
        if x is not y and not (type(x) is type(y) and isinstance(x, str | int) and x == y):
            return False
    return True
