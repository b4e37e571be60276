"""One message being normalised: the contract values read so far and what they yield.

This module owns the state the steps of normalise share (the contract headers, the
properties, the violations found, the headers written) and the reads they make through
it: a header as text or as an integer, its default, its AMQP property under ``apps``
(section 4). It must not write a header on its own: each step decides what it writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from sidecar.contract.readers import as_utf8, read_int, read_text
from sidecar.contract.verdict import Kind, Violation
from sidecar.wire import FieldValue, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.wire import PropertyValue

__all__ = ["Envelope", "property_text"]


def property_text(properties: Mapping[str, PropertyValue], name: str) -> str | None:
    """Return a text property as a header may hold it; None when absent, empty or not text."""
    value = properties.get(name)
    if not isinstance(value, str) or not value:
        return None
    return value if value.isascii() else as_utf8(value)


_T = TypeVar("_T", str, int)

# The width classes an integer header arrives in; bool and Timestamp are not among them.
_INTEGER_TYPES = frozenset({Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64, int})


class Envelope:
    """One message being normalised: the contract values read so far and what they yield.

    Each read counts what it finds in ``found``; a header that could not be read is
    remembered in ``unread`` so that its default is not counted a second time.
    """

    __slots__ = ("apps", "contract", "found", "headers", "new_id", "properties", "unread")

    def __init__(
        self,
        contract: dict[str, FieldValue],
        properties: Mapping[str, PropertyValue],
        found: list[Violation],
        *,
        apps: bool,
        new_id: Callable[[], str],
    ) -> None:
        self.contract = contract
        self.properties = properties
        self.found = found
        self.apps = apps
        self.new_id = new_id
        self.headers: dict[str, FieldValue] = {}
        self.unread: set[str] = set()

    def text(self, name: str) -> str | None:
        """Read a text header; None when absent or unreadable."""
        value = self.contract.get(name)
        if value is None or type(value) is str:  # the common case, first
            return value
        text = read_text(value, name, self.found)
        if text is None:
            self.unread.add(name)
        return text

    def integer(self, name: str, *, low: int, high: int, is_first_seen: bool = False) -> int | None:
        """Read an integer header; None when absent or unreadable."""
        value = self.contract.get(name)
        if value is None:
            return None
        if type(value) in _INTEGER_TYPES and low <= value <= high:  # type: ignore[operator]
            return value  # type: ignore[return-value]
        number = read_int(value, name, self.found, low=low, high=high, is_first_seen=is_first_seen)
        if number is None:
            self.unread.add(name)
        return number

    def default(self, name: str, value: _T) -> _T:
        """Return a default, counted unless the header was unreadable (counted already)."""
        if name not in self.unread:
            self.found.append(Violation(Kind.DEFAULTED, name))
        return value

    def from_property(self, name: str, prop: str) -> str | None:
        """Under apps, fill an absent or unreadable header from its AMQP property."""
        if not self.apps:
            return None
        value = property_text(self.properties, prop)
        return None if value is None else self.default(name, value)

    def at_least(self, name: str, value: int, low: int) -> int:
        """Raise a value below the field's floor to the floor (out_of_range)."""
        if value < low:
            self.found.append(Violation(Kind.OUT_OF_RANGE, name))
            return low
        return value

    def put_text(self, name: str) -> None:
        """Write an optional text header when it holds text."""
        value = self.text(name)
        if value is not None:
            self.headers[name] = value
