"""The frame reader on its own: bytes in, frames to their owners, no link and no socket."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from sidecar.amqp import frame_reader
from sidecar.amqp.frame_reader import (
    HEADER_FRAME_MAX,
    ChannelEnd,
    ControlEnd,
    FrameReader,
    NotAmqpError,
)
from sidecar.amqp.violations import FrameError
from sidecar.wire import FRAME_HEADER, HEADER, UnreadHeader
from tests.compiled import is_compiled
from tests.unit.amqp.test_amqp_link import RecordingEnd, delivery_frames


@dataclass
class Owners:
    """Who the frames go to: what a link is to its reader, and nothing more."""

    frame_max: int = 131_072
    channels: dict[int, ChannelEnd] = field(default_factory=dict)
    control: ControlEnd | None = None


def reading(header_frame_max: int = HEADER_FRAME_MAX) -> tuple[FrameReader, Owners, RecordingEnd]:
    channel = RecordingEnd()
    owners = Owners(channels={1: channel}, control=RecordingEnd(hot=False))
    return FrameReader(owners, header_frame_max=header_frame_max), owners, channel


def test_nothing_is_handed_on_before_the_last_byte_of_a_frame() -> None:
    reader, _, channel = reading()
    frames = delivery_frames(b"the body")
    data = b"".join(frames)
    for at in range(len(data) - 1):
        reader.feed(data[at : at + 1])
    assert [kind for kind, _ in channel.calls] == ["method", "header"]  # the body is not whole
    reader.feed(data[-1:])
    assert channel.calls[-1] == ("body", b"the body")


def test_the_frame_size_is_the_owners_as_it_is_now() -> None:
    """The link's frame size changes with the broker's tune: the reader reads it each time."""
    reader, owners, channel = reading()
    big = b"\x01\x00\x01" + (200_000).to_bytes(4, "big") + b"\x00"
    owners.frame_max = 262_144
    reader.feed(big)  # under the size: the start of a frame, kept until the rest comes
    owners.frame_max = 131_072
    with pytest.raises(FrameError, match="over the frame size of 131072"):
        reader.feed(b"\x00")
    assert channel.calls == []


def test_a_connection_method_before_the_handshake_is_a_frame_error() -> None:
    reader, owners, _ = reading()
    owners.control = None
    with pytest.raises(FrameError, match="before the handshake"):
        reader.feed(pamqp_frame.marshal(spec.Connection.Blocked("memory"), 0))


def test_the_servers_own_protocol_header_is_not_amqp() -> None:
    reader, _, _ = reading()
    with pytest.raises(NotAmqpError, match="refused AMQP 0-9-1"):
        reader.feed(b"AMQP\x00\x00\x09\x00")


def header_frame(payload_size: int, *, body_size: int, end: bytes = b"\xce") -> bytes:
    """A content header frame of any size: class, weight, body size, then filler."""
    fixed = struct.pack(">HHQ", 60, 0, body_size)
    payload = fixed + b"\x00" * (payload_size - len(fixed))
    return HEADER.pack(FRAME_HEADER, 1, payload_size) + payload + end


def deliver_frame(tag: int) -> bytes:
    return pamqp_frame.marshal(spec.Basic.Deliver("c", tag, False, "", "staging"), 1)


@pytest.mark.parametrize("step", [1, 5, 19, 20, 333])
def test_a_header_over_the_limit_is_passed_over_wherever_the_reads_cut_it(
    step: int,
) -> None:
    """Its size and body size go to the channel; its body and the next delivery follow."""
    reader, owners, channel = reading(header_frame_max=1_000)
    owners.frame_max = 500
    body = b"\x03\x00\x01\x00\x00\x00\x04body\xce"
    data = b"".join(
        [deliver_frame(1), header_frame(1_500, body_size=4), body, *delivery_frames(b"next")]
    )
    for at in range(0, len(data), step):
        reader.feed(data[at : at + step])
    kinds = [kind for kind, _ in channel.calls]
    assert kinds == ["method", "unread", "body", "method", "header", "body"]
    assert channel.calls[1][1] == (UnreadHeader(size=1_500, limit=1_000), 4)
    assert channel.calls[2][1] == b"body"
    assert channel.calls[-1][1] == b"next"


def test_a_20_mib_header_is_dropped_as_it_arrives_never_held_whole() -> None:
    """Read in 64 KiB reads, as a socket hands them: the reader keeps none of them."""
    reader, _, channel = reading()
    data = deliver_frame(1) + header_frame(20 * 1024 * 1024, body_size=0) + deliver_frame(2)
    view = memoryview(data)
    held = 0
    for at in range(0, len(data), 65_536):
        reader.feed(bytes(view[at : at + 65_536]))
        held = max(held, len(reader._buffer))  # what it holds is the point
    assert held < 64
    unread = UnreadHeader(size=20 * 1024 * 1024, limit=HEADER_FRAME_MAX)
    assert [call for call in channel.calls if call[0] == "unread"] == [("unread", (unread, 0))]
    assert [kind for kind, _ in channel.calls] == ["method", "unread", "method"]


def test_a_passed_over_header_without_its_frame_end_is_a_frame_error() -> None:
    reader, owners, channel = reading(header_frame_max=1_000)
    owners.frame_max = 500
    with pytest.raises(FrameError, match="lacks its frame-end octet"):
        reader.feed(deliver_frame(1) + header_frame(1_500, body_size=4, end=b"\x00"))
    assert [kind for kind, _ in channel.calls] == ["method"]


def test_any_other_frame_over_the_frame_size_is_still_a_frame_error() -> None:
    reader, _, _ = reading()
    body = HEADER.pack(3, 1, HEADER_FRAME_MAX + 1) + b"\x00" * 20
    with pytest.raises(FrameError, match="over the frame size"):
        reader.feed(body)


@pytest.mark.skipif(
    is_compiled(frame_reader),
    reason="counts calls of a method a compiled class does not let be replaced; plain runs it",
)
def test_a_large_frame_in_many_reads_is_read_once_it_is_whole() -> None:
    """Reads that cannot complete it are only kept: a 1 MiB header is not copied per read."""
    reader, owners, channel = reading()
    owners.frame_max = 2 * 2**20
    data = b"".join(delivery_frames(b"x" * 2**20))
    reads = 0
    read_frames = reader._read_frames

    def counting(buffer: bytes) -> int:
        nonlocal reads
        reads += 1
        return read_frames(buffer)

    reader._read_frames = counting  # type: ignore[method-assign]
    chunk = 4096
    for at in range(0, len(data), chunk):
        reader.feed(data[at : at + chunk])
    assert channel.calls[-1] == ("body", b"x" * 2**20)
    assert reads <= 4, f"{reads} reads of the frames for {len(data) // chunk + 1} reads"


@pytest.mark.parametrize("size", [0, 1, 2, 3])
@pytest.mark.parametrize("number", [0, 1])
def test_a_method_frame_too_short_for_its_method_id_is_a_frame_error(
    size: int, number: int
) -> None:
    """A method's payload begins with its class and method ids, four bytes: less is 501."""
    reader, _, channel = reading()
    frame = HEADER.pack(1, number, size) + b"\x00" * size + b"\xce"
    with pytest.raises(FrameError, match=f"method frame of {size} bytes") as raised:
        reader.feed(frame)
    assert raised.value.reply_code == 501
    assert channel.calls == []
