"""A route's in-flight window: how many deliveries its consumer may hold, and when to change it.

RabbitMQ ignores ``basic.qos`` ``prefetch_size``, so only the count bounds the bytes a
route holds: as many of the largest body seen so far as ``broker.max_in_flight_bytes``
holds (:func:`in_flight_window`, the allowed window). A running consumer's count cannot
change on every queue type (a per-consumer qos applies to later consumers only, a
channel-wide one closes the connection on a quorum queue), so the relay changes the
window by re-consuming on the same channel: qos, cancel, consume under a new tag. These
are its decisions:

- Slow start: each channel's first consumer takes :data:`START_WINDOW`, so the first
  burst of large messages is one message, not a prefetch of them.
- Growth (:func:`next_window`): once a whole window of body sizes has been seen, times
  :data:`GROWTH`, but only to a window that fits the budget and is at least twice the
  current one, or is the route's prefetch (the relay grows a consumer only once it is
  at least half full: a window that is not the bottleneck need not grow).
- Shrink: at once, when a larger body makes the current window hold more than the
  budget, to the largest power of two within the allowed window. Since the largest body
  only grows, the allowed window only shrinks, and a shrunk window is more than half the
  allowed one, so growth cannot undo it: a route changes its window at most about
  log8(prefetch) + log2(prefetch) times per channel, never once per message.
- The change itself (:func:`refill`): the new consumer starts only once what the old one
  left in flight and the new window together fit in the larger of the old and the
  allowed window, so a change never holds more than either side of it.

What the window cannot bound, the client does: deliveries the broker sent before the
first larger body's header arrived (up to the old window of the new, larger size). The
consuming connection reads no further delivery of a route whose unsettled deliveries hold
its budget (``Channel.consume``'s ``max_in_flight_bytes``), so the route holds at most the
budget plus one message; the rest waits unread in the socket and the broker.

Pure: no I/O, no clock, no asyncio.
"""

from __future__ import annotations

from typing import Final

__all__ = ["GROWTH", "START_WINDOW", "in_flight_window", "next_window", "refill"]

START_WINDOW: Final = 1  # a channel's first window: nothing is known of its bodies yet
GROWTH: Final = 8  # how much a window grows in one step (1, 8, 64, 512)


def in_flight_window(*, prefetch: int, budget_bytes: int, largest_bytes: int | None) -> int:
    """Return the largest window that keeps the route's bodies in flight within the budget.

    As many of the largest body seen so far as the budget holds, at least 1, at most the
    route's prefetch; before any delivery (``largest_bytes`` None) the route's prefetch
    (slow start, not this, bounds the first window).
    """
    if largest_bytes is None:
        return prefetch
    return max(1, min(prefetch, budget_bytes // max(1, largest_bytes)))


def next_window(
    *, current: int, allowed: int, prefetch: int, seen: int, may_grow: bool
) -> int | None:
    """Return the window to re-consume with, or None to keep the consumer as it is.

    ``current`` is the consumer's window, ``allowed`` :func:`in_flight_window` for the
    largest body seen, ``seen`` the body sizes seen since ``current`` was set, and
    ``may_grow`` false once growing on this channel has stopped (see the relay).
    """
    if allowed < current:
        return _power_of_two_at_most(allowed)
    if not may_grow or seen < current:
        return None
    grown = min(current * GROWTH, allowed)
    if grown >= 2 * current or (grown == prefetch and grown > current):
        return grown
    return None


def refill(*, old: int, new: int, allowed: int, in_flight: int) -> int:
    """Return the window the new consumer may start with now; 0: wait for settlements.

    ``in_flight`` is what the old consumer (window ``old``) left unsettled after its
    cancel. Together with the new consumer's window it must fit in ``max(old,
    allowed)``: a growth never holds more than it allows, a shrink never more than the
    old window held.
    """
    return max(0, min(new, max(old, allowed) - in_flight))


def _power_of_two_at_most(n: int) -> int:
    """Return the largest power of two not above ``n`` (``n`` at least 1)."""
    return 1 << (n.bit_length() - 1)
