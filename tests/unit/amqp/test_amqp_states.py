"""The channel's state machine: its states, its moves, and what each state refuses."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands as spec

from sidecar.amqp import (
    Channel,
    ChannelClosedError,
    ChannelLostError,
    ChannelState,
    PublishOutcome,
    codec,
    install_codec,
)
from tests.unit.amqp_fakes import FakeLink, control, opened, payload_of

install_codec()

BASIC_ACK = 60 << 16 | 80
BASIC_CANCEL = 60 << 16 | 30


def state_of(channel: Channel) -> ChannelState:
    """The channel's state, read afresh (mypy would narrow a property across awaits)."""
    return channel.state


def publishing(channel: Channel) -> asyncio.Task[PublishOutcome]:
    return asyncio.create_task(
        channel.publish(
            b"body",
            exchange="ex",
            routing_key="rk",
            properties={},
            headers=None,
            slow_after_s=60,
            on_slow=lambda: None,
        )
    )


async def in_state(state: ChannelState) -> tuple[Channel, FakeLink]:
    """A channel brought to ``state`` the way the broker and the sidecar would."""
    link = FakeLink()
    if state is ChannelState.OPENING:
        channel = Channel(link, 1)
        asyncio.create_task(channel.open())  # noqa: RUF006 - never answered
        await asyncio.sleep(0)
        return channel, link
    channel = await opened(link)
    if state is ChannelState.CLOSING:
        asyncio.create_task(channel.close())  # noqa: RUF006 - answered by no close-ok here
        await asyncio.sleep(0)
    elif state is ChannelState.CLOSED:
        control(channel, spec.Channel.Close(406, "PRECONDITION_FAILED", 60, 40))
    return channel, link


async def test_a_channel_opens_on_the_brokers_open_ok() -> None:
    """OPENING sends channel.open and nothing else; open-ok makes it OPEN."""
    link = FakeLink()
    channel = Channel(link, 1)
    assert state_of(channel) is ChannelState.OPENING
    opening = asyncio.create_task(channel.open())
    await asyncio.sleep(0)
    assert [m.name for m in link.methods()] == ["Channel.Open"]
    assert state_of(channel) is ChannelState.OPENING
    control(channel, spec.Channel.OpenOk())
    await opening
    assert state_of(channel) is ChannelState.OPEN
    assert channel.is_open


# state -> (is_open, ack accepted, requests and publishes sent)
REFUSALS = {
    ChannelState.OPENING: (False, False, False),
    ChannelState.OPEN: (True, True, True),
    ChannelState.CLOSING: (False, False, False),
    ChannelState.CLOSED: (False, False, False),
}


@pytest.mark.parametrize("state", list(ChannelState))
async def test_only_an_open_channel_acks_publishes_and_sends_requests(
    state: ChannelState,
) -> None:
    """A frame on a channel being closed (or closed) would be the broker's connection error."""
    channel, link = await in_state(state)
    assert state_of(channel) is state
    is_open, acks, sends = REFUSALS[state]
    assert channel.is_open is is_open
    written = len(link.written)
    assert await channel.ack(1) is acks
    if sends:
        publish = publishing(channel)
        request = asyncio.create_task(channel.rpc(codec.basic_qos(1)))
        await asyncio.sleep(0)
        assert [m.name for m in link.methods()[-3:]] == ["Basic.Ack", "Basic.Publish", "Basic.Qos"]
        publish.cancel()
        request.cancel()
    else:
        with pytest.raises(ChannelLostError):
            await publishing(channel)
        with pytest.raises(ChannelLostError):
            await channel.rpc(codec.basic_qos(1))
        await asyncio.sleep(0)
        assert len(link.written) == written  # nothing at all went out


async def test_our_close_goes_through_closing_to_closed_on_the_close_ok() -> None:
    """The number is free again only once the broker answered."""
    channel, link = await in_state(ChannelState.OPEN)
    closing = asyncio.create_task(channel.close())
    await asyncio.sleep(0)
    assert state_of(channel) is ChannelState.CLOSING
    assert link.methods()[-1].name == "Channel.Close"
    assert link.forgotten == []
    control(channel, spec.Channel.CloseOk())
    await closing
    assert state_of(channel) is ChannelState.CLOSED
    assert link.forgotten == [1]
    assert await channel.wait_closed() == "channel closed by the sidecar"


async def test_the_brokers_close_ends_the_channel_and_fails_what_waits_on_it() -> None:
    """A broker's close is answered with close-ok; a pending publish and request learn why."""
    channel, link = await in_state(ChannelState.OPEN)
    publish = publishing(channel)
    request = asyncio.create_task(channel.rpc(codec.basic_qos(1)))
    await asyncio.sleep(0)
    control(channel, spec.Channel.Close(406, "PRECONDITION_FAILED", 60, 40))
    assert state_of(channel) is ChannelState.CLOSED
    assert link.methods()[-1].name == "Channel.CloseOk"
    assert link.forgotten == [1]
    for waiting in (publish, request):
        with pytest.raises(ChannelClosedError) as e:
            await waiting
        assert e.value.code == 406
    assert await channel.wait_closed() == "channel closed by the broker: 406 PRECONDITION_FAILED"


async def test_a_close_crossing_the_brokers_close_ends_once() -> None:
    """Our close and the broker's pass each other: CLOSED, and no second close is sent."""
    channel, link = await in_state(ChannelState.CLOSING)
    control(channel, spec.Channel.Close(320, "CONNECTION_FORCED", 0, 0))
    assert state_of(channel) is ChannelState.CLOSED
    await channel.close()
    assert [m.name for m in link.methods()].count("Channel.Close") == 1


async def test_an_open_ok_after_our_close_does_not_reopen_the_channel() -> None:
    """A channel closed while opening stays closing: nothing may be sent on it."""
    link = FakeLink()
    channel = Channel(link, 1)
    opening = asyncio.create_task(channel.open())
    await asyncio.sleep(0)
    closing = asyncio.create_task(channel.close())
    await asyncio.sleep(0)
    control(channel, spec.Channel.OpenOk())
    await opening
    assert state_of(channel) is ChannelState.CLOSING
    control(channel, spec.Channel.CloseOk())
    await closing
    assert state_of(channel) is ChannelState.CLOSED


async def test_a_lost_connection_closes_the_channel_in_any_state() -> None:
    """The link tells every channel; a close in progress returns at once."""
    for state in (ChannelState.OPENING, ChannelState.OPEN, ChannelState.CLOSING):
        channel, _ = await in_state(state)
        channel.lose(ChannelLostError("the connection closed: gone"))
        assert state_of(channel) is ChannelState.CLOSED
        assert await channel.wait_closed() == "the connection closed: gone"
        async with asyncio.timeout(1):
            await channel.close()


async def test_the_brokers_cancel_ends_the_consumer_but_not_the_channel() -> None:
    """Deliveries in flight can still be settled on it: acks go out, the route is told."""
    channel, link = await in_state(ChannelState.OPEN)
    cancel = spec.Basic.Cancel(consumer_tag="acemq-sidecar.r1")
    assert channel.on_method(BASIC_CANCEL, payload_of(cancel))
    assert state_of(channel) is ChannelState.OPEN
    assert "cancelled the consumer" in await channel.wait_closed()
    assert await channel.ack(3)
    await asyncio.sleep(0)
    assert link.methods()[-1].name == "Basic.Ack"


async def test_a_channel_is_gone_once_it_begins_to_close_not_at_a_cancel() -> None:
    """``wait_gone``: a waiting delivery lets go at the close, an event rather than a poll."""
    channel, _ = await in_state(ChannelState.OPEN)
    gone = asyncio.create_task(channel.wait_gone())
    cancel = spec.Basic.Cancel(consumer_tag="acemq-sidecar.r1")
    assert channel.on_method(BASIC_CANCEL, payload_of(cancel))
    await asyncio.sleep(0)
    assert not gone.done()  # the cancel alone: what is in flight may still be settled
    channel.begin_close()
    async with asyncio.timeout(1):
        await gone


async def test_flow_is_answered_with_the_same_flag() -> None:
    """channel.flow is acknowledged with its own flag, and the channel stays open."""
    channel, link = await in_state(ChannelState.OPEN)
    control(channel, spec.Channel.Flow(active=False))
    (flow_ok,) = [m for m in link.methods() if m.name == "Channel.FlowOk"]
    assert flow_ok.active is False
    assert state_of(channel) is ChannelState.OPEN


async def test_a_confirm_for_a_closed_channel_changes_nothing() -> None:
    """Frames that arrive after the end are moot."""
    channel, _ = await in_state(ChannelState.CLOSED)
    assert channel.on_method(BASIC_ACK, payload_of(spec.Basic.Ack(delivery_tag=1)))
    assert state_of(channel) is ChannelState.CLOSED
