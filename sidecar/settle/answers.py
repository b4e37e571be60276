"""The answers a publish gets from the broker, as the settle step reads them.

``answer_of`` reads each publish's outcome or exception into one of these, whichever path
published it (a frame handler's confirm callback or the delivery's task);
``sidecar.settle.table.after`` reads the answer. Pure: no I/O.
"""

from __future__ import annotations

import builtins  # noqa: TC003 - a compiled dataclass loads its annotations at run time
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError, WireError
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "PUBLISHED",
    "Answer",
    "Blocked",
    "Confirmed",
    "Failed",
    "Lost",
    "Nacked",
    "Refused",
    "Returned",
    "Unwritable",
    "answer_of",
    "not_now",
    "waits_unblock",
]


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The broker confirmed the publish."""

    @property
    def published(self) -> PublishOutcome:
        """The answer as the wire reads it."""
        return PublishOutcome.CONFIRMED


@dataclass(frozen=True, slots=True)
class Returned:
    """The broker returned the publish: nothing it is bound to takes its routing key."""

    @property
    def published(self) -> PublishOutcome:
        """The answer as the wire reads it."""
        return PublishOutcome.RETURNED


@dataclass(frozen=True, slots=True)
class Nacked:
    """The broker nacked the publish (a target queue full with reject-publish, ...)."""

    @property
    def published(self) -> PublishOutcome:
        """The answer as the wire reads it."""
        return PublishOutcome.NACKED


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker closed the publish channel with ``code`` and ``text``."""

    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Lost:
    """The publish channel was lost; ``gone``: by a stop or with its connection."""

    gone: bool
    error: str = ""


@dataclass(frozen=True, slots=True)
class Unwritable:
    """The copy cannot be written as AMQP (``error`` says why)."""

    error: str


@dataclass(frozen=True, slots=True)
class Failed:
    """An unexpected exception while publishing: a bug, kept whole for the log."""

    error: builtins.Exception  # named by module: mypyc looks a bare builtin up in globals


@dataclass(frozen=True, slots=True)
class Blocked:
    """The broker blocks the connection (``connection.blocked``): nothing was published."""

    reason: str


Answer: TypeAlias = Confirmed | Returned | Nacked | Refused | Lost | Unwritable | Failed | Blocked
PUBLISHED: Final[Mapping[PublishOutcome, Confirmed | Returned | Nacked]] = MappingProxyType(
    {
        PublishOutcome.CONFIRMED: Confirmed(),
        PublishOutcome.RETURNED: Returned(),
        PublishOutcome.NACKED: Nacked(),
    }
)


def answer_of(result: PublishOutcome | BaseException, *, gone: Callable[[], bool]) -> Answer:
    """Return the answer a publish's outcome or exception means; raise a missing entity.

    A confirm, a return and a nack are themselves; the channel closed by the broker is a
    refusal with its code; the channel lost otherwise is ``Lost``, ``gone`` (asked only
    then) when a stop or the connection took it, and not when another publish's refusal
    did; a copy the codec cannot write is ``Unwritable``; any other exception ``Failed``
    (a bug). A missing exchange or queue is the route's, not the delivery's: it is raised
    again, for the route to pause; so is what is not an ``Exception`` (a cancellation).
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


def not_now(*, channel_open: bool, blocked: str | None) -> Lost | Blocked | None:
    """Return the answer for a publish that must not be written now; None: it may go.

    Not for a delivery whose channel is closing (its ack would be refused and the broker
    redelivers it: the copy would be a certain duplicate), nor while the broker blocks
    (``blocked``, its reason: a copy written then could reach the broker after a stop gave
    its delivery back).
    """
    if not channel_open:
        return Lost(gone=True, error="the channel it came on is closing")
    return None if blocked is None else Blocked(blocked)


def waits_unblock(answer: Answer) -> bool:
    """Whether the publish is still to be made once the broker unblocks: nothing was sent.

    Its body waits for it (not dropped), it keeps its place (no later copy overtakes it),
    and its place in the unblock line.
    """
    return isinstance(answer, Blocked)
