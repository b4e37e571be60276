"""The client channel's bookkeeping, fed frames directly: acks, confirms and returns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import Channel, ChannelLostError, Delivery, PublishOutcome, codec, install_codec
from sidecar.amqp import channel as channel_module
from sidecar.amqp.link import WRITE_BATCH_BYTES, Link
from sidecar.wire import HEARTBEAT
from tests.unit.amqp_fakes import (
    Collected,
    FakeLink,
    FakeTransport,
    control,
    opened,
    payload_of,
)

install_codec()


def deliver(channel: Channel, tag: int, body: bytes = b"x") -> None:
    method = spec.Basic.Deliver(
        consumer_tag="c", delivery_tag=tag, exchange="", routing_key="staging"
    )
    assert channel.on_method(60 << 16 | 60, payload_of(method))
    header = pamqp_header.ContentHeader(0, len(body), spec.Basic.Properties(message_id=f"m{tag}"))
    channel.on_header(pamqp_frame.marshal(header, 1)[7:-1])
    channel.on_body(memoryview(body))


async def consuming(link: FakeLink) -> tuple[Channel, list[Delivery]]:
    channel = await opened(link)
    consumer = Collected()
    consume = asyncio.create_task(channel.consume("staging", consumer, consumer_tag="c"))
    await asyncio.sleep(0)
    control(channel, spec.Basic.ConsumeOk(consumer_tag="c"))
    await consume
    return channel, consumer.got


async def test_acks_in_one_turn_leave_as_one_multiple_ack_and_stragglers_singly() -> None:
    link = FakeLink()
    channel, got = await consuming(link)
    for tag in range(1, 6):
        deliver(channel, tag)
    await asyncio.sleep(0)
    assert [d.delivery_tag for d in got] == [1, 2, 3, 4, 5]
    for tag in (3, 1, 2, 5):  # 4 is still in flight
        assert await channel.ack(tag)
    await asyncio.sleep(0)
    assert link.acks() == [(3, True), (5, False)]
    assert await channel.ack(4)
    await asyncio.sleep(0)
    assert link.acks() == [(3, True), (5, False), (4, False)]


async def test_a_lone_ack_is_not_multiple_and_close_sends_pending_acks_first() -> None:
    link = FakeLink()
    channel, _ = await consuming(link)
    deliver(channel, 7)
    deliver(channel, 8)
    await asyncio.sleep(0)

    async def ack_then_close() -> None:
        assert await channel.ack(8)
        await channel.close()  # in the same turn: the ack must still go first

    closing = asyncio.create_task(ack_then_close())
    await asyncio.sleep(0)
    assert link.acks() == [(8, False)]
    ack, nack, close = (pamqp_frame.unmarshal(data)[2] for data in link.written[-3:])
    assert isinstance(ack, spec.Basic.Ack)
    # 7, still unacked, goes back by a nack (free on a 4.3 quorum queue), then the close.
    assert isinstance(nack, spec.Basic.Nack)
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (0, True, True)
    assert isinstance(close, spec.Channel.Close)
    control(channel, spec.Channel.CloseOk())
    await closing
    assert not await channel.ack(7)  # a closed channel: the broker redelivers it


async def test_before_4_3_unacked_deliveries_go_back_by_the_close_alone() -> None:
    """Where a nack costs an attempt as the close does (3.10, 4.0) it is not sent."""
    link = FakeLink()
    link.nack_is_free = False
    channel, _ = await consuming(link)
    deliver(channel, 7)
    await asyncio.sleep(0)
    closing = asyncio.create_task(channel.close())
    await asyncio.sleep(0)
    assert "Basic.Nack" not in [m.name for m in link.methods()]
    assert [m.name for m in link.methods()][-1] == "Channel.Close"
    control(channel, spec.Channel.CloseOk())
    await closing


async def test_a_channel_that_never_consumed_closes_without_a_nack() -> None:
    """A publishing channel holds no deliveries: its close is the close alone."""
    link = FakeLink()
    channel = await opened(link)
    closing = asyncio.create_task(channel.close())
    await asyncio.sleep(0)
    assert [m.name for m in link.methods()][-1] == "Channel.Close"
    assert "Basic.Nack" not in [m.name for m in link.methods()]
    control(channel, spec.Channel.CloseOk())
    await closing


async def test_confirms_settle_by_tag_multiple_included_and_returns_by_match() -> None:
    link = FakeLink()
    channel = await opened(link)
    publishes = [
        asyncio.create_task(
            channel.publish(
                f"body-{i}".encode(),
                exchange="ex",
                routing_key="rk",
                properties={"message_id": f"m{i}"},
                headers=None,
                slow_after_s=60,
                on_slow=lambda: None,
            )
        )
        for i in range(1, 5)
    ]
    await asyncio.sleep(0)
    returned = spec.Basic.Return(312, "NO_ROUTE", exchange="ex", routing_key="rk")
    assert channel.on_method(60 << 16 | 50, payload_of(returned))
    header = pamqp_header.ContentHeader(0, 6, spec.Basic.Properties(message_id="m2"))
    channel.on_header(pamqp_frame.marshal(header, 1)[7:-1])
    channel.on_body(memoryview(b"body-2"))
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=3, multiple=True)))
    channel.on_method(60 << 16 | 120, payload_of(spec.Basic.Nack(delivery_tag=4)))
    outcomes = await asyncio.gather(*publishes)
    assert outcomes == [
        PublishOutcome.CONFIRMED,
        PublishOutcome.RETURNED,
        PublishOutcome.CONFIRMED,
        PublishOutcome.NACKED,
    ]


async def test_a_frame_for_a_channel_closed_from_both_sides_is_ignored_not_fatal() -> None:
    """The broker's close-ok can follow its own close of the same channel: drop it."""
    link = Link(asyncio.get_running_loop())
    late = pamqp_frame.marshal(spec.Channel.CloseOk(), 9)
    link.data_received(late)
    assert not link.closed.is_set(), link.close_reason


async def test_cancel_returns_after_the_last_delivery_before_cancel_ok_was_handed_over() -> None:
    """A drain waits for in-flight work only once no delivery can still be on the wire."""
    link = FakeLink()
    channel, got = await consuming(link)
    cancelling = asyncio.create_task(channel.cancel("c"))
    await asyncio.sleep(0)
    cancel = pamqp_frame.unmarshal(link.written[-1])[2]
    assert isinstance(cancel, spec.Basic.Cancel)
    assert not cancel.nowait
    deliver(channel, 1)  # already on the wire when the broker took the cancel
    await asyncio.sleep(0)
    assert not cancelling.done()
    control(channel, spec.Basic.CancelOk(consumer_tag="c"))
    await cancelling
    assert [d.delivery_tag for d in got] == [1]


async def test_cancel_says_whether_the_broker_confirmed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-consume must know the old consumer is gone before it starts a new one."""
    monkeypatch.setattr(channel_module, "CLOSE_TIMEOUT_S", 0.01)
    link = FakeLink()
    channel, _ = await consuming(link)
    cancelling = asyncio.create_task(channel.cancel("c"))
    await asyncio.sleep(0)
    control(channel, spec.Basic.CancelOk(consumer_tag="c"))
    assert await cancelling is True
    assert await channel.cancel("c2") is False  # never answered
    channel.lose(ChannelLostError("gone"))
    assert await channel.cancel("c3") is False  # the channel ended first


async def test_qos_is_per_consumer_never_channel_wide() -> None:
    """A channel-wide qos closes the connection on a quorum queue (540 NOT_IMPLEMENTED)."""
    link = FakeLink()
    channel = await opened(link)
    setting = asyncio.create_task(channel.qos(16))
    await asyncio.sleep(0)
    (qos,) = [m for m in link.methods() if isinstance(m, spec.Basic.Qos)]
    assert (qos.prefetch_count, qos.prefetch_size, qos.global_) == (16, 0, False)
    assert not setting.done()
    control(channel, spec.Basic.QosOk())
    await setting


async def test_the_body_size_is_told_at_the_content_header_before_the_body() -> None:
    """The relay sizes its window from it: a 5 MiB body takes 40 frames to arrive."""
    link = FakeLink()
    channel = await opened(link)
    consumer = Collected()
    sizes, got = consumer.sizes, consumer.got
    consume = asyncio.create_task(channel.consume("staging", consumer, consumer_tag="c"))
    await asyncio.sleep(0)
    control(channel, spec.Basic.ConsumeOk(consumer_tag="c"))
    await consume
    method = spec.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    channel.on_method(60 << 16 | 60, payload_of(method))
    header = pamqp_header.ContentHeader(0, 10, spec.Basic.Properties())
    channel.on_header(pamqp_frame.marshal(header, 1)[7:-1])
    assert (sizes, got) == ([10], [])
    channel.on_body(memoryview(b"01234"))
    channel.on_body(memoryview(b"56789"))
    method = spec.Basic.Deliver(consumer_tag="c", delivery_tag=2, exchange="", routing_key="q")
    channel.on_method(60 << 16 | 60, payload_of(method))
    empty = pamqp_header.ContentHeader(0, 0, spec.Basic.Properties())
    channel.on_header(pamqp_frame.marshal(empty, 1)[7:-1])  # no body frame: a size too
    await asyncio.sleep(0)
    assert sizes == [10, 0]
    assert [d.body for d in got] == [b"0123456789", b""]
    broker_returns(channel, b"returned", {})  # a return is not a delivery
    assert sizes == [10, 0]


def publishing(channel: Channel, body: bytes, headers: dict[str, Any]) -> asyncio.Task[Any]:
    return asyncio.create_task(
        channel.publish(
            body,
            exchange="ex",
            routing_key="rk",
            properties={},
            headers=headers,
            slow_after_s=60,
            on_slow=lambda: None,
        )
    )


def broker_returns(channel: Channel, body: bytes, headers: dict[str, Any]) -> None:
    returned = spec.Basic.Return(312, "NO_ROUTE", exchange="ex", routing_key="rk")
    assert channel.on_method(60 << 16 | 50, payload_of(returned))
    header = pamqp_header.ContentHeader(0, len(body), spec.Basic.Properties(headers=headers))
    channel.on_header(pamqp_frame.marshal(header, 1)[7:-1])
    channel.on_body(memoryview(body))


async def test_a_return_is_matched_by_its_bytes_not_only_by_its_id_and_body() -> None:
    """Same body, no message id, different headers (a headers exchange): the right one."""
    channel = await opened(FakeLink())
    routed = publishing(channel, b"same", {"region": "eu"})
    unroutable = publishing(channel, b"same", {"region": "mars"})
    await asyncio.sleep(0)
    broker_returns(channel, b"same", {"region": "mars"})
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=2)))
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=1)))
    assert await unroutable == PublishOutcome.RETURNED
    assert await routed == PublishOutcome.CONFIRMED


async def test_a_return_that_matches_no_publish_closes_the_channel_rather_than_guess() -> None:
    link = FakeLink()
    channel = await opened(link)
    inflight = publishing(channel, b"mine", {})
    await asyncio.sleep(0)
    broker_returns(channel, b"someone else's", {})
    await asyncio.sleep(0)
    assert isinstance(pamqp_frame.unmarshal(link.written[-1])[2], spec.Channel.Close)
    control(channel, spec.Channel.CloseOk())
    with pytest.raises(ChannelLostError):
        await inflight


async def test_two_closes_send_one_close_and_both_end_together() -> None:
    """A second Channel.Close on a number the broker already freed would kill the connection."""
    link = FakeLink()
    channel = await opened(link)
    first = asyncio.create_task(channel.close())
    second = asyncio.create_task(channel.close())
    await asyncio.sleep(0)
    closes = [
        d for d in link.written if isinstance(pamqp_frame.unmarshal(d)[2], spec.Channel.Close)
    ]
    assert len(closes) == 1
    control(channel, spec.Channel.CloseOk())
    async with asyncio.timeout(1):
        await asyncio.gather(first, second)
    with pytest.raises(ChannelLostError):
        await channel.rpc(codec.basic_qos(1))  # nothing more is sent on it


async def test_a_late_reply_to_an_abandoned_rpc_does_not_answer_the_next_one() -> None:
    channel = await opened(FakeLink())
    with pytest.raises(TimeoutError):
        await channel.rpc(codec.basic_cancel("c"), timeout_s=0.01)
    qos = asyncio.create_task(channel.rpc(codec.basic_qos(1)))
    await asyncio.sleep(0)
    control(channel, spec.Basic.CancelOk(consumer_tag="c"))  # the late one
    await asyncio.sleep(0)
    assert not qos.done()
    control(channel, spec.Basic.QosOk())
    assert await qos == codec.Reply("Basic.QosOk")


async def test_a_server_that_answers_with_its_own_protocol_header_is_a_clear_error() -> None:
    link = Link(asyncio.get_running_loop())
    link.data_received(b"AMQP\x00\x00\x09\x00")
    assert link.closed.is_set()
    assert "refused AMQP 0-9-1" in str(link.close_reason)


async def test_an_idle_link_sends_heartbeats_and_a_silent_broker_is_dropped() -> None:
    link = Link(asyncio.get_running_loop())
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    link.start_heartbeat(1)
    await asyncio.sleep(1.2)
    assert HEARTBEAT in transport.written  # nothing else was written: we say we are alive
    assert not link.closed.is_set()
    link.data_received(HEARTBEAT)  # the broker is alive too
    await asyncio.sleep(1.2)
    assert not link.closed.is_set()
    async with asyncio.timeout(3):
        await link.closed.wait()  # two intervals of silence
    assert transport.aborted
    assert "no heartbeat" in str(link.close_reason)


async def test_writes_leave_once_per_turn_and_in_batches_when_a_turn_queues_more() -> None:
    """A few frames go out in one write at the end of the turn; a big turn sends as it goes."""
    link = Link(asyncio.get_running_loop())
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    transport.chunks.clear()  # the protocol header
    link.write(b"ack-1")
    link.write(b"ack-2")
    assert transport.chunks == []
    await asyncio.sleep(0)
    assert transport.chunks == [b"ack-1ack-2"]

    part = WRITE_BATCH_BYTES * 5 // 8  # two parts pass the batch size, one does not
    parts = [bytes([n]) * part for n in range(5)]
    for data in parts:
        link.write(data)
    assert [len(chunk) for chunk in transport.chunks[1:]] == [2 * part, 2 * part]
    await asyncio.sleep(0)
    assert [len(chunk) for chunk in transport.chunks[1:]] == [2 * part, 2 * part, part]
    assert b"".join(transport.chunks[1:]) == b"".join(parts)  # in order, nothing lost


async def test_a_return_with_a_header_added_matches_the_one_publish_it_contains() -> None:
    """An interceptor's header breaks the byte match: the one contained publish is it.

    The routed copy (``eu``, confirm pending) is alike in body, exchange, routing key and
    (no) id; only its header table tells it from the returned one, whose table the broker
    grew on the way back. The routed copy must not be taken for it: the returned copy's
    ack would then settle as routed, and its delivery be acked with no copy anywhere.
    """
    channel = await opened(FakeLink())
    routed = publishing(channel, b"same", {"region": "eu"})
    unroutable = publishing(channel, b"same", {"region": "mars"})
    await asyncio.sleep(0)
    broker_returns(channel, b"same", {"region": "mars", "timestamp_in_ms": 1})
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=2)))
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=1)))
    assert await unroutable == PublishOutcome.RETURNED
    assert await routed == PublishOutcome.CONFIRMED


@pytest.mark.parametrize(
    ("first", "second", "returned"),
    [
        # Alike but for what the broker added: either may be the one returned.
        ({"x-acemq-id": "b"}, {"x-acemq-id": "b"}, {"x-acemq-id": "b", "timestamp_in_ms": 1}),
        # Byte for byte alike (a binding removed between them): either may be it.
        ({"region": "eu"}, {"region": "eu"}, {"region": "eu"}),
        # Both contained in what came back: the first's table is the second's less one.
        ({}, {"region": "mars"}, {"region": "mars", "timestamp_in_ms": 1}),
        # An interceptor set to overwrite: the second's own stamp replaced, so it is not
        # contained, and the first (without one) is; the broker's names are left out.
        (
            {"x-acemq-id": "b"},
            {"x-acemq-id": "b", "timestamp_in_ms": 5},
            {"x-acemq-id": "b", "timestamp_in_ms": 9},
        ),
    ],
)
async def test_a_return_two_publishes_may_be_fails_every_unconfirmed_publish(
    first: dict[str, Any], second: dict[str, Any], returned: dict[str, Any]
) -> None:
    """No guess by publish order: the confirms may come in another order than the publishes."""
    link = FakeLink()
    channel = await opened(link)
    one = publishing(channel, b"same", first)
    two = publishing(channel, b"same", second)
    await asyncio.sleep(0)
    broker_returns(channel, b"same", returned)
    channel.on_method(60 << 16 | 80, payload_of(spec.Basic.Ack(delivery_tag=2)))
    await asyncio.sleep(0)
    assert isinstance(pamqp_frame.unmarshal(link.written[-1])[2], spec.Channel.Close)
    for publish in (one, two):
        with pytest.raises(ChannelLostError):
            await publish


async def test_a_received_content_header_over_the_frame_size_is_refused_before_sending() -> None:
    """The broker would close the connection for it (501): nothing is written."""
    link = FakeLink()
    channel = await opened(link)
    written = len(link.written)
    with pytest.raises(ValueError, match="over the broker's frame size of 131072"):
        await channel.publish(
            b"body",
            exchange="ex",
            routing_key="rk",
            properties={},
            headers={},
            slow_after_s=60,
            on_slow=lambda: None,
            content_header=b"\x00" * 131_065,
        )
    assert len(link.written) == written


async def test_a_rejected_delivery_leaves_as_basic_reject_and_no_ack_covers_it() -> None:
    """requeue=False sends it to the dead-letter exchange; the acks around it still batch."""
    link = FakeLink()
    channel, _ = await consuming(link)
    for tag in (1, 2, 3):
        deliver(channel, tag)
    await asyncio.sleep(0)
    assert await channel.reject(2, requeue=False)
    assert await channel.ack(1)
    assert await channel.ack(3)
    await asyncio.sleep(0)
    (reject,) = [m for m in link.methods() if m.name == "Basic.Reject"]
    assert (reject.delivery_tag, reject.requeue) == (2, False)
    assert link.acks() == [(3, True)]  # 1 and 3 in one, the rejected 2 no longer waited for
    await channel.close()
    assert not await channel.reject(3, requeue=True)  # a closed channel: the broker redelivers


async def test_a_requeue_leaves_as_basic_nack_which_4_3_does_not_count() -> None:
    """requeue=True: a nack for the one tag (a quorum queue of 4.3+ spends no attempt)."""
    link = FakeLink()
    channel, _ = await consuming(link)
    for tag in (1, 2):
        deliver(channel, tag)
    await asyncio.sleep(0)
    assert await channel.reject(2, requeue=True)
    assert await channel.ack(1)
    await asyncio.sleep(0)
    assert "Basic.Reject" not in [m.name for m in link.methods()]
    (nack,) = [m for m in link.methods() if m.name == "Basic.Nack"]
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (2, False, True)
    assert link.acks() == [(1, False)]
