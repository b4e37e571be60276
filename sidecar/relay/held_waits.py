"""A held delivery's waits: a hold's delay, or the broker's block, until it may go on.

The settle step says ``Wait`` (a delay before the copy is published again: the backoff's
step, drawn here, within the step's bound) or
``WaitUnblocked`` (the broker blocks the connection: the copy waits in the route's unblock
line, ``sidecar.relay.unblock_line``). A stop ends either, and so does the close of the
channel the delivery came on (a broker's ``consumer_timeout`` during an alarm, say): the
broker has the delivery back, and its body is not kept waiting. A broker's
``basic.cancel`` (its queue deleted) leaves the channel open, and what is in flight on it
is still published and acked: the wait goes on until the route closes the channel, which
is seen within ``CLOSED_POLL_S``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from sidecar.relay.waits import first_of, sleep_unless
from sidecar.settle import Wait, wait_s

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp import AckChannel, RelayConnection
    from sidecar.relay.unblock_line import Ticket, UnblockLine
    from sidecar.settle import Step, WaitUnblocked

__all__ = ["CLOSED_POLL_S", "wait_out"]

CLOSED_POLL_S: Final = 1.0  # after a broker's cancel, how often an open channel is looked at


async def wait_out(  # noqa: PLR0917 - the wait, and what it may end on
    action: Wait | WaitUnblocked,
    consumer: AckChannel,
    stop: asyncio.Event,
    line: UnblockLine,
    connection: RelayConnection | None,
    ticket: Ticket | None,
    backoff: Callable[[int], float],
) -> tuple[Step | None, Ticket | None]:
    """Wait as the step says; return the step after it (None: let the delivery go).

    ``backoff`` draws the delay of the backoff's step a ``Wait`` names (``settle.wait_s``).

    For a block, also the delivery's ticket of the unblock line (kept when it is blocked
    again before its publish, so that it keeps its place).
    """
    if isinstance(action, Wait):
        await first_of(sleep_unless(stop, wait_s(action, backoff)), closed(consumer))
        let_go = stop.is_set()
    else:
        assert connection is not None  # noqa: S101 - only a connection blocks
        ticket = await line.wait(connection, stop.wait(), closed(consumer), ticket=ticket)
        let_go = ticket is None
    if let_go or not consumer.is_open:
        return None, ticket
    return action.then, ticket


async def closed(consumer: AckChannel) -> None:
    """Return once the channel a delivery came on is closed (see the module docstring)."""
    await consumer.wait_closed()
    # The broker cancelled its consumer: the route closes the channel later, and the channel
    # has no event for a close alone.
    while consumer.is_open:  # noqa: ASYNC110
        await asyncio.sleep(CLOSED_POLL_S)
