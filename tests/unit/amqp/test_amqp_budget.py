"""A channel's byte budget: the link reads no further delivery while it holds its budget.

A real link and channel over a fake transport: the broker's bytes are fed as a socket
would feed them (only while the link reads), and the test settles deliveries as a relay
would. Bytes in flight never exceed the budget plus one message, and every delivery is
read in the end. Also here: a body is held once (one buffer, written out as views of it).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import Channel, install_codec
from sidecar.amqp.link import WRITE_BUFFER_HIGH, Link
from sidecar.amqp.publishing import WHOLE_BODY_MAX
from sidecar.wire import Delivery, PublishOutcome, publish_frames, publish_parts
from tests.unit.amqp_fakes import FakeLink, FakeTransport, opened


def deliveries(sizes: list[int], *, first_tag: int = 1) -> bytes:
    """The frames of one delivery per body size, on channel 1."""
    out = []
    for tag, size in enumerate(sizes, start=first_tag):
        deliver = spec.Basic.Deliver("c", tag, False, "", "staging")
        header = pamqp_header.ContentHeader(0, size, spec.Basic.Properties(message_id=str(tag)))
        out += [pamqp_frame.marshal(deliver, 1), pamqp_frame.marshal(header, 1)]
        if size:
            out.append(pamqp_frame.marshal(pamqp_body.ContentBody(bytes(size)), 1))
    return b"".join(out)


class Rig:
    """A link, its fake transport, one consuming channel, and what it handed over.

    The rig is the channel's consumer (``DeliveryConsumer``): it keeps each delivery and
    notes each body size.
    """

    def __init__(self, link: Link, transport: FakeTransport, channel: Channel) -> None:
        self.link, self.transport, self.channel = link, transport, channel
        self.delivered: list[Delivery] = []
        self.counted: list[tuple[int, int]] = []  # (body size, bytes held once counted)

    def deliver(self, delivery: Delivery) -> None:
        """Keep the delivery handed over."""
        self.delivered.append(delivery)

    def body_size(self, size: int) -> None:
        """Note the size with what the channel holds once it counted this one."""
        self.counted.append((size, self.channel._inbound.held_bytes))


async def consuming(budget: int | None) -> Rig:
    install_codec()
    link = Link(asyncio.get_running_loop())
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    channel = Channel(link, 1)
    link.channels[1] = channel
    opening = asyncio.create_task(channel.open())
    await asyncio.sleep(0)
    link.data_received(pamqp_frame.marshal(spec.Channel.OpenOk(), 1))
    await opening
    rig = Rig(link, transport, channel)
    consume = asyncio.create_task(
        channel.consume(
            "staging",
            rig,
            consumer_tag="c",
            max_in_flight_bytes=budget,
        )
    )
    await asyncio.sleep(0)
    link.data_received(pamqp_frame.marshal(spec.Basic.ConsumeOk("c"), 1))
    await consume
    return rig


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=40),
    budget=st.integers(min_value=1, max_value=8000),
    read_size=st.integers(min_value=1, max_value=5000),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_bytes_in_flight_never_exceed_the_budget_plus_one_message(
    sizes: list[int], budget: int, read_size: int, seed: int
) -> None:
    """Whatever the bodies, the reads and the order of the acks: budget + one, and all read."""

    async def run() -> None:
        rig = await consuming(budget)
        rng = random.Random(seed)
        data = deliveries(sizes)
        at, acked = 0, 0
        while acked < len(sizes):
            assert rig.channel._inbound.held_bytes < budget + max(sizes) + 1
            if rig.transport.reading and at < len(data):
                rig.link.data_received(data[at : at + read_size])
                at += read_size
            await turns()
            unacked = rig.delivered[acked:]
            if unacked and (rng.random() < 0.5 or not rig.transport.reading or at >= len(data)):
                for delivery in unacked[: rng.randint(1, len(unacked))]:
                    assert await rig.channel.ack(delivery.delivery_tag)
                    acked += 1
                await turns()
        assert [d.delivery_tag for d in rig.delivered] == list(range(1, len(sizes) + 1))
        assert [size for size, _ in rig.counted] == sizes  # each told, in order
        for size, held in rig.counted:
            assert held - size < budget, "a delivery was read while its budget was full"
        assert rig.transport.reading

    asyncio.run(run())


async def test_a_full_budget_stops_the_socket_and_an_ack_starts_it_again() -> None:
    rig = await consuming(budget=100)
    rig.link.data_received(deliveries([60, 60, 60]))
    await turns()
    # The second one took the budget over: the third is not read.
    assert [d.delivery_tag for d in rig.delivered] == [1, 2]
    assert not rig.transport.reading
    assert await rig.channel.ack(1)
    await turns()
    # 60 held, under 100: the third is read (120 then), and the socket too, until the next
    # delivery's header meets the full budget.
    assert [d.delivery_tag for d in rig.delivered] == [1, 2, 3]
    assert rig.transport.reading
    rig.link.data_received(deliveries([10], first_tag=4))
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1, 2, 3]
    assert not rig.transport.reading
    assert await rig.channel.ack(2)
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1, 2, 3, 4]
    assert rig.transport.reading  # 70 held


async def test_bytes_carried_from_elsewhere_count_against_the_budget_until_released() -> None:
    """Bodies a closed channel's deliveries still hold: this channel reads beside them only."""
    rig = await consuming(budget=100)
    rig.channel.carry(90)
    rig.link.data_received(deliveries([60, 60]))
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1]  # 90 + 60 over 100: no second
    assert not rig.transport.reading
    rig.channel.carry(-90)  # their copies confirmed: room again
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1, 2]


async def test_a_channel_that_closes_gives_its_budget_back() -> None:
    """Closing, its deliveries go back to the queue: the link reads on, the close-ok too."""
    rig = await consuming(budget=10)
    rig.link.data_received(deliveries([50, 50]))
    await turns()
    assert not rig.transport.reading
    closing = asyncio.create_task(rig.channel.close())
    await turns()
    assert rig.transport.reading
    assert len(rig.delivered) == 2  # handed over, its ack refused: the broker has it back
    rig.link.data_received(pamqp_frame.marshal(spec.Channel.CloseOk(), 1))
    await closing


async def test_a_cancel_behind_unread_deliveries_lets_acks_go_once_it_is_written() -> None:
    """The cancel-ok waits unread behind a delivery only an ack lets be read.

    ``on_sent`` comes once the cancel is written; an ack from then on is written after it
    (the broker reads it after the cancel) and makes room: the rest is read, the cancel-ok
    too.
    """
    rig = await consuming(budget=100)
    rig.link.data_received(
        deliveries([60, 60, 60]) + pamqp_frame.marshal(spec.Basic.CancelOk("c"), 1)
    )
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1, 2]
    assert not rig.transport.reading
    rig.transport.written.clear()
    sent: list[int] = []
    cancelling = asyncio.create_task(rig.channel.cancel("c", on_sent=lambda: sent.append(1)))
    await turns()
    assert sent, "on_sent was not called"
    assert not cancelling.done()  # its cancel-ok is not read yet
    cancel_frame = pamqp_frame.marshal(spec.Basic.Cancel("c"), 1)
    assert bytes(rig.transport.written) == cancel_frame
    assert await rig.channel.ack(1)
    await turns()
    assert [d.delivery_tag for d in rig.delivered] == [1, 2, 3]
    assert await asyncio.wait_for(cancelling, 5) is True
    assert bytes(rig.transport.written) == cancel_frame + pamqp_frame.marshal(spec.Basic.Ack(1), 1)


async def test_a_channel_without_a_budget_is_never_held() -> None:
    rig = await consuming(budget=None)
    rig.link.data_received(deliveries([5000] * 20))
    await turns()
    assert len(rig.delivered) == 20
    assert rig.transport.reading


async def test_a_body_is_received_into_one_buffer() -> None:
    """Frame by frame into a buffer of the announced size; the delivery carries it as it is."""
    rig = await consuming(budget=None)
    deliver = spec.Basic.Deliver("c", 1, False, "", "staging")
    header = pamqp_header.ContentHeader(0, 10, spec.Basic.Properties())
    frames = [pamqp_frame.marshal(deliver, 1), pamqp_frame.marshal(header, 1)]
    frames += [
        pamqp_frame.marshal(pamqp_body.ContentBody(part), 1) for part in (b"01234", b"56789")
    ]
    rig.link.data_received(b"".join(frames))
    await turns()
    (delivery,) = rig.delivered
    assert isinstance(delivery.body, bytearray)
    assert delivery.body == b"0123456789"


async def test_body_frames_past_the_announced_size_close_the_connection() -> None:
    rig = await consuming(budget=None)
    deliver = spec.Basic.Deliver("c", 1, False, "", "staging")
    header = pamqp_header.ContentHeader(0, 4, spec.Basic.Properties())
    body = pamqp_frame.marshal(pamqp_body.ContentBody(b"too long"), 1)
    rig.link.data_received(
        b"".join([pamqp_frame.marshal(deliver, 1), pamqp_frame.marshal(header, 1), body])
    )
    await turns()
    assert rig.link.closed.is_set()
    assert "over the 4 its content header announced" in str(rig.link.close_reason)


@given(
    body=st.binary(max_size=3000),
    frame_max=st.integers(min_value=64, max_value=1024),
)
def test_a_publish_in_parts_is_the_same_bytes_as_whole(body: bytes, frame_max: int) -> None:
    args: dict[str, Any] = {
        "exchange": "x",
        "routing_key": "k",
        "body": body,
        "content_header": b"\x00\x3c\x00\x00" + len(body).to_bytes(8, "big") + b"\x00\x00",
        "frame_max": frame_max,
    }
    assert b"".join(publish_parts(3, **args)) == publish_frames(3, **args)


async def test_a_large_body_is_published_as_views_of_itself() -> None:
    link = FakeLink()
    parts: list[list[bytes | memoryview]] = []
    channel = await opened(link)
    link.write = lambda data: parts.append(data) if isinstance(data, list) else None  # type: ignore[method-assign]
    body = bytearray(WHOLE_BODY_MAX + 1)
    publishing = asyncio.create_task(
        channel.publish(
            body,
            exchange="x",
            routing_key="k",
            properties={},
            headers=None,
            slow_after_s=60,
            on_slow=lambda: None,
        )
    )
    await turns()
    (written,) = parts
    views = [part for part in written if isinstance(part, memoryview)]
    assert views
    assert all(view.obj is body for view in views), "the body was copied on its way out"
    assert sum(len(view) for view in views) == len(body)
    channel.on_method(*_ack(1))
    assert await publishing is PublishOutcome.CONFIRMED


def _ack(tag: int) -> tuple[int, bytes]:
    payload = pamqp_frame.marshal(spec.Basic.Ack(tag), 1)[7:-1]
    return int.from_bytes(payload[:4], "big"), payload


class PausingTransport(FakeTransport):
    """Calls the link's pause_writing once more than ``high`` bytes wait unsent."""

    def __init__(self, link: Link, *, high: int) -> None:
        super().__init__()
        self.link, self.high, self.unsent = link, high, 0

    def write(self, data: bytes) -> None:
        """Keep it; over the mark, the link hears pause_writing (as asyncio's would)."""
        super().write(bytes(data))
        self.unsent += len(data)
        if self.unsent > self.high:
            self.link.pause_writing()

    def drain(self) -> None:
        """The socket took everything: resume_writing."""
        self.unsent = 0
        self.link.resume_writing()


@pytest.mark.parametrize("later", [b"an ack", b""])
async def test_parts_leave_as_the_socket_drains_and_what_follows_waits_behind(
    later: bytes,
) -> None:
    link = Link(asyncio.get_running_loop())
    transport = PausingTransport(link, high=WRITE_BUFFER_HIGH)
    link.connection_made(transport)  # type: ignore[arg-type]
    transport.chunks.clear()
    transport.written.clear()
    body = bytes(range(256)) * (3 * WRITE_BUFFER_HIGH // 256)
    parts = publish_parts(
        1, exchange="", routing_key="q", body=body, content_header=b"h", frame_max=131_072
    )
    link.write_parts(parts)
    if later:
        link.write(later)
        link.flush()
    sent = len(transport.written)
    assert sent < len(body), "written past the mark at once"
    while len(transport.written) < sum(len(p) for p in parts) + len(later):
        transport.drain()
        assert len(transport.written) > sent, "a drained socket took nothing more"
        sent = len(transport.written)
    assert bytes(transport.written) == b"".join(parts) + later
