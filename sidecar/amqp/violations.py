"""The broker's protocol violations, each with the reply code our ``connection.close`` sends.

AMQP 0-9-1 asks the peer that finds a frame it cannot read to close the connection with a
reply code saying why (501 frame-error, 505 unexpected-frame, 541 internal-error for our
own faults), not to drop the socket: the broker then logs our reason instead of an
"unexpectedly closed TCP connection". Pure values, no I/O.
"""

from __future__ import annotations

from typing import Final

from sidecar.errors import WireError

__all__ = [
    "FRAME_ERROR",
    "INTERNAL_ERROR",
    "UNEXPECTED_FRAME",
    "FrameError",
    "UnexpectedFrameError",
]

FRAME_ERROR: Final = 501
UNEXPECTED_FRAME: Final = 505
INTERNAL_ERROR: Final = 541


class FrameError(WireError):
    """A frame the client cannot read: a bad size, a missing frame-end, an unknown type."""

    reply_code: int = FRAME_ERROR


class UnexpectedFrameError(FrameError):
    """A frame out of order: a content header or body with no delivery or return before it."""

    reply_code: int = UNEXPECTED_FRAME
