"""The link's framing: bytes cut into frames and handed to their owner; bad frames drop it."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import BrokerConnectionError, Channel, ChannelLostError, install_codec
from sidecar.amqp.link import WRITE_BATCH_BYTES, WRITE_BUFFER_HIGH, Link
from sidecar.wire import BASIC_DELIVER, HEARTBEAT, UnreadHeader
from tests.unit.amqp_fakes import FakeLink, FakeTransport

install_codec()


class RecordingEnd:
    """A channel (or channel 0) that notes what the link hands it."""

    def __init__(self, *, hot: bool = True) -> None:
        self.hot = hot
        self.calls: list[tuple[str, Any]] = []
        self.room = True  # has_room's answer
        self.consuming = True  # a consumer's channel, unless a test says it only publishes

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

    def on_body(self, payload: memoryview) -> bool:
        """Note a body frame (a copy: the view is valid during the call only)."""
        self.calls.append(("body", bytes(payload)))
        return True

    def has_room(self) -> bool:
        """Whether the test lets another delivery's content in."""
        return self.room

    def on_unread_header(self, unread: UnreadHeader, *, body_size: int) -> None:
        """Note a content header passed over."""
        self.calls.append(("unread", (unread, body_size)))

    def lose(self, error: BaseException) -> None:
        """Note the end."""
        self.calls.append(("lose", error))

    def close_frame(self, reply_code: int, reply_text: str) -> bytes:
        """Return a connection.close, as the control makes it."""
        return pamqp_frame.marshal(spec.Connection.Close(reply_code, reply_text, 0, 0), 0)


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


def written_closes(transport: FakeTransport) -> list[Any]:
    """The connection.close frames the link wrote."""
    out, data, at = [], bytes(transport.written), 8  # after the protocol header
    while at < len(data):
        size, _, frame = pamqp_frame.unmarshal(data[at:])
        at += size
        if isinstance(frame, spec.Connection.Close):
            out.append(frame)
    return out


@pytest.mark.parametrize(
    ("data", "reason", "code"),
    [
        (b"\x01\x00\x01" + (200_000).to_bytes(4, "big") + b"\x00", "over the frame size", 501),
        (b"\x08\x00\x00\x00\x00\x00\x00\x00", "lacks its frame-end octet", 501),
        (b"\x05\x00\x01\x00\x00\x00\x00\xce", "unknown frame type 5", 501),
        (b"\x03\x00\x01\x00\x00\x00\x01x\xce", "content body without a header", 505),
        (b"AMQP\x00\x00\x09\x00", "refused AMQP 0-9-1", None),
    ],
)
async def test_a_frame_that_cannot_be_read_closes_the_connection_with_the_reason(
    data: bytes, reason: str, code: int | None
) -> None:
    """Reading on past a bad frame would misread everything after it; the broker is told why.

    501 (frame error) or 505 (unexpected frame) in our connection.close, then the socket
    closes once it has left; a server that does not speak 0-9-1 is just dropped.
    """
    link, transport, channel, control = linked()
    if code == 505:
        link.channels[1] = Channel(FakeLink(), 1)  # a real channel reads its content
    link.data_received(data)
    assert link.closed.is_set()
    if code is None:
        assert transport.aborted
        assert written_closes(transport) == []
    else:
        ((close,),) = [written_closes(transport)]
        assert close.reply_code == code
        assert reason in close.reply_text
        assert transport.closed
        assert not transport.reading
    if code == 505:
        return
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


async def test_a_write_buffer_over_the_mark_stops_reading_until_the_broker_drains_it() -> None:
    """A broker that reads nothing cannot make the sidecar buffer without bound.

    On a real socket: the link writes until the transport's buffer passes the mark, then
    stops reading (so no delivery or confirm makes it write more); once the peer reads
    everything, it reads again.
    """
    loop = asyncio.get_running_loop()
    release, drained, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()
    total = {"written": len(b"AMQP\x00\x00\x09\x01"), "read": 0}

    async def slow_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        while data := await reader.read(1 << 20):
            total["read"] += len(data)
            if total["read"] >= total["written"]:
                drained.set()
        writer.close()
        await writer.wait_closed()
        ended.set()

    server = await asyncio.start_server(slow_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = Link(loop)
    link.channels[1] = RecordingEnd()  # it consumes: reading on could make it write more
    transport, _ = await loop.create_connection(lambda: link, "127.0.0.1", port)
    try:
        chunk = b"\0" * WRITE_BATCH_BYTES
        while not link.reading_paused and total["written"] < 1 << 30:
            link.write(chunk)  # a whole batch: it leaves at once
            total["written"] += len(chunk)
        assert link.reading_paused
        assert not transport.is_reading()
        assert transport.get_write_buffer_size() > WRITE_BUFFER_HIGH
        release.set()
        async with asyncio.timeout(30):
            await drained.wait()
        assert not link.reading_paused
        assert transport.is_reading()
    finally:
        release.set()
        transport.abort()
        async with asyncio.timeout(30):
            await ended.wait()
        server.close()
        await server.wait_closed()


async def test_a_broker_is_not_taken_for_dead_while_the_link_itself_stopped_reading() -> None:
    """What the broker sent waits unread then: its heartbeats are not silence."""
    link, transport, _, _ = linked()
    link.start_heartbeat(1)
    link.pause_writing()
    assert not transport.reading
    await asyncio.sleep(2.6)  # past two intervals without a frame read
    assert not link.closed.is_set(), link.close_reason
    link.resume_writing()
    assert transport.reading
    async with asyncio.timeout(5):
        await link.closed.wait()  # reading again, a silent broker is dropped as before
    assert "no heartbeat" in str(link.close_reason)


async def test_the_kernel_is_given_the_heartbeats_bound_except_while_the_broker_blocks() -> None:
    """TCP_USER_TIMEOUT is two intervals; lifted while blocked (the broker reads nothing)."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        pytest.skip("no TCP_USER_TIMEOUT on this platform")
    link, transport, _, _ = linked()
    option = (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
    assert option not in transport.socket.options  # not before the heartbeats are agreed
    link.start_heartbeat(30)
    assert transport.socket.options[option] == 60_000
    link.blocked = True
    assert transport.socket.options[option] == 0
    link.blocked = False
    assert transport.socket.options[option] == 60_000
    link.abort(ConnectionError("done"))


async def test_a_link_that_only_publishes_reads_on_while_its_writes_wait() -> None:
    """It hears connection.blocked at once, so the kernel's bound is lifted in time.

    Waiting unread behind a full write buffer, the block would be read only after the
    kernel's bound on what goes unacknowledged (two heartbeats) had ended the connection.
    A link that consumes stops reading: a delivery could make it write more.
    """
    link, transport, channel, control = linked()
    channel.consuming = False
    link.pause_writing()
    assert link.reading_paused  # the parts still wait for the drain
    assert transport.reading
    blocked = pamqp_frame.marshal(spec.Connection.Blocked(reason="low on memory"), 0)
    link.data_received(blocked)
    assert [kind for kind, _ in control.calls] == ["control"]
    link.resume_writing()
    channel.consuming = True
    link.pause_writing()
    assert not transport.reading
