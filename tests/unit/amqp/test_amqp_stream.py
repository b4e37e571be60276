"""A body over ``max_body_bytes`` passes through: read frame by frame, written on, never held.

Two real links over fake transports, as a session has them: one consumes (its channel
with a ``max_body_bytes``), one publishes. The consuming link's bytes are fed as a socket
would feed them (only while it reads); the publishing transport may stop taking writes
(``pause_writing``), and then the consuming link must stop reading too. What the
publishing transport received is read back frame by frame: each body over the limit must
arrive there whole and in order, re-cut to the publishing frame size, and none is held.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import Channel, install_codec, lifecycle
from sidecar.amqp.link import Link
from sidecar.errors import ChannelLostError
from sidecar.wire import PublishOutcome, UnreadBody
from tests.unit.amqp_fakes import FakeTransport, InTasks

if TYPE_CHECKING:
    from sidecar.amqp import BodyStream
    from sidecar.wire import Delivery

LIMIT = 5_000  # the consumer's max_body_bytes
CONSUME_FRAME_MAX = 4_096
PUBLISH_FRAME_MAX = 1_024  # smaller: each frame read is cut again


def body_of(tag: int, size: int) -> bytes:
    return random.Random(tag).randbytes(size)


def deliveries(sizes: list[int], *, frame_max: int = CONSUME_FRAME_MAX) -> bytes:
    """The frames of one delivery per body size on channel 1, bodies cut to ``frame_max``."""
    out = []
    step = frame_max - 8
    for tag, size in enumerate(sizes, start=1):
        deliver = spec.Basic.Deliver("c", tag, False, "", "staging")
        props = spec.Basic.Properties(message_id=str(tag), headers={"n": tag})
        header = pamqp_header.ContentHeader(0, size, props)
        out += [pamqp_frame.marshal(deliver, 1), pamqp_frame.marshal(header, 1)]
        body = body_of(tag, size)
        for at in range(0, size, step):
            out.append(pamqp_frame.marshal(pamqp_body.ContentBody(body[at : at + step]), 1))
    return b"".join(out)


def frames_written(data: bytes) -> list[Any]:
    out, at = [], 0
    while at < len(data):
        size, _, frame = pamqp_frame.unmarshal(data[at:])
        out.append(frame)
        at += size
    return out


async def link_with_channel(frame_max: int) -> tuple[Link, FakeTransport, Channel]:
    install_codec()
    link = Link(asyncio.get_running_loop())
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    link.frame_max = frame_max
    channel = Channel(link, 1)
    link.channels[1] = channel
    opening = asyncio.create_task(channel.open())
    await asyncio.sleep(0)
    link.data_received(pamqp_frame.marshal(spec.Channel.OpenOk(), 1))
    await opening
    return link, transport, channel


class Rig:
    """A consuming link and a publishing link; each delivery over the limit is published.

    Its consumer runs ``handle`` for each delivery in a task of its own; a test may swap
    ``consumer.handle`` for another.
    """

    def __init__(self) -> None:
        self.delivered: list[Delivery] = []
        self.outcomes: dict[int, PublishOutcome | BaseException] = {}
        self.passing: list[int] = []  # tags whose bodies passed through
        self.held_at_passing: list[int] = []  # the channel's bytes held as each came
        self.consumer = InTasks(self.handle)  # its sizes: those told to the window

    async def start(self) -> None:
        """Open both links' channels and start consuming."""
        self.link, self.transport, self.channel = await link_with_channel(CONSUME_FRAME_MAX)
        plink, ptransport, pchannel = await link_with_channel(PUBLISH_FRAME_MAX)
        self.plink, self.ptransport, self.pchannel = plink, ptransport, pchannel
        self.ptransport.written.clear()
        consume = asyncio.create_task(
            self.channel.consume(
                "staging",
                self.consumer,
                consumer_tag="c",
                max_in_flight_bytes=None,
                max_body_bytes=LIMIT,
            )
        )
        await asyncio.sleep(0)
        self.link.data_received(pamqp_frame.marshal(spec.Basic.ConsumeOk("c"), 1))
        await consume

    async def handle(self, delivery: Delivery) -> None:
        """Ack a held body; publish one passing through, then ack."""
        self.delivered.append(delivery)
        tag = delivery.delivery_tag
        if delivery.unread_body is None:
            assert await self.channel.ack(tag)
            return
        stream = self.channel.passing_body(tag)
        assert stream is not None
        self.passing.append(tag)
        self.held_at_passing.append(self.channel._inbound.held_bytes)
        try:
            outcome = await self.publish(stream)
        except ChannelLostError as e:
            self.outcomes[tag] = e
            return
        self.outcomes[tag] = outcome
        assert await self.channel.ack(tag)

    async def publish(self, stream: BodyStream) -> PublishOutcome:
        """Publish a body passing through to quarantine on the publishing channel."""
        return await self.pchannel.publish_through(
            stream,
            exchange="acemq.quarantine",
            routing_key="orders",
            properties={"message_id": "m"},
            headers={"x-acemq-error": "too large"},
            slow_after_s=60.0,
            on_slow=lambda: None,
        )

    def published_bodies(self) -> list[tuple[int, bytes]]:
        """(announced size, body) of each publish the publishing transport received."""
        out: list[tuple[int, bytearray]] = []
        for frame in frames_written(bytes(self.ptransport.written)):
            if isinstance(frame, pamqp_header.ContentHeader):
                out.append((frame.body_size, bytearray()))
            elif isinstance(frame, pamqp_body.ContentBody):
                assert len(frame.value) <= PUBLISH_FRAME_MAX - 8
                out[-1][1].extend(frame.value)
        return [(size, bytes(body)) for size, body in out]

    def confirm_all(self) -> None:
        """The broker confirms every publish so far."""
        tags = len(self.passing)
        self.plink.data_received(pamqp_frame.marshal(spec.Basic.Ack(tags, multiple=True), 1))


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def feed_with_stops(rig: Rig, data: bytes, read_size: int, rng: random.Random) -> None:
    """Feed ``data`` while the consuming link reads; the publishing socket stops at random.

    While it takes nothing, nothing passes through: at most one frame read (it finds the
    socket full once written) and a publish's method and header.
    """
    at = 0
    while at < len(data):
        if rng.random() < 0.3 and not rig.plink.reading_paused:
            rig.plink.pause_writing()  # the broker reads nothing for a while
        elif rig.plink.reading_paused and rng.random() < 0.5:
            rig.plink.resume_writing()
        paused, before = rig.plink.reading_paused, len(rig.ptransport.written)
        if rig.transport.reading:
            rig.link.data_received(data[at : at + read_size])
            at += read_size
        await turns()
        if paused:
            grew = len(rig.ptransport.written) - before
            assert grew <= CONSUME_FRAME_MAX + 512, "wrote on while the socket was full"
        elif not rig.transport.reading and not rig.plink.reading_paused:
            await turns()  # a resume in flight


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=12),
    read_size=st.integers(min_value=1, max_value=9_000),
    seed=st.integers(min_value=0, max_value=2**16),
)
# One read ends a body and begins the next while the socket is full: the next body's
# first frame waits for it to drain.
@example(sizes=[8554, 5001], read_size=8259, seed=22)
def test_bodies_over_the_limit_pass_through_whole_and_none_is_held(
    sizes: list[int], read_size: int, seed: int
) -> None:
    """Whatever the sizes, the reads and the publishing socket's stops: whole, in order."""

    async def run() -> None:
        rig = Rig()
        await rig.start()
        await feed_with_stops(rig, deliveries(sizes), read_size, random.Random(seed))
        while rig.plink.reading_paused:
            rig.plink.resume_writing()
        await turns()
        rig.confirm_all()
        await turns()
        over = [tag for tag, size in enumerate(sizes, start=1) if size > LIMIT]
        assert rig.passing == over
        assert all(rig.outcomes[tag] is PublishOutcome.CONFIRMED for tag in over)
        published = rig.published_bodies()
        assert published == [(sizes[tag - 1], body_of(tag, sizes[tag - 1])) for tag in over]
        for delivery in rig.delivered:
            size = sizes[delivery.delivery_tag - 1]
            if size > LIMIT:
                assert delivery.unread_body == UnreadBody(size=size, limit=LIMIT)
                assert delivery.body == b""
                assert delivery.properties["message_id"] == str(delivery.delivery_tag)
            else:
                assert bytes(delivery.body) == body_of(delivery.delivery_tag, size)
        # A body passing through is not counted as held, nor told to the window: the
        # bodies held are acked as they come, so none is held as one passes.
        assert sorted(rig.consumer.sizes) == sorted(s for s in sizes if s <= LIMIT)
        assert all(held <= LIMIT for held in rig.held_at_passing), rig.held_at_passing
        assert rig.transport.reading

    asyncio.run(run())


async def test_the_frames_wait_unread_until_a_publish_takes_the_stream() -> None:
    rig = Rig()
    await rig.start()
    taken: list[BodyStream] = []

    async def keep(delivery: Delivery) -> None:
        stream = rig.channel.passing_body(delivery.delivery_tag)
        assert stream is not None
        taken.append(stream)

    rig.consumer.handle = keep
    rig.link.data_received(deliveries([12_000, 10]))
    await turns()
    assert len(taken) == 1
    assert not rig.transport.reading  # held at the first body frame
    assert rig.channel.passing_body(1) is None  # given once
    publishing = asyncio.create_task(rig.publish(taken[0]))
    await turns()
    assert rig.transport.reading
    assert [size for size, _ in rig.published_bodies()] == [12_000]
    assert rig.published_bodies()[0][1] == body_of(1, 12_000)
    rig.plink.data_received(pamqp_frame.marshal(spec.Basic.Ack(1), 1))
    assert await publishing is PublishOutcome.CONFIRMED


async def test_a_stream_settled_without_a_publish_is_read_and_dropped() -> None:
    """Rejected (given back) before any publish took it: the frames are read and let go."""
    rig = Rig()
    await rig.start()
    delivered: list[Delivery] = []

    async def give_back(delivery: Delivery) -> None:
        delivered.append(delivery)
        assert await rig.channel.reject(delivery.delivery_tag, requeue=True)

    rig.consumer.handle = give_back
    rig.link.data_received(deliveries([30_000, 7]))
    await turns()
    assert [d.delivery_tag for d in delivered] == [1, 2]
    assert rig.transport.reading
    assert rig.ptransport.written == b""


async def test_a_stream_cut_off_drops_the_publishing_connection() -> None:
    """The consuming connection ends half-way: the message begun cannot be finished."""
    rig = Rig()
    await rig.start()
    data = deliveries([20_000])
    rig.link.data_received(data[: len(data) // 2])
    await turns()
    assert rig.passing == [1]
    rig.link.connection_lost(None)
    await turns()
    assert rig.plink.closed.is_set()
    assert rig.ptransport.aborted
    assert isinstance(rig.outcomes[1], ChannelLostError)


async def test_closing_the_publishing_channel_half_way_drops_its_connection() -> None:
    """A channel.close inside a message's content would be a connection error anyway."""
    rig = Rig()
    await rig.start()
    data = deliveries([20_000])
    rig.link.data_received(data[: len(data) // 2])
    await turns()
    await rig.pchannel.close()
    assert rig.ptransport.aborted
    rig.link.data_received(data[len(data) // 2 :])
    await turns()
    assert rig.transport.reading  # the rest is read and dropped
    assert isinstance(rig.outcomes[1], ChannelLostError)


async def test_a_return_of_a_body_passed_through_is_matched_by_its_size_and_not_held() -> None:
    rig = Rig()
    await rig.start()
    rig.link.data_received(deliveries([9_000]))
    await turns()
    # The broker returns it (nothing bound), body and all, then confirms it.
    returned = spec.Basic.Return(312, "NO_ROUTE", "acemq.quarantine", "orders")
    props = spec.Basic.Properties(message_id="m", headers={"x-acemq-error": "too large"})
    frames = [
        pamqp_frame.marshal(returned, 1),
        pamqp_frame.marshal(pamqp_header.ContentHeader(0, 9_000, props), 1),
    ]
    body = body_of(1, 9_000)
    frames += [
        pamqp_frame.marshal(pamqp_body.ContentBody(body[at : at + 1000]), 1)
        for at in range(0, 9_000, 1000)
    ]
    frames.append(pamqp_frame.marshal(spec.Basic.Ack(1), 1))
    data = b"".join(frames)
    rig.plink.data_received(data[:-2000])  # all but the end of its body, and the confirm
    await turns()
    assert len(rig.pchannel._inbound._content._body) == 0  # its body is not held
    rig.plink.data_received(data[-2000:])
    await turns()
    assert rig.outcomes[1] is PublishOutcome.RETURNED


async def test_a_stream_cut_off_before_a_publish_took_it_drops_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our close of the consuming channel, unanswered in time: the rest is never held."""
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT_S", 0.05)
    rig = Rig()
    await rig.start()

    async def keep(delivery: Delivery) -> None:  # its publish waits (a gate, an alarm)
        del delivery

    rig.consumer.handle = keep
    data = deliveries([200_000])
    rig.link.data_received(data[:-3000])
    await turns()
    assert not rig.transport.reading  # held at its first body frame
    await rig.channel.close()  # the close-ok waits behind the body's frames
    await turns()
    assert rig.transport.reading
    assert len(rig.channel._inbound._content._body) == 0
    rig.link.data_received(data[-3000:])
    await turns()
    assert len(rig.channel._inbound._content._body) == 0


async def test_a_stream_cut_off_half_way_drops_the_publish_and_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The publishing socket full, our close unanswered in time: nothing more is held."""
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT_S", 0.05)
    rig = Rig()
    await rig.start()
    data = deliveries([200_000])
    rig.plink.pause_writing()
    rig.link.data_received(data[:-3000])
    await turns()
    assert rig.passing == [1]
    assert not rig.transport.reading
    await rig.channel.close()
    await turns()
    assert rig.ptransport.aborted  # the message begun cannot be finished on its channel
    assert len(rig.channel._inbound._content._body) == 0
    rig.link.data_received(data[-3000:])
    await turns()
    assert len(rig.channel._inbound._content._body) == 0
    assert isinstance(rig.outcomes[1], ChannelLostError)
