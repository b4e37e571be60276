"""The content header decoder and the content reader fed arbitrary bytes.

The input is one message's content: its first byte chooses the body frames' size and
whether a ``basic.deliver`` or a ``basic.return`` came before it, the next two bytes the
content header payload's length, then that payload, then the body. ``check`` reads the
header with ``parse_content_header`` (only :class:`WireError`; what it reads is written
again by ``content_header`` and read back the same, unless its header table is kept
undecodable) and
hands header and body frames to a :class:`ContentReader` as a channel would: only
:class:`WireError`; a body held whole is the bytes sent, at the size announced, which is
never over ``BODY_SIZE_MAX``.
"""

from __future__ import annotations

from sidecar.amqp.content import BODY_SIZE_MAX, ContentReader
from sidecar.errors import WireError
from sidecar.wire import (
    BasicDeliver,
    BasicReturn,
    ContentHeader,
    UndecodableTable,
    content_header,
    encode_table,
    parse_content_header,
)

__all__ = ["check"]

_NO_LIMIT = 2**32  # frame_max for writing the header again: any size the input makes


def _table(header: ContentHeader) -> bytes | None:
    """Return the header table's bytes; None for none (an empty one is written as none)."""
    raw = header.headers
    return encode_table(raw) if raw and not isinstance(raw, UndecodableTable) else None


def _round_trip(payload: bytes) -> None:
    """Read the header; what it read must be written and read again the same."""
    try:
        header = parse_content_header(payload)
    except WireError:
        return
    if isinstance(header.headers, UndecodableTable):
        # Its bytes are the input's, written again as they came; a clipped one (its length
        # past the payload's end) is an open defect of parse_content_header (tests/unit/fuzz).
        return
    again = content_header(
        header.properties, header.headers, body_size=header.body_size, frame_max=_NO_LIMIT
    )
    read_again = parse_content_header(again)
    if (read_again.body_size, read_again.properties, _table(read_again)) != (
        header.body_size,
        header.properties,
        _table(header),
    ):
        raise AssertionError(f"{header!r} written and read again: {read_again!r}")


def _receive(payload: bytes, body: bytes, *, step: int, returned: bool) -> None:
    """Hand the header and the body in frames of ``step`` bytes to a content reader."""
    reader = ContentReader(1, passes=lambda _method, _size: False, resume=lambda: None)
    method = (
        BasicReturn(312, "NO_ROUTE", "x", "k") if returned else BasicDeliver("c", 1, False, "", "q")
    )
    reader.begin(method)
    try:
        content = reader.on_header(payload)
        sent = 0
        for at in range(0, len(body), step):
            if content is not None:
                break  # whole: what follows would be another message's frames
            frame = body[at : at + step]
            sent += len(frame)
            content = reader.on_body(memoryview(frame))
    except WireError:
        return
    if content is None:
        return  # waiting for more of its body
    size = content.header.body_size
    if size > BODY_SIZE_MAX or len(content.body) != size or content.body != body[:sent]:
        raise AssertionError(f"announced {size}, took {sent} bytes, made {len(content.body)}")


def check(data: bytes) -> None:
    """Raise if the header or the reader break their promises (see the module docstring)."""
    if len(data) < 3:
        return
    step, returned = data[0] // 2 + 1, bool(data[0] & 1)
    length = int.from_bytes(data[1:3], "big")
    payload, body = data[3 : 3 + length], data[3 + length :]
    _round_trip(payload)
    _receive(payload, body, step=step, returned=returned)
