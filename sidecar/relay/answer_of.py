"""What a publish's result means, read into the settle step's answer: the one reading.

A publish ends with the broker's settlement of it (``PublishOutcome``) or an exception,
whether it went from a frame handler (its confirm callback) or from a delivery's task.
Each is read here, and only here: a confirm, a return and a nack as themselves; the
channel closed by the broker as a refusal with its code; the channel lost otherwise as
``Lost``, ``gone`` when a stop or the connection took it (the delivery is let go) and not
when another publish's refusal did (it is held and tried again); a copy the codec cannot
write as ``Unwritable``; any other exception as ``Failed`` (a bug the step quarantines).
A missing exchange or queue is the route's, not the delivery's: it is raised again, for
the route to pause. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError, WireError
from sidecar.settle import PUBLISHED, Failed, Lost, Refused, Unwritable
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.settle import Answer

__all__ = ["answer_of"]


def answer_of(result: PublishOutcome | BaseException, *, gone: Callable[[], bool]) -> Answer:
    """Return the answer ``result`` means (see the module docstring); raise a missing entity.

    ``gone``: whether the publish channel went with a stop or its connection, not by the
    broker's hand (asked only for a lost channel). An exception that is not an
    ``Exception`` (a cancellation) is raised again.
    """
    if isinstance(result, PublishOutcome):
        return PUBLISHED[result]
    if isinstance(result, MissingEntityError):
        raise result
    if isinstance(result, ChannelClosedError):
        return Refused(result.code, result.text)
    if isinstance(result, ChannelLostError):
        return Lost(gone=gone(), error=str(result))
    if isinstance(result, (WireError, ValueError, TypeError)):
        return Unwritable(str(result))
    if isinstance(result, Exception):
        return Failed(result)
    raise result
