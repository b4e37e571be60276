"""A content header over the 16 MiB the client reads, through the whole relay.

RabbitMQ does not split content headers: with its frame_max above 16 MiB (or 0), a
publisher that negotiated a big frame size can put a 20 MiB header table in front of a
message, and the broker hands it on whole. The scripted server sends one, then a normal
delivery on the same channel: the first must be quarantined (its body kept, a reason naming
the sizes), the second relayed, and the connection must stay up: no close with 501, no
reconnect on a redelivery.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from pamqp import body as pamqp_body
from pamqp import commands as spec

from sidecar.flow.publish_gate import PROBE_ROUTING_KEY
from sidecar.wire import FRAME_END, FRAME_HEADER, HEADER
from tests.integration.conftest import route_map_yaml, wait_for
from tests.scripted_broker import ScriptedBroker

HEADER_BYTES = 20 * 1024 * 1024
BOUND_S = 30


class Confirming:
    """Confirms every publish, as a broker that routes it does, and keeps them whole."""

    def __init__(self) -> None:
        self.publishes: list[tuple[Any, Any, bytes]] = []  # method, content header, body

    def __call__(
        self, channel: int, tag: int, method: Any, header: Any, body: bytes
    ) -> list[tuple[int, Any]]:
        """Keep the publish (not the publish gate's probe) and confirm it."""
        if method.routing_key != PROBE_ROUTING_KEY:
            self.publishes.append((method, header, body))
        return [(channel, spec.Basic.Ack(delivery_tag=tag))]


def unreadable_header(channel: int, *, body_size: int) -> bytes:
    """A content header frame of 20 MiB: class, weight, body size, flags, then a table."""
    fixed = struct.pack(">HHQH", 60, 0, body_size, 1 << 13)  # flags: headers follow
    table = b"\x00" * (HEADER_BYTES - len(fixed))
    return HEADER.pack(FRAME_HEADER, channel, HEADER_BYTES) + fixed + table + bytes((FRAME_END,))


async def test_a_20_mib_header_is_quarantined_and_the_next_delivery_relayed_on_one_connection(
    run_sidecar: Callable[..., Any],
) -> None:
    confirming = Confirming()
    async with ScriptedBroker(on_publish=confirming) as server:
        route = {"name": "r1", "from": "staging", "exchange": "out", "publishers": "apps"}
        text = route_map_yaml(server.url(), "quarantine", [route])
        async with run_sidecar(text) as running:
            await server.wait_for("Basic.Consume")
            (number,) = [n for n, frame in server.received if isinstance(frame, spec.Basic.Consume)]
            server.send(spec.Basic.Deliver("c", 1, False, "", "staging"), channel=number)
            server.send_raw(unreadable_header(number, body_size=8))
            server.send(pamqp_body.ContentBody(b"big-body"), channel=number)
            after = spec.Basic.Properties(message_id="m-2", headers={"x-acemq-type": "t"})
            server.send_content(
                spec.Basic.Deliver("c", 2, False, "", "staging"),
                channel=number,
                body=b"next",
                properties=after,
            )
            async with asyncio.timeout(BOUND_S):
                await server.wait_for("Basic.Publish", 2)
            await wait_for(lambda: acked(server) >= 2, what="both deliveries acked")
            reconnects = running.registry.get_sample_value("acemq_sidecar_reconnects_total")
            assert running.service.readiness().ok
        publishes = confirming.publishes
        assert {(p.exchange, body) for p, _, body in publishes} == {
            ("quarantine", b"big-body"),
            ("out", b"next"),
        }
        (quarantined,) = [h for p, h, _ in publishes if p.exchange == "quarantine"]
        headers = quarantined.properties.headers
        reason = headers["x-acemq-error"]
        assert f"{HEADER_BYTES} bytes, over the limit of 16777216" in reason, reason
        assert "its properties and headers could not be read" in reason
        assert headers["acemq-original-header-bytes"] == HEADER_BYTES
        assert headers["acemq-quarantined-from"] == "staging"
        assert len(server.methods("Connection.Open")) == 2  # never reconnected: one of each
        assert reconnects == 0
        assert server.methods("Basic.Reject") == []


def acked(server: ScriptedBroker) -> int:
    """The highest delivery tag acked so far (a multiple ack covers those before it)."""
    return max((ack.delivery_tag for ack in server.methods("Basic.Ack")), default=0)
