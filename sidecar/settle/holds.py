"""What becomes of a delivery the broker refuses or holds up: pure decisions, no I/O.

``sidecar.settle.settlement`` plans a delivery and reads the broker's answer to its publish;
this module decides the rest, each a total function over closed sets:

- ``after_refusal``: what a publish channel the broker closed means for the delivery
  whose publish it took down: retry it ``Alone`` on a fresh channel to learn whether the
  refusal was its own, ``Quarantine`` it (or ``DeadLetter`` it) with the broker's words,
  or ``Hold`` it for a retry;
- ``after_hold``: how long a held delivery may still wait, or that it must go to
  quarantine (or be dead-lettered) before the broker's consumer_timeout takes it back;
- ``consumer_timeout_after``: the consumer_timeout to hold by once the broker took one back;
- ``delivery_limit_reached``: a delivery one return from its quorum queue's limit;
- ``no_return_left``: a body passed through that may not go back to its queue either;
- ``read_permission_named``: a route's start refused, the permission it lacks named;
- ``blocked`` and ``slow_confirm``: what /readyz says while a delivery waits on the broker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, assert_never

from sidecar.settle.settlement import (
    DELIVERY_COUNT,
    Alone,
    Copy,
    DeadLetter,
    Hold,
    Quarantine,
    bounded,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.settle.settlement import Plan
    from sidecar.wire import FieldValue

__all__ = [
    "ACCESS_REFUSED",
    "PRECONDITION_FAILED",
    "REPEATED_REFUSALS",
    "HoldLimits",
    "Wait",
    "after_hold",
    "after_refusal",
    "blocked",
    "consumer_timeout_after",
    "delivery_limit_reached",
    "no_return_left",
    "read_permission_named",
    "slow_confirm",
]

ACCESS_REFUSED: Final = 403
PRECONDITION_FAILED: Final = 406
# Channel-closing refusals the broker gives again for the same publish, whatever the
# retry: no write permission, an internal exchange (403); a message above
# max_message_size, a user_id that is not the login (406).
REPEATED_REFUSALS: Final = frozenset({ACCESS_REFUSED, PRECONDITION_FAILED})
# Shares of the broker's consumer_timeout: a held copy goes to quarantine at the first,
# a quarantine copy nobody takes is dead-lettered at the second; the rest is margin for
# the quarantine publish, the reject, and the broker's own timer.
QUARANTINE_SHARE: Final = 0.5
DEAD_LETTER_SHARE: Final = 0.75
DEADLINE_SLACK_S: Final = 0.001  # a wait that ends this close to its deadline has reached it
# RabbitMQ's channel.close when its consumer_timeout takes a delivery back (rabbit_channel,
# 3.10): "406 PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout
# value used: 5000 ms. This timeout value can be configured, see consumers doc guide ...".
_TAKEN_BACK = re.compile(r"\b406\b.*delivery acknowledgement.*timed out", re.DOTALL)
_TIMEOUT_USED = re.compile(r"Timeout value used: (\d+) ms")
MIN_CONSUMER_TIMEOUT_S: Final = 1.0  # the route map's least consumer_timeout_s


@dataclass(frozen=True, slots=True)
class Wait:
    """Keep holding the delivery; try again after the backoff, but within ``at_most_s``."""

    at_most_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldLimits:
    """The bounds on holding one delivery (the route map's broker section)."""

    consumer_timeout_s: float
    nack_max_attempts: int
    nack_max_s: float


def after_refusal(
    code: int, text: str, plan: Plan, *, alone: bool, exchange: str
) -> Quarantine | DeadLetter | Alone | Hold:
    """Return what the broker closing the publish channel means for this delivery.

    ``code`` and ``text`` are the broker's channel.close; ``alone`` says whether this
    publish was the only one on its channel; ``exchange`` is where the plan published. A
    refusal the broker repeats (403, 406) on a channel shared with other publishes may be
    another one's: the delivery is tried again alone. Alone, it is its own: the copy goes
    to quarantine with the broker's words, and a quarantine copy the broker refuses so is
    dead-lettered. Any other code may pass: the publish is retried (held).
    """
    words = f'the broker refused a publish to exchange "{exchange}": {code} {text}'
    if code not in REPEATED_REFUSALS:
        return Hold(f"{words}; retrying on a new channel", may_duplicate=True)
    if not alone:
        return Alone(words)
    match plan:
        case Copy():
            return Quarantine(words)
        case Quarantine(reason=reason):
            return DeadLetter(f"{bounded(reason)}; and the quarantine copy was refused: {words}")
        case _:
            assert_never(plan)


def quarantine_deadline_s(limits: HoldLimits) -> float:
    """Return how long a held copy may wait before it goes to quarantine instead.

    The route map's ``nack_max_s``, and never past half the broker's consumer_timeout.
    """
    return min(limits.nack_max_s, limits.consumer_timeout_s * QUARANTINE_SHARE)


def after_hold(
    hold: Hold, plan: Plan, *, attempts: int, held_s: float, limits: HoldLimits
) -> Wait | Quarantine | DeadLetter:
    """Return how long a held delivery may still wait at most, or where it must go now.

    ``attempts`` publishes of the plan were held so far, and the delivery arrived
    ``held_s`` ago. A copy the broker keeps refusing
    goes to quarantine (reason: what the broker said, for how long) after
    ``nack_max_attempts`` or ``nack_max_s``, and in any case at half the broker's
    consumer_timeout; a quarantine copy nobody takes is dead-lettered at three quarters of
    it. The wait (the route's backoff, drawn by the relay) never runs past the deadline.
    """
    timeout_s = limits.consumer_timeout_s
    match plan:
        case Copy():
            deadline_s = quarantine_deadline_s(limits)
            if attempts >= limits.nack_max_attempts or held_s >= deadline_s - DEADLINE_SLACK_S:
                return Quarantine(
                    f"{bounded(hold.reason)} ({attempts} attempts over {held_s:.1f}s; given up"
                    f" after {limits.nack_max_attempts} attempts or {deadline_s:g}s, before the"
                    f" broker's consumer_timeout of {timeout_s:g}s)"
                )
        case Quarantine(reason=reason):
            deadline_s = timeout_s * DEAD_LETTER_SHARE
            if held_s >= deadline_s - DEADLINE_SLACK_S:
                return DeadLetter(
                    f"{bounded(reason)}; and for {held_s:.1f}s: {bounded(hold.reason)}"
                    f" (dead-lettered before the broker's consumer_timeout of {timeout_s:g}s)"
                )
        case _:
            assert_never(plan)
    return Wait(max(0.0, deadline_s - held_s))


def consumer_timeout_after(
    reason: str, *, held_s: float | None, limits: HoldLimits
) -> float | None:
    """Return the consumer_timeout to hold deliveries by, once the broker took one back.

    ``reason`` is why the route's consuming channel closed: None unless it is the broker's
    406 for a delivery held past its consumer_timeout, or when nothing is lower than
    ``limits`` already. ``held_s``: how long the route had held the oldest delivery on
    that channel, the one the broker took back; the value the broker's text names, when
    it names one, may be lower still (it checks only every ``channel_tick_interval``).
    """
    if _TAKEN_BACK.search(reason) is None:
        return None
    timeout_s = limits.consumer_timeout_s
    if held_s is not None:
        timeout_s = min(timeout_s, held_s)
    if (used := _TIMEOUT_USED.search(reason)) is not None:
        timeout_s = min(timeout_s, int(used.group(1)) / 1000)
    timeout_s = max(timeout_s, MIN_CONSUMER_TIMEOUT_S)
    return timeout_s if timeout_s < limits.consumer_timeout_s else None


def blocked(reason: str) -> str:
    """Return the /readyz reason for a delivery waiting while the broker blocks publishing."""
    return f'the broker blocked the connection ("{reason}"); nothing is published until it unblocks'


def slow_confirm(exchange: str, *, limit_s: float) -> str:
    """Return the /readyz reason for a publish still waiting for its confirm."""
    return (
        f'no confirm from the broker within {limit_s:.0f}s for a publish to exchange "{exchange}"'
        " (a memory or disk alarm?); still waiting, it will not be sent twice"
    )


def delivery_limit_reached(
    headers: Mapping[str, FieldValue], limit: int, *, redelivered: bool
) -> str | None:
    """Return why a delivery may take no return more before its queue's limit, or None.

    A quorum queue counts in ``x-delivery-count`` the returns that spent an attempt (on
    RabbitMQ 4.3 not a ``basic.nack``; a ``basic.reject``, a channel's close or a lost
    connection on every version: tests/faults/test_broker_versions.py), and past
    ``x-delivery-limit`` drops the message, or dead-letters it: a delivery with ``limit``
    spent is its last. At ``limit - 1`` spent, one more return leaves only that last
    delivery (docs/decisions/0068).

    The count is the broker's only on a redelivery: a quorum queue writes it when it
    delivers a message again, and a first delivery's header is whatever its producer
    copied in (a republished consumed message, a retry topology, a shovel off a quorum
    queue). A classic queue never writes it, and sets ``redelivered`` all the same: the
    route says so with ``delivery_limit: 0`` (``limit``), and the header is never read.
    """
    spent = headers.get(DELIVERY_COUNT)
    if not redelivered or limit <= 0 or not isinstance(spent, int) or isinstance(spent, bool):
        return None
    if spent < max(limit - 1, 1):
        return None
    return (
        f"delivery limit: the broker has given this message back {spent} times"
        f" ({DELIVERY_COUNT}); a quorum queue with x-delivery-limit {limit} (the route's"
        " delivery_limit; RabbitMQ 4.x's default is 20) drops or dead-letters it at the next"
        " return, so it is quarantined first."
        " Look for what keeps returning it: lost connections, the broker's consumer_timeout,"
        " a sidecar that crashes on it"
    )


def no_return_left(reason: str, held: str, limit: str) -> DeadLetter:
    """Return the dead-letter of a body passed through whose queue would drop it next.

    ``reason``: why it went to quarantine; ``held``: why its quarantine copy was not taken;
    ``limit``: ``delivery_limit_reached``'s reason. Its body is not held, so only the
    broker's redelivery could publish it again, and the requeue that asks for one would
    spend the last return the queue allows: the staging queue's dead-letter exchange is
    the one place left.
    """
    return DeadLetter(
        f"{bounded(reason)}; and its quarantine copy was not taken ({bounded(held)}); it"
        f" cannot go back to its queue either, which would drop it: {bounded(limit)}"
    )


# RabbitMQ 3.10.8: "403 ACCESS_REFUSED - access to queue 'Q' in vhost 'V' refused for user
# 'U'"; 4.0.5 and 4.3.6 say "read access to queue": only the later names the permission.
_QUEUE_REFUSED = re.compile(r"\b403\b.*?(?<!read )access to queue '([^']*)'")


def read_permission_named(reason: str) -> str:
    """Return why a route could not start, naming the permission a queue's 403 leaves out.

    The relay only reads its staging queue (a passive declare, then ``basic.consume``), so
    a 403 on it means the login lacks read permission there; configure is never needed
    (tests/faults/test_broker_versions.py, on 3.10.8, 4.0.5 and 4.3.6).
    """
    match = _QUEUE_REFUSED.search(reason)
    if match is None:
        return reason
    return f"{reason}: the login needs read permission on queue '{match.group(1)}'"
