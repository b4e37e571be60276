"""The content reader on its own: a body announced by its header, received as it arrives."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from sidecar.amqp.content import BODY_SIZE_MAX, ContentReader
from sidecar.amqp.violations import FrameError
from sidecar.wire import BasicDeliver


def reader() -> ContentReader:
    content = ContentReader(1, passes=lambda _method, _size: False, resume=lambda: None)
    content.begin(BasicDeliver("c", 1, False, "", "staging"))
    return content


def header(body_size: int) -> bytes:
    """A content header payload with no properties: class, weight, body size, flags."""
    return struct.pack(">HHQH", 60, 0, body_size, 0)


@pytest.mark.parametrize("body_size", [BODY_SIZE_MAX + 1, 2**40, 2**63, 2**64 - 1])
def test_a_body_larger_than_any_broker_sends_is_a_frame_error_naming_the_limit(
    body_size: int,
) -> None:
    with pytest.raises(FrameError, match=f"{body_size} bytes, over the {BODY_SIZE_MAX}") as raised:
        reader().on_header(header(body_size))
    assert raised.value.reply_code == 501


def test_the_largest_body_a_broker_sends_is_taken() -> None:
    content = reader()
    assert content.on_header(header(BODY_SIZE_MAX)) is None  # waits for its body frames


def test_a_body_takes_memory_as_its_bytes_arrive_not_at_its_header() -> None:
    """A header announcing 64 MiB holds nothing until body frames come; then the bytes."""
    content = reader()
    announced = 64 * 2**20
    tracemalloc.start()
    try:
        content.on_header(header(announced))
        at_header, _ = tracemalloc.get_traced_memory()
        content.on_body(memoryview(b"x" * 1000))
        after_a_frame, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert at_header < 2**20, f"{at_header} bytes held before any body frame"
    assert after_a_frame < 2**20, f"{after_a_frame} bytes held after a frame of 1,000"


def test_a_body_in_frames_is_whole_and_in_order() -> None:
    content = reader()
    parts = [b"abc", b"", b"defgh", b"i" * 5000, b"j"]
    size = sum(map(len, parts))
    assert content.on_header(header(size)) is None
    done = [content.on_body(memoryview(part)) for part in parts]
    assert done[:-1] == [None] * (len(parts) - 1)
    whole = done[-1]
    assert whole is not None
    assert isinstance(whole.body, bytearray)
    assert whole.body == b"".join(parts)
