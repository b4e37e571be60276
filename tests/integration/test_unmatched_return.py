"""A return that matches no publish never ends in an ack without a copy (scripted broker).

RabbitMQ returns a copy as it was published; a plugin or an interceptor that changes a part
the client compares (the body, the ``x-acemq-id``) makes the return match nothing in flight.
The broker's confirm follows the return: the delivery must not be acked on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.integration.conftest import route_map_yaml, wait_for
from tests.scripted_broker import ScriptedBroker

ID = "x-acemq-id"


def return_then_ack(server: ScriptedBroker, change: dict[str, Any]) -> Any:
    """Answer the first publish to ``out`` with a changed return, then its ack; ack the rest."""
    first: list[int] = []

    def answer(channel: int, tag: int, method: Any, header: Any, body: bytes) -> list[Any]:
        ack = (channel, spec.Basic.Ack(delivery_tag=tag))
        if method.exchange != "out" or first:
            return [ack]
        first.append(tag)
        headers = dict(header.properties.headers or {}) | change.get("headers", {})
        properties = spec.Basic.Properties(message_id=header.properties.message_id, headers=headers)
        back = spec.Basic.Return(312, "NO_ROUTE", method.exchange, method.routing_key)
        returned = change.get("body", body)
        content = [ContentHeader(0, len(returned), properties), ContentBody(returned)]
        return [(channel, frame) for frame in (back, *content)] + [ack]

    return answer


@pytest.mark.parametrize(
    "change", [{"body": b"changed on the way"}, {"headers": {ID: "another-id"}}], ids=["body", "id"]
)
async def test_an_unmatched_return_is_never_acked_without_a_confirmed_copy(
    change: dict[str, Any], run_sidecar: Callable[..., Any]
) -> None:
    """The first copy's return matches nothing: its confirm is not taken, a second copy is."""
    async with ScriptedBroker() as server:
        server.on_publish = return_then_ack(server, change)
        text = route_map_yaml(
            server.url(), "quarantine", [{"name": "r1", "from": "staging", "exchange": "out"}]
        )
        async with run_sidecar(text) as running:
            consume = await server.wait_for("Basic.Consume")
            (number,) = [n for n, frame in server.received if frame is consume]
            properties = spec.Basic.Properties(message_id="m-1", headers={ID: "m-1"})
            deliver = spec.Basic.Deliver(consume.consumer_tag, 1, False, "", "staging")
            server.send_content(deliver, channel=number, body=b"payload", properties=properties)
            async with asyncio.timeout(15):
                await server.wait_for("Basic.Ack")
            copies = [m for m in server.methods("Basic.Publish") if m.exchange == "out"]
            assert len(copies) >= 2, "acked on the confirm that followed an unmatched return"
            await wait_for(lambda: running.service.readiness().ok, what="ready again")


async def test_a_return_grown_on_the_way_back_is_never_taken_for_a_routed_copy(
    run_sidecar: Callable[..., Any],
) -> None:
    """Two copies alike but for a header a headers exchange routes by; no id (audit mode).

    The broker holds the first copy's confirm (routed, a slow queue), returns the second
    with a header an interceptor added (``timestamp_in_ms``), then confirms the second
    and the first. The return is the second's: its delivery goes to quarantine, and the
    routed one is acked on its own confirm. Taken for the first, the second's confirm
    would ack a delivery with no copy anywhere.
    """
    outs: list[int] = []

    def answer(channel: int, tag: int, method: Any, header: Any, body: bytes) -> list[Any]:
        if method.exchange != "out":
            return [(channel, spec.Basic.Ack(delivery_tag=tag))]
        outs.append(tag)
        if len(outs) == 1:
            return []  # the routed copy's confirm waits
        headers = dict(header.properties.headers or {}) | {"timestamp_in_ms": 1_790_000_000_000}
        back = spec.Basic.Return(312, "NO_ROUTE", method.exchange, method.routing_key)
        content = [
            ContentHeader(0, len(body), spec.Basic.Properties(headers=headers)),
            ContentBody(body),
        ]
        acks = [spec.Basic.Ack(delivery_tag=tag), spec.Basic.Ack(delivery_tag=outs[0])]
        return [(channel, frame) for frame in (back, *content, *acks)]

    async with ScriptedBroker() as server:
        server.on_publish = answer
        text = route_map_yaml(
            server.url(),
            "quarantine",
            [{"name": "r1", "from": "staging", "exchange": "out"}],
            mode="audit",
        )
        async with run_sidecar(text):
            consume = await server.wait_for("Basic.Consume")
            (number,) = [n for n, frame in server.received if frame is consume]
            for tag, region in ((1, "eu"), (2, "mars")):
                properties = spec.Basic.Properties(headers={"region": region})
                deliver = spec.Basic.Deliver(consume.consumer_tag, tag, False, "", "staging")
                server.send_content(deliver, channel=number, body=b"payload", properties=properties)
            await wait_for(lambda: _acked(server) >= {1, 2}, what="both deliveries acked")
            sent = _published(server)
            assert [exchange for exchange, _ in sent] == ["out", "out", "quarantine"], sent
            assert sent[-1][1] == "mars", sent  # the quarantine copy is the returned one


def _published(server: ScriptedBroker) -> list[tuple[str, object]]:
    """Each publish's exchange and ``region`` header, but the sidecar's probes (exchange "")."""
    sent: list[tuple[str, object]] = []
    publish: Any = None
    for _, frame in server.received:
        if isinstance(frame, spec.Basic.Publish):
            publish = frame
        elif isinstance(frame, ContentHeader) and publish is not None:
            if publish.exchange:
                sent.append((publish.exchange, (frame.properties.headers or {}).get("region")))
            publish = None
    return sent


def _acked(server: ScriptedBroker) -> set[int]:
    """The delivery tags the sidecar acked, ``multiple`` included."""
    acked: set[int] = set()
    for ack in server.methods("Basic.Ack"):
        acked |= set(range(1, ack.delivery_tag + 1)) if ack.multiple else {ack.delivery_tag}
    return acked
