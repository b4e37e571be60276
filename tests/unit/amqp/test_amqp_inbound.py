"""A channel's incoming messages on their own: a stand-in channel, no link, no handshake."""

from __future__ import annotations

import asyncio

from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp.acks import Acks
from sidecar.amqp.confirms import Confirms
from sidecar.amqp.inbound import Inbound
from sidecar.amqp.lifecycle import ChannelState
from sidecar.wire import parse_deliver, parse_return
from tests.unit.amqp_fakes import Collected, payload_of


class StandIn:
    """What the incoming messages need of a channel: its number, state and close."""

    def __init__(self) -> None:
        self.number = 1
        self.state = ChannelState.OPEN
        self.closes = 0

    def begin_close(self) -> None:
        """Closing from now on: nothing more is published on it."""
        self.state = ChannelState.CLOSING

    async def close(self) -> None:
        """Count the close."""
        self.closes += 1


def header(body_size: int) -> bytes:
    content = pamqp_header.ContentHeader(0, body_size, spec.Basic.Properties(message_id="m"))
    return pamqp_frame.marshal(content, 1)[7:-1]


def begin(inbound: Inbound, tag: int) -> None:
    method = spec.Basic.Deliver(consumer_tag="c", delivery_tag=tag, routing_key="staging")
    inbound.begin(parse_deliver(payload_of(method)))


def deliver(inbound: Inbound, tag: int, body: bytes) -> None:
    begin(inbound, tag)
    inbound.on_header(header(len(body)))
    inbound.on_body(memoryview(body))


async def receiving() -> tuple[Inbound, StandIn, Collected, list[bytes]]:
    loop = asyncio.get_running_loop()
    written: list[bytes] = []
    channel = StandIn()
    inbound = Inbound(
        channel, loop=loop, acks=Acks(1, loop=loop, write=written.append), confirms=Confirms(loop)
    )
    consumer = Collected()
    inbound.consume(consumer)
    return inbound, channel, consumer, written


async def test_a_whole_delivery_is_handed_over_in_the_frame_handler_and_no_task_is_made() -> None:
    """Its size at the header, the delivery at its last body frame: the consumer's own work."""
    inbound, _, consumer, _ = await receiving()
    before = asyncio.all_tasks()
    begin(inbound, 5)
    inbound.on_header(header(4))
    assert (consumer.got, consumer.sizes) == ([], [4])  # the size first, before the body
    inbound.on_body(memoryview(b"bo"))
    assert consumer.got == []
    inbound.on_body(memoryview(b"dy"))
    # Handed over before the frame handler returned, with no turn of the loop between.
    assert [(d.delivery_tag, d.body, d.properties["message_id"]) for d in consumer.got] == [
        (5, b"body", "m")
    ]
    assert consumer.sizes == [4]
    assert asyncio.all_tasks() == before  # the client started no task for it


async def test_a_delivery_that_completes_on_a_closed_channel_is_not_handed_over() -> None:
    """The broker redelivers it: nobody must settle it on a channel that is gone."""
    inbound, channel, consumer, written = await receiving()
    channel.state = ChannelState.CLOSED
    deliver(inbound, 1, b"late")
    await asyncio.sleep(0)
    assert consumer.got == []
    assert written == []


async def test_a_return_that_matches_no_publish_closes_the_channel() -> None:
    inbound, channel, consumer, _ = await receiving()
    returned = spec.Basic.Return(312, "NO_ROUTE", exchange="ex", routing_key="rk")
    inbound.begin(parse_return(payload_of(returned)))
    inbound.on_header(header(3))
    inbound.on_body(memoryview(b"abc"))
    assert channel.state is ChannelState.CLOSING  # at once: no publish takes it meanwhile
    await asyncio.sleep(0)
    assert channel.closes == 1
    # A return is no delivery, and has no window to size.
    assert (consumer.got, consumer.sizes) == ([], [])
