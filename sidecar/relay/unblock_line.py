"""The line a route's copies wait in while the broker blocks the connection: first in, first out.

A copy the settle step holds for a broker's block (``WaitUnblocked``) takes a ticket at the
back of the line. Only the head waits for the broker's unblock; each one behind waits for
the one ahead to go. A copy leaves the line as it starts its publish (``leave``), and only
then is the next one woken, so the copies start their publishes in the order their
deliveries came (one that must then wait again, at the connection's gate or alone on a
channel of its own, may still be passed there: the line orders the wake-ups, not the
broker's reads).
A delivery that arrives while anyone is in line, blocked or not any more, must not publish
ahead of them: ``busy`` tells the relay to send it to the back of the line. A copy whose
channel closes or whose route stops meanwhile leaves the line with nothing published (the
broker redelivers it), and wakes the next.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from sidecar.relay.waits import first_of

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from sidecar.amqp import RelayConnection

__all__ = ["Ticket", "UnblockLine"]


class Ticket:
    """One copy's place in the line: set when the copy ahead has left."""

    __slots__ = ("turn",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.turn: asyncio.Future[None] = loop.create_future()


class UnblockLine:
    """One route's copies waiting for the broker to unblock; see the module docstring."""

    def __init__(self) -> None:
        self._line: deque[Ticket] = deque()
        self._reason = ""  # the broker's reason for the last block seen

    def blocked(self, connection: RelayConnection | None) -> str | None:
        """Return why a copy without a ticket must not publish now; None: it may.

        The broker blocks the connection (its reason), or copies are in line from a block
        just lifted (the reason they waited for): a new copy goes to the back of the line.
        """
        if connection is not None and (reason := connection.blocked_reason) is not None:
            self._reason = reason
            return reason
        return self._reason if self._line else None

    def __len__(self) -> int:
        return len(self._line)

    async def wait(
        self,
        connection: RelayConnection,
        *others: Coroutine[Any, Any, Any],
        ticket: Ticket | None = None,
    ) -> Ticket | None:
        """Join the back of the line; return its ticket once it is this copy's turn.

        Its turn: every copy ahead has left and the broker does not block the connection.
        None, out of the line, when one of ``others`` (a stop, the channel's close) ends
        first. The copy must ``leave`` with the ticket as it starts its publish. With a
        ``ticket`` still in line (blocked again before its publish), it keeps its place.
        """
        if ticket is None or ticket not in self._line:
            ticket = Ticket(asyncio.get_running_loop())
            if not self._line:
                ticket.turn.set_result(None)
            self._line.append(ticket)
        try:
            index, _ = await first_of(self._turn(ticket, connection), *others)
        except BaseException:
            self.leave(ticket)
            raise
        if index != 0:
            self.leave(ticket)
            return None
        return ticket

    @staticmethod
    async def _turn(ticket: Ticket, connection: RelayConnection) -> None:
        await asyncio.shield(ticket.turn)
        await connection.wait_unblocked()

    def leave(self, ticket: Ticket) -> None:
        """Take ``ticket`` out of the line; the next copy's turn comes if it was the head."""
        line = self._line
        if not line:
            return
        if line[0] is ticket:
            line.popleft()
            if line and not line[0].turn.done():
                line[0].turn.set_result(None)
        else:
            try:
                line.remove(ticket)
            except ValueError:
                return
