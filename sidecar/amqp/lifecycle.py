"""A channel's life, as an explicit state machine: open, requests, close, control frames.

A channel is ``OPENING`` until the broker's open-ok, ``OPEN`` while it works, ``CLOSING``
once we sent our close, ``CLOSED`` when either side ended it or the connection went. Only
an open channel sends requests; the close is sent once, however many wait for it, and a
channel the broker closed is answered with close-ok and never written to again. The
broker's ``channel.flow`` is answered and kept: while it is inactive, :meth:`wait_flowing`
waits (the channel's publishes wait on it).

It knows nothing of messages: :class:`sidecar.amqp.channel.Channel` adds consuming,
publishing and acking on top, and decides what an open channel may do with them.
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from typing import TYPE_CHECKING, Final, Protocol

from sidecar.amqp import codec
from sidecar.errors import ChannelClosedError, ChannelLostError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CLOSE_TIMEOUT_S", "ChannelLife", "ChannelLink", "ChannelState"]

CLOSE_TIMEOUT_S = 5.0  # cancel and close wait this long for the broker, no longer


class ChannelState(StrEnum):
    """Where a channel is in its life; see the module docstring."""

    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# The moves a channel can make; any other is ignored (an open-ok that comes after our
# close must not reopen it, nothing leaves CLOSED).
_MOVES: Final = {
    ChannelState.OPENING: frozenset({ChannelState.OPEN, ChannelState.CLOSING, ChannelState.CLOSED}),
    ChannelState.OPEN: frozenset({ChannelState.CLOSING, ChannelState.CLOSED}),
    ChannelState.CLOSING: frozenset({ChannelState.CLOSED}),
    ChannelState.CLOSED: frozenset(),
}


class ChannelLink(Protocol):
    """What a channel needs of its connection's link."""

    loop: asyncio.AbstractEventLoop
    frame_max: int
    blocked: bool  # the broker reads nothing from the link now (connection.blocked)
    nack_is_free: bool  # a requeueing basic.nack spends no quorum delivery attempt (4.3+)
    match_header: str | None  # the header that tells alike publishes apart (ClientOptions)

    def write(self, data: bytes | list[bytes | memoryview]) -> None:
        """Queue bytes for the socket (a list: parts that leave as it takes them, unjoined)."""

    def resume_reading(self) -> None:
        """Read again if a channel's budget held the reading: one made room."""

    def forget(self, number: int) -> None:
        """Free a channel number once the channel is closed on both sides."""

    @property
    def takes_writes(self) -> bool:
        """Whether the socket takes more now (its write buffer under the mark), or is gone."""

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the write buffer drains under its mark (or the link ends)."""

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """Drop the connection now, with the reason every waiter will see."""


class ChannelLife:
    """One AMQP channel's life: its state, its requests, its close; see the module docstring."""

    def __init__(self, link: ChannelLink, number: int) -> None:
        self._link = link
        self.number = number
        self._loop = link.loop
        self._state = ChannelState.OPENING
        self._requests = _Requests(link)
        self._closing: asyncio.Future[None] | None = None
        self._ended = asyncio.Event()  # closed, or the broker cancelled our consumer
        self._gone = asyncio.Event()  # closing or closed: no longer open
        self._close_reason = "channel closed"
        self._flowing = asyncio.Event()  # cleared by the broker's channel.flow(active=false)
        self._flowing.set()

    @property
    def state(self) -> ChannelState:
        """Where the channel is in its life."""
        return self._state

    @property
    def is_open(self) -> bool:
        """Whether the channel can still ack and publish (not once we began to close it)."""
        return self._state is ChannelState.OPEN

    @property
    def is_flowing(self) -> bool:
        """Whether the broker lets the channel publish (no ``channel.flow`` pause)."""
        return self._flowing.is_set()

    async def wait_flowing(self) -> None:
        """Return once the broker lets the channel publish again, or the channel ended."""
        await self._flowing.wait()

    async def wait_closed(self) -> str:
        """Return why, once the channel closes or the broker cancels its consumer."""
        await self._ended.wait()
        return self._close_reason

    async def wait_gone(self) -> None:
        """Return once the channel begins to close (a broker's cancel alone does not)."""
        await self._gone.wait()

    def _move(self, to: ChannelState) -> None:
        if to in _MOVES[self._state]:
            self._state = to
            if to is not ChannelState.OPEN:
                self._gone.set()

    def _refusal(self) -> ChannelLostError:
        if self._state is ChannelState.OPENING:
            return ChannelLostError(f"channel {self.number} is not open yet")
        return ChannelLostError(self._close_reason)

    def _finish(self, reason: str) -> None:
        """End the channel's work while it stays open: ``wait_closed`` returns this reason."""
        if not self._ended.is_set():
            self._close_reason = reason
            self._ended.set()

    # --- requests ---

    async def open(self) -> None:
        """Send ``channel.open`` and wait for the broker's open-ok."""
        await self._request(codec.channel_open(), timeout_s=None)
        self._move(ChannelState.OPEN)

    async def rpc(
        self,
        request: codec.Request,
        *,
        timeout_s: float | None = None,
        sent: Callable[[], None] | None = None,
    ) -> codec.Reply:
        """Send a synchronous method and return the broker's reply.

        Only an open channel sends: once the broker has answered a close, a frame on its
        number would be a connection error. ``sent`` is called once the method is written
        (what is written after it reaches the broker after it).
        """
        if not self.is_open:
            raise self._refusal()
        return await self._request(request, timeout_s=timeout_s, sent=sent)

    async def _request(
        self,
        request: codec.Request,
        *,
        timeout_s: float | None,
        sent: Callable[[], None] | None = None,
    ) -> codec.Reply:
        await self._requests.wait_turn()
        if self._state not in (ChannelState.OPENING, ChannelState.OPEN):
            raise self._refusal()
        return await self._requests.send(request, self.number, timeout_s=timeout_s, sent=sent)

    async def close(self) -> None:
        """Close the channel; unacked deliveries go back to their queues.

        It waits for the broker's close-ok at most ``CLOSE_TIMEOUT_S``, and not at all
        while the broker blocks the connection (it reads nothing, the close included): the
        channel ends at once on our side, and its number stays taken until the close-ok.
        """
        self.begin_close()
        done = self._closing
        if done is None:  # closed already
            return
        # asyncio.timeout, not wait_for: CPython 3.11's wait_for swallows a cancellation
        # that arrives as the close-ok does, and a cancelled opener would then go on to
        # consume with a configuration a reload has replaced.
        with contextlib.suppress(TimeoutError, ChannelLostError):
            async with asyncio.timeout(0.0 if self._link.blocked else CLOSE_TIMEOUT_S):
                await asyncio.shield(done)
        self.lose(ChannelLostError("channel closed by the sidecar"))

    def begin_close(self) -> None:
        """Start closing now, without waiting: from here on nothing is published or acked.

        Sends ``channel.close`` (what was made before it leaves first); ``close`` waits for
        the end. The first close sends it; any other waits for the same end.
        """
        self._before_close()
        if self._state is ChannelState.CLOSED or self._closing is not None:
            return
        self._move(ChannelState.CLOSING)
        self._closing = self._loop.create_future()
        self._link.write(codec.channel_close(self.number))

    def _before_close(self) -> None:
        """Send what must leave before our close (a subclass's batched acks)."""

    # --- frames from the broker ---

    def on_control(self, frame: bytes) -> None:
        """Handle a method frame off the hot path: close, flow, the replies to our requests."""
        match codec.decode_control(frame):
            case codec.ChannelClose(reply_code=code, reply_text=text):
                self._link.write(codec.channel_close_ok(self.number))
                self.lose(ChannelClosedError(code, text))
                self._link.forget(self.number)
            case codec.ChannelCloseOk():
                if self._closing is not None and not self._closing.done():
                    self._closing.set_result(None)
                self._link.forget(self.number)
            case codec.ChannelFlow(active=active):
                # Kept before it is answered: nothing is published after our flow-ok.
                if active:
                    self._flowing.set()
                else:
                    self._flowing.clear()
                self._link.write(codec.channel_flow_ok(self.number, active=active))
            case codec.Reply() as reply:
                self._requests.answer(reply)

    def lose(self, error: ChannelLostError) -> None:
        """End the channel: every waiter learns why."""
        if self._state is ChannelState.CLOSED:
            return
        if not self._ended.is_set():
            self._close_reason = str(error)
        self._move(ChannelState.CLOSED)
        self._ended.set()
        self._flowing.set()  # a publish waiting for flow learns that the channel ended
        self._requests.fail(error)
        self._lost(error)
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)

    def _lost(self, error: ChannelLostError) -> None:
        """Let a subclass fail what waits on the broker (unconfirmed publishes)."""


class _Requests:
    """A channel's synchronous methods: one at a time, each answered by one of its replies."""

    def __init__(self, link: ChannelLink) -> None:
        self._link = link
        self._pending: asyncio.Future[codec.Reply] | None = None
        self._replies: frozenset[str] = frozenset()

    async def wait_turn(self) -> None:
        """Return once no other request of the channel waits for its reply."""
        while self._pending is not None:
            await asyncio.wait([self._pending])

    async def send(
        self,
        request: codec.Request,
        number: int,
        *,
        timeout_s: float | None,
        sent: Callable[[], None] | None = None,
    ) -> codec.Reply:
        """Send the request (it must be our turn) and return its reply; ``sent`` once written."""
        self._pending = pending = self._link.loop.create_future()
        self._replies = request.replies
        try:
            self._link.write(request.frame(number))
            if sent is not None:
                sent()
            async with asyncio.timeout(timeout_s):
                reply: codec.Reply = await pending
                return reply
        finally:
            self._pending = None

    def answer(self, reply: codec.Reply) -> None:
        """Settle the pending request with a reply of its kind; drop any other.

        A late reply to a request given up on (timed out) must not answer the next one.
        """
        pending = self._pending
        if pending is not None and not pending.done() and reply.name in self._replies:
            pending.set_result(reply)

    def fail(self, error: ChannelLostError) -> None:
        """Fail the pending request: the channel ended."""
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(error)
