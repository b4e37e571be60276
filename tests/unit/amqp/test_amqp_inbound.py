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
from sidecar.wire import Delivery, parse_deliver, parse_return
from tests.unit.amqp_fakes import payload_of


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


def deliver(inbound: Inbound, tag: int, body: bytes) -> None:
    method = spec.Basic.Deliver(consumer_tag="c", delivery_tag=tag, routing_key="staging")
    inbound.begin(parse_deliver(payload_of(method)))
    inbound.on_header(header(len(body)))
    inbound.on_body(memoryview(body))


async def receiving() -> tuple[Inbound, StandIn, list[Delivery], list[int], list[bytes]]:
    loop = asyncio.get_running_loop()
    written: list[bytes] = []
    channel = StandIn()
    inbound = Inbound(
        channel, loop=loop, acks=Acks(1, loop=loop, write=written.append), confirms=Confirms(loop)
    )
    got: list[Delivery] = []
    sizes: list[int] = []

    async def collect(delivery: Delivery) -> None:
        got.append(delivery)

    inbound.consume(collect, on_body_size=sizes.append)
    return inbound, channel, got, sizes, written


async def test_a_whole_delivery_runs_the_callback_as_a_task_of_its_own() -> None:
    inbound, _, got, sizes, _ = await receiving()
    deliver(inbound, 5, b"body")
    assert (got, sizes) == ([], [4])  # the size at once, the callback in a task of its own
    await asyncio.sleep(0)
    assert [(d.delivery_tag, d.body, d.properties["message_id"]) for d in got] == [
        (5, b"body", "m")
    ]


async def test_a_delivery_that_completes_on_a_closed_channel_is_not_handed_over() -> None:
    """The broker redelivers it: nobody must settle it on a channel that is gone."""
    inbound, channel, got, _, written = await receiving()
    channel.state = ChannelState.CLOSED
    deliver(inbound, 1, b"late")
    await asyncio.sleep(0)
    assert got == []
    assert written == []


async def test_a_return_that_matches_no_publish_closes_the_channel() -> None:
    inbound, channel, got, sizes, _ = await receiving()
    returned = spec.Basic.Return(312, "NO_ROUTE", exchange="ex", routing_key="rk")
    inbound.begin(parse_return(payload_of(returned)))
    inbound.on_header(header(3))
    inbound.on_body(memoryview(b"abc"))
    assert channel.state is ChannelState.CLOSING  # at once: no publish takes it meanwhile
    await asyncio.sleep(0)
    assert channel.closes == 1
    assert (got, sizes) == ([], [])  # a return is no delivery, and has no window to size
