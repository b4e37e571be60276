"""The answers a publish gets from the broker, as the settle step reads them.

The settler turns each publish's outcome or exception into one of these
(``sidecar.relay.settler.publish_answer``); ``sidecar.settle.step.after`` reads it. Pure
data: no I/O.
"""

from __future__ import annotations

import builtins  # noqa: TC003 - a compiled dataclass loads its annotations at run time
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from collections.abc import Mapping

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
