"""The field-table decoder fed arbitrary bytes.

``check`` decodes the input as a field table (a ``bytes`` and a ``memoryview`` of it, at
the offset its first byte chooses): it may raise only :class:`WireError`, both forms must
agree (on the table, or on refusing it), and a table it returns must end within the data
and be a fixed point of the codec: encoded and decoded again it encodes to the same bytes
(the decoder's two documented repairs, the zero-byte void tag and a boolean octet other
than 0 or 1, are made on the first decode, so the second changes nothing).
"""

from __future__ import annotations

from sidecar.errors import WireError
from sidecar.wire import decode_table, encode_table

__all__ = ["check"]


def _decode(data: bytes | memoryview, offset: int) -> tuple[bytes, int] | None:
    """Return the table's encoding and end offset; None for a WireError (words may differ)."""
    try:
        table, end = decode_table(data, offset)
    except WireError:
        return None
    return encode_table(table), end


def check(data: bytes) -> None:
    """Raise if decoding ``data`` breaks the decoder's promises (see the module docstring)."""
    offset = data[0] % 4 if data else 0
    data = data[1:]
    as_bytes = _decode(data, offset)
    as_view = _decode(memoryview(data), offset)
    if as_bytes != as_view:
        raise AssertionError(f"bytes: {as_bytes!r}\nmemoryview: {as_view!r}")
    if as_bytes is None:
        return
    encoded, end = as_bytes
    if not offset + 4 <= end <= len(data):
        raise AssertionError(f"a table at {offset} ends at {end}, outside {len(data)} bytes")
    again, again_end = decode_table(encoded)
    if again_end != len(encoded):
        raise AssertionError(f"re-decoded table ends at {again_end} of {len(encoded)} bytes")
    if encode_table(again) != encoded:
        raise AssertionError(f"not a fixed point: {encoded!r} -> {encode_table(again)!r}")
