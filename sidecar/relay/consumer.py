"""One route's consumer on its channel, and the re-consume that changes its window.

Owns the consumer as it is now (its tag, its window, what it holds) and the re-consume on
the same channel, in this order: hold acks until the consumer holds its whole window, or
what its byte budget lets the connection read with no delivery for ``FILL_IDLE_S``, for
``FILL_BOUND_S`` at most (``relay.ack_gate``: then nothing is on its way to it, which a
quorum queue would return and count against its delivery limit); ``basic.cancel``, acks
going again once it is written; wait for room (``flow.window.refill``); then
``basic.qos`` and ``basic.consume`` under ``acemq-sidecar.<route>#<n>``. The old
consumer's deliveries are settled as any other. A single-active-consumer route never
re-consumes.

Must not decide the window (``flow.window`` does: its size, its growth and when it stops
growing) or requeue a delivery.
Why: docs/decisions/0003-byte-budget-window.md, 0041-reconsume-under-backpressure.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from sidecar.amqp import ChannelLostError, MissingEntityError
from sidecar.flow import (
    START_WINDOW,
    grows_on,
    in_flight_window,
    next_window,
    refill,
    stops_growing,
)
from sidecar.relay.ack_gate import AckGate

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp import AckChannel, BodyStream, Consumer, RelayConnection
    from sidecar.clock import Clock
    from sidecar.relay.state import RouteState
    from sidecar.wire import Delivery

__all__ = ["InFlightWindow", "RouteConsumer", "blocked_of"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them

# A re-consume's cancel, qos and consume: a broker that does not answer them in this time
# leaves the consumer unknown, so the channel is closed (and reopened) instead.
RECONSUME_TIMEOUT_S = 10.0
# While acks wait for a consumer to fill its window before a cancel: with no delivery for
# this long there is no backlog to fill it (with one, the broker sends within a round trip).
FILL_IDLE_S = 0.5
# And for this long at most in all: a trickle of deliveries, each within FILL_IDLE_S of the
# last, does not fill a large window (512 at one every 0.49 s: over four minutes), and acks
# held that long could meet a short consumer_timeout. A backlog fills one in milliseconds.
FILL_BOUND_S = 2.0
# How long a new consumer waits for what the old one left in flight to make room for its
# whole window; past it, it starts with what fits (deliveries held for the broker can take
# minutes to settle, and the route would consume nothing meanwhile).
REFILL_WAIT_S = 1.0


class InFlightWindow:
    """One route's consumer window and what ``sidecar.flow.window`` decides it from.

    The largest body seen is kept across the route's channels; the consumer's window, the
    body sizes seen since it was set and whether it may still grow are per channel.
    ``note`` runs for every content header, in the client's frame handler: it counts,
    compares, and sets ``wanted`` when a change is due; ``RouteConsumer`` makes it.
    """

    def __init__(self, *, prefetch: int, budget_bytes: int, fixed: bool = False) -> None:
        self._prefetch = prefetch
        self._budget = self.budget_bytes = budget_bytes  # the channel reads no more past it
        # A single-active-consumer queue: a channel keeps the window it starts with (what
        # the budget allows for the largest body seen so far), as a re-consume's cancel
        # would hand the active role, and the queue's order, to another replica.
        self._fixed = fixed
        self.largest: int | None = None
        self.allowed = prefetch  # in_flight_window for the largest body seen
        self.current = START_WINDOW
        self._seen = 0
        self._may_grow = True
        self.wanted = asyncio.Event()

    def start(self) -> int:
        """Return the window a new channel starts with: slow start, whatever was learned."""
        self.current = self.allowed if self._fixed else min(START_WINDOW, self.allowed)
        self._seen = 0
        self._may_grow = not self._fixed
        self.wanted.clear()
        return self.current

    def note(self, size: int) -> None:
        """Record a delivery's body size, from its content header."""
        self._seen += 1
        largest = self.largest
        if (
            largest is not None
            and size <= largest
            and not self._may_grow
            and self.allowed >= self.current
        ):
            return  # the common case: only a larger body can change anything now
        if largest is None or size > largest:
            self.largest = size
            self.allowed = in_flight_window(
                prefetch=self._prefetch, budget_bytes=self._budget, largest_bytes=size
            )
        if self._fixed:
            return  # learned for the next channel; this one keeps its window
        if self.target() is not None:
            self.wanted.set()
        elif stops_growing(seen=self._seen, current=self.current):
            self._may_grow = False

    def target(self) -> int | None:
        """Return the window the consumer should move to now, or None."""
        return next_window(
            current=self.current,
            allowed=self.allowed,
            prefetch=self._prefetch,
            seen=self._seen,
            may_grow=self._may_grow,
        )

    def applied(self, window: int, *, whole: bool) -> None:
        """Record the new consumer's window; not ``whole``: it had to start smaller."""
        self.current = window
        self._seen = 0
        self._may_grow = grows_on(may_grow=self._may_grow, whole=whole)
        if self.target() is not None:
            self.wanted.set()


class RouteConsumer:
    """One route's consumer on one channel; the settler acks and rejects through it."""

    def __init__(
        self,
        channel: Consumer,
        *,
        route: str,
        queue: str,
        window: InFlightWindow,
        state: RouteState,
        settle: Callable[[AckChannel, Delivery], None],
        clock: Clock,
        max_body_bytes: int | None = None,
    ) -> None:
        self._channel = channel
        self.body_size: Callable[[int], None] = window.note  # as the channel's DeliveryConsumer
        self._max_body_bytes = max_body_bytes  # a larger body passes through, never held
        self._route = route
        self._queue = queue
        self._window = window
        self._state = state
        self._settle = settle
        self._tag_base = f"acemq-sidecar.{route}"
        self.consumer_tag = self._tag_base  # the consumer the broker has now
        self._consumers = 1
        self._gate = AckGate(channel.has_room)
        self._monotonic = clock.monotonic
        # Delivery tag -> when it came, until acked or rejected: the oldest is the one the
        # broker's consumer_timeout would take back (it checks the channel's oldest unacked).
        self._arrived: dict[int, float] = {}
        self._active_at = self._monotonic()  # the last delivery or ack (or the start)

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack."""
        return self._channel.is_open

    @property
    def cancelled_by_broker(self) -> bool:
        """Whether the broker cancelled the consumer (its ``basic.cancel``); the channel stays."""
        return self._channel.consumer_cancelled

    async def ack(self, delivery_tag: int) -> bool:
        """Ack one delivery (once no cancel waits); False when the channel is gone."""
        while (acked := self.try_ack(delivery_tag)) is None:
            await self._gate.opened.wait()
        return acked

    def try_ack(self, delivery_tag: int) -> bool | None:
        """Ack now, unless a cancel holds acks back (None: nothing done, ``ack`` waits)."""
        gate = self._gate
        if not gate.opened.is_set():
            return None
        gate.settled(delivery_tag)
        if self._channel.try_ack(delivery_tag):
            self._active_at = self._monotonic()
            self._arrived.pop(delivery_tag, None)
            return True
        return False

    def passing_body(self, delivery_tag: int) -> BodyStream | None:
        """Return the stream of a delivery whose body passes through, once; else None."""
        return self._channel.passing_body(delivery_tag)

    async def reject(self, delivery_tag: int, *, requeue: bool) -> bool:
        """Reject one delivery (once no cancel waits); False when the channel is gone."""
        gate = self._gate
        if not gate.opened.is_set():
            await gate.opened.wait()
        gate.settled(delivery_tag)
        if await self._channel.reject(delivery_tag, requeue=requeue):
            self._active_at = self._monotonic()
            self._arrived.pop(delivery_tag, None)
            return True
        return False

    async def close(self) -> None:
        """Close the channel; what is unacked goes back to its queue."""
        await self._channel.close()

    def oldest_unsettled_s(self) -> float | None:
        """Return how long ago the oldest delivery not acked or rejected came, if any."""
        for arrived in self._arrived.values():  # in the order they came
            return self._monotonic() - arrived
        return None

    # --- the consumer's life ---

    async def start(self) -> None:
        """Start the channel's first consumer."""
        await self._consume(self.consumer_tag)

    async def _consume(self, tag: str) -> None:
        """Start a consumer under ``tag``, with the window's byte limits."""
        await self._channel.consume(
            self._queue,
            self,
            consumer_tag=tag,
            max_in_flight_bytes=self._window.budget_bytes,
            max_body_bytes=self._max_body_bytes,
        )

    async def cancel(self, *, fill_s: float) -> None:
        """Cancel the current consumer (a drain): no more deliveries once it returns.

        As a re-consume does, it first holds acks, up to ``fill_s``, until the consumer
        holds its whole window or had no delivery (nor ack) for ``FILL_IDLE_S``, so that
        nothing is on its way to it; the acks go once the cancel is written.
        """
        gate, quiet_s = self._gate, self._monotonic() - self._active_at
        try:
            await gate.hold_until_full(
                self._window.current, idle_s=FILL_IDLE_S, quiet_s=quiet_s, bound_s=fill_s
            )
            await self._channel.cancel(self.consumer_tag, on_sent=gate.release)
        finally:
            gate.release()

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels the consumer."""
        return await self._channel.wait_closed()

    async def wait_gone(self) -> None:
        """Return once the channel begins to close (a broker's cancel alone does not)."""
        await self._channel.wait_gone()

    def deliver(self, delivery: Delivery) -> None:
        """Take a delivery from the channel's frame handler: to the route's settler."""
        self._arrived[delivery.delivery_tag] = self._active_at = self._monotonic()
        self._gate.delivered(delivery.delivery_tag)
        self._settle(self, delivery)

    # --- changing the window ---

    async def follow(self, connection: RelayConnection, publishing: RelayConnection) -> str:
        """Re-consume whenever the window should change; return why, if a change failed.

        Runs until cancelled (the channel closed, or a stop). ``consumer_tag`` is the new
        tag before its consume is sent, so a drain's cancel covers the broker's consumer.
        """
        window = self._window
        while True:
            await window.wanted.wait()
            if (blocked := blocked_of(connection, publishing)) is not None:
                # A blocked connection reads nothing (a cancel would time out), and nothing
                # is acked while the publishing one is: the current window stays meanwhile.
                await blocked.wait_unblocked()
                if not connection.is_open:
                    return "connection lost"
                continue
            window.wanted.clear()
            if window.target() is None:
                continue
            try:
                reason = await self._reconsume(connection, publishing)
            except (ChannelLostError, MissingEntityError) as e:
                return str(e)
            except TimeoutError:
                return f"the broker did not answer the re-consume within {RECONSUME_TIMEOUT_S:g}s"
            except Exception as e:
                log.exception("route %s: unexpected error while re-consuming", self._route)
                return f"unexpected error while re-consuming: {e!r}"
            if reason is not None:
                return reason

    async def _reconsume(self, connection: RelayConnection, via: RelayConnection) -> str | None:
        """Move to a new consumer on the channel (the module's steps); why not, if it failed."""
        window, channel, gate = self._window, self._channel, self._gate
        old, old_tag = window.current, self.consumer_tag
        if not await gate.until_full(old, idle_s=FILL_IDLE_S, bound_s=FILL_BOUND_S):
            # Try again at a later delivery's header (not at once: nothing to fill now).
            window.wanted.clear()
            return None
        if blocked_of(connection, via) is not None:  # blocked while it filled: after it
            gate.release()
            window.wanted.set()
            return None
        try:
            async with asyncio.timeout(RECONSUME_TIMEOUT_S):
                # Acks go once the cancel is written: the broker reads them after it, and
                # the cancel-ok may wait behind deliveries that only an ack lets be read.
                confirmed = await channel.cancel(old_tag, on_sent=gate.release)
        finally:
            gate.release()
        if not confirmed:
            return f"the broker did not confirm the cancel of consumer {old_tag}"
        if channel.consumer_cancelled:
            return None  # the broker's own cancel: wait_closed has returned, the worker acts
        # A body larger than the target may have come before the cancel-ok.
        new = window.target() or old
        take = await _room_for(self._state, window, old=old, new=new)
        self._consumers += 1
        tag = self.consumer_tag = f"{self._tag_base}#{self._consumers}"
        # Each of the old consumer's deliveries counted itself before its cancel-ok (its
        # task starts before ours resumes).
        gate.next_consumer()
        async with asyncio.timeout(RECONSUME_TIMEOUT_S):
            await channel.qos(take)
            await self._consume(tag)
        window.applied(take, whole=take == new)
        _log_window(self._route, old, take, largest=window.largest)
        return None


def _log_window(route: str, old: int, new: int, *, largest: int | None) -> None:
    """Say a window change: at info when it shrank for larger bodies, else at debug."""
    extra = {"route": route, "window": new, "largest_bytes": largest}
    if new < old:
        log.info(
            "route %s: window %d -> %d for bodies of up to %s bytes",
            route,
            old,
            new,
            largest,
            extra=extra,
        )
    else:
        log.debug("route %s: window %d -> %d", route, old, new, extra=extra)


async def _room_for(state: RouteState, window: InFlightWindow, *, old: int, new: int) -> int:
    """Return the window the new consumer may start with, waiting for room if need be."""

    def room() -> int:
        return refill(old=old, new=new, allowed=window.allowed, in_flight=state.in_flight)

    if room() < new:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REFILL_WAIT_S):
                await state.wait_in_flight_at_most(max(old, window.allowed) - new)
    while room() == 0:  # every slot held: as the old consumer would, take nothing yet
        await state.wait_in_flight_at_most(max(old, window.allowed) - 1)
    return room()


def blocked_of(connection: RelayConnection, publishing: RelayConnection) -> RelayConnection | None:
    """Return the route's connection the broker blocks, publishing first; None for neither."""
    if publishing.blocked_reason is not None:
        return publishing
    return connection if connection.blocked_reason is not None else None
