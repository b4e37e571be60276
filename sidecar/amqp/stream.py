"""A body passed through in frames: from the channel it arrives on to a publish, never held.

A delivery whose content header announces more than its consumer's ``max_body_bytes`` is
handed over before its body arrives, with a ``BodyStream`` in place of the body. The body
frames wait on the consuming connection (the frame reader holds at the first one) until a
publish takes the stream (``Channel.publish_through``) and writes each frame on as it is
read; while the publishing side takes no more (its write buffer over the mark), reading
waits again. A stream nothing publishes is discarded: its frames are read and dropped, and
the delivery, unacked, is the broker's to redeliver.

A stream ends whole, or cut off when its channel ends before the last byte (what more of
it comes is dropped): a publish that began it must then give up its whole connection,
since AMQP has no way to abandon a message's content half-way on a channel. No I/O: the
channel feeds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sidecar.errors import BrokerConnectionError
from sidecar.wire import body_frames

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BodyStream", "PassLink", "PassOn"]


def _drop(_payload: memoryview) -> bool:
    return True


def _ignore(_whole: bool) -> None:  # noqa: FBT001 - the callback's one argument
    pass


class BodyStream:
    """One delivery's body on its way through; see the module docstring."""

    __slots__ = ("_full", "_on_end", "_resume", "_sink", "ended", "size")

    def __init__(self, size: int, *, resume: Callable[[], None]) -> None:
        self.size = size  # as its content header announced
        self._resume = resume  # the consuming link reads on (the frames kept are fed again)
        self._sink: Callable[[memoryview], bool] | None = None
        self._on_end: Callable[[bool], None] = _ignore
        self._full = False  # the sink took a frame and takes no more until ``resume``
        self.ended: bool | None = None  # True: whole; False: cut off; None: on its way

    @property
    def taken(self) -> bool:
        """Whether a publish took the stream, or it was discarded."""
        return self._sink is not None

    def take(
        self,
        sink: Callable[[memoryview], bool],
        *,
        on_end: Callable[[bool], None],
        full: bool = False,
    ) -> None:
        """Hand every body frame to ``sink`` from now on; ``on_end`` hears how it ended.

        ``sink`` gets a view valid during the call and returns False when it takes no more
        for now; the frames then wait until ``resume``. ``full``: the sink takes nothing
        yet, the first frame waits for ``resume`` too. ``on_end(whole)`` is called once,
        at once if the stream ended before it was taken.
        """
        if self._sink is not None:
            raise RuntimeError("a body stream is taken once")
        self._sink, self._on_end, self._full = sink, on_end, full
        if self.ended is not None:
            on_end(self.ended)
        elif not full:
            self._resume()

    def discard(self) -> None:
        """Drop the body's frames as they arrive, unless a publish took the stream."""
        if self._sink is None:
            self.take(_drop, on_end=_ignore)

    def resume(self) -> None:
        """Read on: the sink takes frames again."""
        if self._full:
            self._full = False
            self._resume()

    def feed(self, payload: memoryview) -> bool:
        """Hand one body frame to the sink; False when it is not taken (it waits)."""
        sink = self._sink
        if sink is None or self._full:
            return False
        self._full = not sink(payload)
        return True

    def cut(self) -> None:
        """End the stream cut off; whatever more of it comes is read and dropped."""
        self.end(whole=False)
        self._sink, self._on_end, self._full = _drop, _ignore, False
        self._resume()

    def end(self, *, whole: bool) -> None:
        """End the stream: its last byte was fed (``whole``), or its channel ended first."""
        if self.ended is None:
            self.ended = whole
            if self._sink is not None:
                self._on_end(whole)


class PassLink(Protocol):
    """What the publishing end needs of its connection's link."""

    frame_max: int

    def write(self, data: bytes | list[bytes | memoryview]) -> None:
        """Queue bytes for the socket."""

    @property
    def takes_writes(self) -> bool:
        """Whether the socket takes more now (its write buffer under the mark), or is gone."""

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the write buffer drains under its mark (or the link ends)."""

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """Drop the connection now, with the reason every waiter will see."""


class PassOn:
    """The publishing end: one channel's body passing through, written on frame by frame.

    The method and content header are written first (by the channel); each body frame
    then goes out as it is read, re-cut to this connection's frame size, while the socket
    takes it. ``give_up`` (the channel must close with the message half-way) and a stream
    cut off drop the connection: the broker discards the message begun.
    """

    __slots__ = ("_is_open", "_link", "_number", "stream")

    def __init__(self, link: PassLink, number: int, *, is_open: Callable[[], bool]) -> None:
        self._link = link
        self._number = number
        self._is_open = is_open  # once the broker closed the channel, the frames are moot
        self.stream: BodyStream | None = None  # the body on its way now

    def start(self, stream: BodyStream) -> None:
        """Take ``stream``: its frames go out from now on (its publish is written).

        A socket that takes no more now gets the first frame once it drains, as any other.
        """
        self.stream = stream
        link = self._link
        full = not link.takes_writes
        stream.take(self._frame, on_end=self._ended, full=full)
        if full:
            link.when_drained(stream.resume)

    def give_up(self) -> None:
        """Drop the connection: the channel must close before the body's last frame."""
        self.stream = None
        self._link.abort(
            BrokerConnectionError(
                "a body being passed through was cut off: its publish cannot be finished"
            )
        )

    def _frame(self, payload: memoryview) -> bool:
        link = self._link
        if self._is_open():
            link.write(body_frames(self._number, payload, frame_max=link.frame_max))
        if link.takes_writes:
            return True
        if self.stream is not None:
            link.when_drained(self.stream.resume)
        return False

    def _ended(self, whole: bool) -> None:  # noqa: FBT001 - the stream's callback
        if self.stream is None:
            return  # given up already
        if whole:
            self.stream = None
        else:
            self.give_up()
