"""A route's in-flight window: how many deliveries its consumer may hold, and when to change it.

Owns the numbers: the allowed window (as many of the largest body seen as
``broker.max_in_flight_bytes`` holds, within the prefetch), slow start at
:data:`START_WINDOW`, growth times :data:`GROWTH` once a whole window was seen (only to at
least twice the window, or to the prefetch), a shrink at once to a power of two within
the allowed window, and the room a new consumer may take (:func:`refill`).

Must not do I/O, read a clock or import asyncio, and never sends qos, cancel or consume:
``relay.consumer`` carries each change out.
Why: docs/decisions/0003-byte-budget-window.md.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "GROWTH",
    "START_WINDOW",
    "grows_on",
    "in_flight_window",
    "next_window",
    "refill",
    "stops_growing",
]

START_WINDOW: Final = 1  # a channel's first window: nothing is known of its bodies yet
GROWTH: Final = 64  # how much a window grows in one step (1, 64, 512)


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


def stops_growing(*, seen: int, current: int) -> bool:
    """Return whether a window with no growth due may stop asking for one on its channel.

    ``seen`` bodies since the window was set, ``current`` its size: once a whole window was
    seen and still no growth is due, none can come later either (the allowed window only
    shrinks as larger bodies come).
    """
    return seen >= current


def grows_on(*, may_grow: bool, whole: bool) -> bool:
    """Return whether a channel's window may still grow after a re-consume.

    ``whole``: the new consumer started with the whole window it asked for. One that had to
    start smaller (deliveries held in flight past the refill's wait) keeps that window on
    its channel: the next growth would wait for the same held deliveries again.
    """
    return may_grow and whole


def _power_of_two_at_most(n: int) -> int:
    """Return the largest power of two not above ``n`` (``n`` at least 1)."""
    return 1 << (n.bit_length() - 1)
