"""The current consumer's unsettled deliveries, and the gate that holds acks for a cancel.

``sidecar.relay.consumer``'s re-consume cancels a consumer only once it holds its whole
window unsettled (the broker has nothing on its way to it then), and no ack may leave
from then until the cancel is written: an ack would give the broker credit to send
another delivery, which could be on its way at the cancel (one written after it reaches
the broker after it). ``AckGate`` counts what the current consumer holds (delivery tags
are the channel's, so a consumer's deliveries are those from its first tag on), closes
the gate, and waits until the consumer is full, or holds what its byte budget lets the
connection read (docs/decisions/0041). The consumer's window and when to change it are
``sidecar.flow.window``'s, the cancel and the consume ``RouteConsumer``'s.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["AckGate"]


class AckGate:
    """Counts the current consumer's unsettled deliveries; holds acks while a cancel waits.

    ``opened`` is set while acks may go: ``RouteConsumer.ack`` waits on it when cleared,
    then calls ``settled``. Every delivery is counted by ``delivered`` before its settle
    starts. ``has_room``: whether the connection reads the consumer's next delivery now
    (while acks wait, it reads none once its channel holds its byte budget).
    """

    def __init__(self, has_room: Callable[[], bool] = lambda: True) -> None:
        self._has_room = has_room
        self.opened = asyncio.Event()  # cleared until a cancel is written
        self.opened.set()
        self.holding = 0  # the current consumer's deliveries not acked or rejected yet
        self._since = 0  # the current consumer's first delivery tag (tags are per channel)
        self._last_tag = 0
        self._arrival: asyncio.Future[None] | None = None  # the next one's, while awaited
        self._close_at: int | None = None  # close the gate once the consumer holds this many

    def delivered(self, delivery_tag: int) -> None:
        """Count a delivery that arrived (before its settle starts)."""
        self._last_tag = max(self._last_tag, delivery_tag)
        if delivery_tag >= self._since:
            self.holding += 1
            if self._close_at is not None and (
                self.holding >= self._close_at or not self._has_room()
            ):
                self.opened.clear()
                self._close_at = None
            arrival, self._arrival = self._arrival, None
            if arrival is not None and not arrival.done():
                arrival.set_result(None)

    def settled(self, delivery_tag: int) -> None:
        """Count a delivery acked or rejected (once the gate let it through)."""
        if delivery_tag >= self._since:
            self.holding -= 1

    def release(self) -> None:
        """Let acks go again (the cancel-ok came, or the cancel was given up)."""
        self.opened.set()

    def next_consumer(self) -> None:
        """Count for a new consumer from the next delivery on.

        Every delivery after this is the new consumer's: the old one's all came before its
        cancel-ok, and each was counted as it came.
        """
        self._since, self.holding = self._last_tag + 1, 0

    async def until_full(self, window: int, *, idle_s: float, bound_s: float) -> bool:
        """Return True once the consumer holds ``window`` deliveries unsettled, acks held.

        Acks (and rejects) wait from then until ``release``. The consumer need not fill by
        itself (a quorum queue applies acks a little later than they are made), so acks
        wait while it fills, once it is half full or holds its byte budget (the signs of a
        backlog), while deliveries keep coming, for ``bound_s`` at most. False, acks let
        go, when none came for ``idle_s`` (no backlog, and nothing needs a new window yet)
        or when a trickle did not fill it within ``bound_s`` (a delivery held longer could
        meet a short consumer_timeout). True then too if the consumer holds its byte
        budget: the connection reads none of its deliveries until an ack, and the broker
        has had ``idle_s`` to send what its credit allowed, which waits unread (on the
        channel, not on its way).
        """
        half = max(1, window // 2)
        loop = asyncio.get_running_loop()
        try:
            if self.holding >= half or not self._has_room():
                self.opened.clear()
            else:
                # delivered() closes the gate as the delivery that makes it half full comes:
                # waiting to see it here could let a quick ack through first.
                self._close_at = half
                while self.opened.is_set():
                    await self._next_delivery()
            end = loop.time() + bound_s  # acks are held from here
            while self.holding < window:
                async with asyncio.timeout(min(idle_s, end - loop.time())):
                    await self._next_delivery()
        except TimeoutError:
            if not self._has_room():
                return True
            self.opened.set()
            return False
        except BaseException:
            self.opened.set()
            raise
        finally:
            self._close_at = None
        return True

    async def hold_until_full(
        self, window: int, *, idle_s: float, quiet_s: float, bound_s: float
    ) -> None:
        """Hold acks from now on; return once the consumer holds ``window`` deliveries.

        Or once none came for ``idle_s`` (no backlog), counting the ``quiet_s`` since the
        consumer's last delivery or ack, or after ``bound_s`` (a trickle). For a drain's
        cancel: with acks held the broker gets no credit, so once the window is full
        nothing is on its way to the consumer. Acks wait until ``release``.
        """
        self.opened.clear()
        loop = asyncio.get_running_loop()
        end = loop.time() + bound_s
        first = idle_s - quiet_s
        while self.holding < window:
            wait_s = min(first, end - loop.time())
            first = idle_s
            if wait_s <= 0:
                return
            try:
                async with asyncio.timeout(wait_s):
                    await self._next_delivery()
            except TimeoutError:
                return

    async def _next_delivery(self) -> None:
        """Return once the current consumer's next delivery is counted."""
        arrival = self._arrival
        if arrival is None or arrival.done():  # done: given up on by a timeout
            self._arrival = arrival = asyncio.get_running_loop().create_future()
        await arrival
