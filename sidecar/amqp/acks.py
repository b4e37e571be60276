"""A channel's acks: deliveries in the order they came, acks made in one turn sent together.

The broker takes ``multiple`` acks: the leading run of acked deliveries leaves as one frame
at the end of the event loop's turn; any acked behind one still in flight leaves singly,
never twice. It writes through the function it is given and keeps no socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.wire import ack_frame

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

__all__ = ["Acks"]


class Acks:
    """The unacked deliveries of one channel, and the acks due at the end of the turn."""

    def __init__(
        self, number: int, *, loop: asyncio.AbstractEventLoop, write: Callable[[bytes], None]
    ) -> None:
        self._number = number
        self._loop = loop
        self._write = write
        # Deliveries in the order they came, True once acked.
        self._unacked: dict[int, bool] = {}
        self._due = 0
        self._stopped = False

    def expect(self, delivery_tag: int) -> None:
        """Note a delivery handed to the consumer: its ack may be batched."""
        self._unacked[delivery_tag] = False

    def ack(self, delivery_tag: int) -> None:
        """Ack a delivery: batched at the end of the turn when it is one we expect."""
        if self._unacked.get(delivery_tag) is False:
            self._unacked[delivery_tag] = True
            if not self._due:
                self._loop.call_soon(self.flush)
            self._due += 1
        else:
            self._write(ack_frame(self._number, delivery_tag))

    def forget(self, delivery_tag: int) -> None:
        """Drop a delivery settled otherwise (rejected): no ack will cover it."""
        self._unacked.pop(delivery_tag, None)

    def flush(self) -> None:
        """Send the acks made so far (a channel about to close sends them first)."""
        unacked, due = self._unacked, self._due
        self._due = 0
        if not due or self._stopped:
            return
        leading = 0
        for acked in unacked.values():
            if not acked:
                break
            leading += 1
        if leading:
            last = 0
            for last in list(unacked)[:leading]:
                del unacked[last]
            self._write(ack_frame(self._number, last, multiple=leading > 1))
        if due > leading:  # acked behind one still in flight: singly, never twice
            for tag in [t for t, acked in unacked.items() if acked]:
                del unacked[tag]
                self._write(ack_frame(self._number, tag))

    def stop(self) -> None:
        """Send nothing more: the channel is closed, and the broker requeues what is unacked."""
        self._stopped = True
        self._unacked.clear()
