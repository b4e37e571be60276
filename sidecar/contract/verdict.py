"""What normalise decides (docs/contract.md sections 1, 4 and 6): its inputs and its verdict.

This module owns the policy a route hands to normalise, the closed set of violation kinds
(their values are metric labels) and the two verdicts, Relay and Reject. It holds values
only: no rule of the contract is applied here.
"""

from __future__ import annotations

# Mapping, FieldValue and PropertyValue are read at run time too: the compiled build
# (scripts/compile) builds the dataclasses below from their annotations.
from collections.abc import Mapping  # noqa: TC003
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, TypeAlias

from sidecar.wire import FieldValue, PropertyValue  # noqa: TC001

__all__ = ["Kind", "Policy", "Publishers", "Reject", "Relay", "Verdict", "Violation"]


class Publishers(StrEnum):
    """Who feeds a staging queue (docs/contract.md section 4)."""

    ACEMQ = "acemq"
    APPS = "apps"


class Kind(StrEnum):
    """The closed set of violation kinds (docs/contract.md section 6); values are metric labels."""

    DEFAULTED = "defaulted"
    NULL_VALUE = "null_value"
    EMPTY_VALUE = "empty_value"
    COERCED = "coerced"
    UNREADABLE = "unreadable"
    OUT_OF_RANGE = "out_of_range"
    LEGACY_NAME = "legacy_name"
    UNKNOWN_RESERVED = "unknown_reserved"
    APP_RESERVED = "app_reserved"
    MIRROR = "mirror"
    MOVED = "moved"
    UNPORTABLE = "unportable"


class Violation(NamedTuple):
    """One rule that fired: its kind and the header (or property) label it fired on."""

    kind: Kind
    header: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What normalise needs to know about the route and the sidecar."""

    publishers: Publishers = Publishers.ACEMQ
    origin: str | None = None
    # The name the broker knows the sidecar by, which every user_id must equal; None when
    # it is not known (EXTERNAL: the client certificate's), so no user_id may stay.
    login: str | None = "guest"


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Relay:
    """Publish the message with these properties and headers; the body is unchanged.

    Made once per message: ``__init__`` written out (docs/decisions/0063).
    """

    properties: Mapping[str, PropertyValue]
    headers: Mapping[str, FieldValue]
    violations: tuple[Violation, ...]
    # The unknown x-acemq- names stripped: for the log, never for a metric label (section 6).
    stripped: tuple[str, ...]

    def __init__(
        self,
        *,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue],
        violations: tuple[Violation, ...],
        stripped: tuple[str, ...] = (),
    ) -> None:
        """Set every field: frozen, so by ``object.__setattr__`` (compiled: a direct store)."""
        object.__setattr__(self, "properties", properties)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "violations", violations)
        object.__setattr__(self, "stripped", stripped)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """Do not publish; quarantine the original with this reason."""

    reason: str
    violations: tuple[Violation, ...]


Verdict: TypeAlias = Relay | Reject
