"""The frame reader fed arbitrary byte streams, cut into reads anywhere.

``check`` feeds the bytes to a :class:`FrameReader` twice: whole, and in reads whose sizes
the input's first bytes choose. Either way it may raise only :class:`WireError` (the link
closes the connection with its reply code: 501, 505); and the frames handed to their
owners, and the error if any, are the same however the reads cut the stream. The owners
are recorders: channel 1 takes ``basic.deliver`` as its hot method, any channel number
but 1 and 0 belongs to nobody.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.amqp.frame_reader import FrameReader
from sidecar.errors import WireError
from sidecar.wire import BASIC_DELIVER

if TYPE_CHECKING:
    from sidecar.errors import ChannelLostError
    from sidecar.wire import UnreadHeader

__all__ = ["check"]

FRAME_MAX = 4096  # small, so that inputs reach the oversized paths
HEADER_FRAME_MAX = 8192  # a content header between the two is passed over


class _End:
    """A channel (or channel 0) that notes what it is handed, in order."""

    def __init__(self, calls: list[tuple[str, int, object]], number: int) -> None:
        self._calls, self._number = calls, number

    def on_method(self, method_id: int, payload: bytes) -> bool:
        if method_id == BASIC_DELIVER:
            self._calls.append(("method", self._number, bytes(payload)))
            return True
        return False

    def on_control(self, frame: bytes) -> None:
        self._calls.append(("control", self._number, bytes(frame)))

    def on_header(self, payload: bytes) -> None:
        self._calls.append(("header", self._number, bytes(payload)))

    def on_body(self, payload: memoryview) -> bool:
        self._calls.append(("body", self._number, bytes(payload)))
        return True

    def has_room(self) -> bool:
        return True

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> None:
        self._calls.append(("unread", self._number, (unread, body_size)))

    def lose(self, error: ChannelLostError | BaseException) -> None:
        self._calls.append(("lose", self._number, repr(error)))

    def close_frame(self, reply_code: int, reply_text: str) -> bytes:
        return f"{reply_code} {reply_text}".encode()


@dataclass
class _Owners:
    frame_max: int = FRAME_MAX
    channels: dict[int, _End] = field(default_factory=dict)
    control: _End | None = None


def _read(data: bytes, cuts: list[int]) -> tuple[list[tuple[str, int, object]], str | None]:
    """Feed ``data`` in reads of the sizes ``cuts`` gives (cycled); return the calls and error."""
    calls: list[tuple[str, int, object]] = []
    owners = _Owners(channels={1: _End(calls, 1)}, control=_End(calls, 0))
    reader = FrameReader(owners, header_frame_max=HEADER_FRAME_MAX)  # type: ignore[arg-type]
    at, turn = 0, 0
    try:
        while at < len(data):
            size = cuts[turn % len(cuts)] if cuts else len(data)
            reader.feed(data[at : at + size])
            at, turn = at + size, turn + 1
    except WireError as e:
        return calls, f"{type(e).__name__}: {e}"
    return calls, None


def check(data: bytes) -> None:
    """Raise unless every way of cutting ``data`` reads the same frames and only WireError."""
    # The first byte says how many of the next bytes are read sizes (1 to 256 each).
    count = data[0] % 8 if data else 0
    cuts = [size + 1 for size in data[1 : 1 + count]]
    stream = data[1 + count :]
    whole = _read(stream, [])
    cut = _read(stream, cuts)
    if cut != whole:
        raise AssertionError(f"read whole: {whole!r}\nread in {cuts}: {cut!r}")
