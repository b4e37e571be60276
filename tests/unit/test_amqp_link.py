"""The link's framing: bytes cut into frames and handed to their owner; bad frames drop it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import BrokerConnectionError, ChannelLostError, install_codec
from sidecar.amqp.link import Link
from sidecar.frames import BASIC_DELIVER, HEARTBEAT

from .amqp_fakes import FakeTransport

install_codec()


class RecordingEnd:
    """A channel (or channel 0) that notes what the link hands it."""

    def __init__(self, *, hot: bool = True) -> None:
        self.hot = hot
        self.calls: list[tuple[str, Any]] = []

    def on_method(self, method_id: int, payload: bytes) -> bool:
        """Take the hot method (deliver) only."""
        if self.hot and method_id == BASIC_DELIVER:
            self.calls.append(("method", payload))
            return True
        return False

    def on_control(self, frame: bytes) -> None:
        """Note a control frame."""
        self.calls.append(("control", frame))

    def on_header(self, payload: bytes) -> None:
        """Note a content header."""
        self.calls.append(("header", payload))

    def on_body(self, payload: bytes) -> None:
        """Note a body frame."""
        self.calls.append(("body", payload))

    def lose(self, error: BaseException) -> None:
        """Note the end."""
        self.calls.append(("lose", error))


def linked() -> tuple[Link, FakeTransport, RecordingEnd, RecordingEnd]:
    link = Link(asyncio.get_running_loop())
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    channel, control = RecordingEnd(), RecordingEnd(hot=False)
    link.channels[1] = channel
    link.control = control
    return link, transport, channel, control


def delivery_frames(body: bytes) -> list[bytes]:
    """A delivery's method, header and body frames, a heartbeat in between (it may be)."""
    deliver = spec.Basic.Deliver("c", 7, False, "", "staging")
    header = pamqp_header.ContentHeader(0, len(body), spec.Basic.Properties(message_id="m"))
    return [
        pamqp_frame.marshal(deliver, 1),
        pamqp_frame.marshal(header, 1),
        HEARTBEAT,
        pamqp_frame.marshal(pamqp_body.ContentBody(body), 1),
    ]


@pytest.mark.parametrize("step", [1, 3, 7, 64, 4096])
async def test_frames_cut_anywhere_are_put_back_together_and_handed_in_order(step: int) -> None:
    """TCP delivers bytes, not frames: the link waits for a whole frame before it acts."""
    link, _, channel, control = linked()
    frames = delivery_frames(b"the body")
    qos_ok = pamqp_frame.marshal(spec.Basic.QosOk(), 1)
    close = pamqp_frame.marshal(spec.Connection.Blocked("low on memory"), 0)
    data = b"".join([*frames, qos_ok, close])
    for at in range(0, len(data), step):
        link.data_received(data[at : at + step])
    assert not link.closed.is_set(), link.close_reason
    assert [kind for kind, _ in channel.calls] == ["method", "header", "body", "control"]
    assert channel.calls[0][1] == frames[0][7:-1]  # a hot method: its payload
    assert channel.calls[2][1] == b"the body"  # the heartbeat between went to nobody
    assert channel.calls[3][1] == qos_ok  # any other method: the whole frame
    assert control.calls == [("control", close)]  # channel 0 goes to the control


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x00\x01" + (200_000).to_bytes(4, "big") + b"\x00", "over the frame size"),
        (b"\x08\x00\x00\x00\x00\x00\x00\x00", "lacks its frame-end octet"),
        (b"\x05\x00\x01\x00\x00\x00\x00\xce", "unknown frame type 5"),
        (b"AMQP\x00\x00\x09\x00", "refused AMQP 0-9-1"),
    ],
)
async def test_a_frame_that_cannot_be_read_drops_the_connection_with_the_reason(
    data: bytes, reason: str
) -> None:
    """Reading on past a bad frame would misread everything after it."""
    link, transport, channel, control = linked()
    link.data_received(data)
    assert link.closed.is_set()
    assert transport.aborted
    assert isinstance(link.close_reason, BrokerConnectionError)
    assert isinstance(link.close_reason, ConnectionError)
    assert reason in str(link.close_reason)
    ((kind, lost),) = channel.calls
    assert kind == "lose"
    assert isinstance(lost, ChannelLostError)
    assert control.calls == [("lose", link.close_reason)]


async def test_frames_for_a_channel_nobody_owns_are_dropped() -> None:
    """A channel closed from both sides at once still gets the broker's close-ok."""
    link, _, channel, _ = linked()
    for frame in delivery_frames(b"x"):
        link.data_received(frame[:1] + b"\x00\x09" + frame[3:])  # channel 9
    assert not link.closed.is_set()
    assert channel.calls == []


async def test_a_lost_socket_ends_every_channel_and_the_control_with_one_reason() -> None:
    """Every waiter learns why, once."""
    link, _, channel, control = linked()
    link.connection_lost(None)
    link.connection_lost(OSError("again"))
    assert "the broker closed the connection" in str(link.close_reason)
    assert [kind for kind, _ in channel.calls] == ["lose"]
    assert control.calls == [("lose", link.close_reason)]
    assert link.channels == {}
