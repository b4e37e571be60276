"""The frame reader on its own: bytes in, frames to their owners, no link and no socket."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from sidecar.amqp.frame_reader import ChannelEnd, ControlEnd, FrameReader, NotAmqpError
from sidecar.amqp.violations import FrameError

from .test_amqp_link import RecordingEnd, delivery_frames


@dataclass
class Owners:
    """Who the frames go to: what a link is to its reader, and nothing more."""

    frame_max: int = 131_072
    channels: dict[int, ChannelEnd] = field(default_factory=dict)
    control: ControlEnd | None = None


def reading() -> tuple[FrameReader, Owners, RecordingEnd]:
    channel = RecordingEnd()
    owners = Owners(channels={1: channel}, control=RecordingEnd(hot=False))
    return FrameReader(owners), owners, channel


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
