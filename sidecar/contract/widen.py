"""Application headers made portable (docs/contract.md section 7): unsigned tags widened.

This module owns the widening of ``B``, ``u`` and ``i`` to ``I``, ``I`` and ``l`` at any
depth of an application header, counted once per header as ``unportable``. It copies a
container only when something in it changes, and must never raise, whatever the value
holds (a container deeper than the codec admits is left as it is).
"""

from __future__ import annotations

from sidecar.contract.names import APP_LABEL
from sidecar.contract.verdict import Kind, Violation
from sidecar.wire import MAX_DEPTH, FieldValue, Int32, Int64, UInt8, UInt16, UInt32

__all__ = ["widen_application"]


def widen_application(value: FieldValue, found: list[Violation]) -> FieldValue:
    """Return an application header with section 7's unsigned tags widened, counting it once."""
    widened = _widen(value, 0)
    if isinstance(widened, _Unchanged):
        return value
    found.append(Violation(Kind.UNPORTABLE, APP_LABEL))
    return widened


class _Unchanged:
    """The marker _widen returns for a value that holds no unsigned integer tag."""


_UNCHANGED = _Unchanged()


def _widen(value: FieldValue, depth: int) -> FieldValue | _Unchanged:
    """Widen B, u, i to I, I, l at any depth (section 7); _UNCHANGED when nothing was.

    A container deeper than the codec admits is left as it is: it cannot be encoded anyway,
    and the encoder says why, so normalise still never raises on a table that holds itself.
    """
    match value:
        case UInt8():
            return Int32(value)
        case UInt16():
            return Int32(value)
        case UInt32():
            return Int64(value)
        case dict() if depth < MAX_DEPTH:
            return _widen_table(value, depth)
        case list() if depth < MAX_DEPTH:
            return _widen_array(value, depth)
        case _:
            return _UNCHANGED


def _widen_table(value: dict[str, FieldValue], depth: int) -> FieldValue | _Unchanged:
    table: dict[str, FieldValue] | None = None  # copied at the first change only
    for key, item in value.items():
        new = _widen(item, depth + 1)
        if not isinstance(new, _Unchanged):
            if table is None:
                table = dict(value)
            table[key] = new
    return _UNCHANGED if table is None else table


def _widen_array(value: list[FieldValue], depth: int) -> FieldValue | _Unchanged:
    items: list[FieldValue] | None = None  # copied at the first change only
    for index, item in enumerate(value):
        new = _widen(item, depth + 1)
        if not isinstance(new, _Unchanged):
            if items is None:
                items = list(value)
            items[index] = new
    return _UNCHANGED if items is None else items
