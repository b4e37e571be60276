"""What a settle step saw on the way, for the settler's one sink: ``Event``.

The sink (``relay.sink``) hands each to metrics, the route log or the route's state. Pure
values: no I/O.
"""

from __future__ import annotations

import builtins  # noqa: TC003 - a compiled dataclass loads its annotations at run time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from sidecar.contract import Verdict

__all__ = [
    "Bug",
    "Event",
    "Held",
    "Left",
    "Quarantined",
    "RetriedCopy",
    "ReturnRetried",
    "RoutedOnRetry",
    "Violations",
]


@dataclass(frozen=True, slots=True)
class Violations:
    """The contract found violations in the delivery: counted and logged."""

    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Held:
    """The delivery is held for ``reason``: the route pauses and says it."""

    reason: str


@dataclass(frozen=True, slots=True)
class RetriedCopy:
    """A copy goes out again that the broker may already have routed somewhere."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """The delivery's quarantine copy was confirmed, for ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Bug:
    """An unexpected exception ``while_`` doing something: logged with its traceback."""

    while_: str
    error: builtins.Exception  # named by module: mypyc looks a bare builtin up in globals


@dataclass(frozen=True, slots=True)
class Left:
    """The delivery was left to the broker (``reason``: the error that took its channel)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReturnRetried:
    """A copy the broker returned is published again after a wait (``settle.returns``)."""


@dataclass(frozen=True, slots=True)
class RoutedOnRetry:
    """A copy the broker had returned was taken when published again."""


Event: TypeAlias = (
    Violations | Held | RetriedCopy | Quarantined | Bug | Left | ReturnRetried | RoutedOnRetry
)
