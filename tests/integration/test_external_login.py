"""An EXTERNAL login with no user in the URL, through the whole relay.

The broker knows the sidecar by its client certificate's name (RabbitMQ's
``ssl_cert_login_from``), which the sidecar does not know; so no user_id can be checked to
match it, and RabbitMQ refuses (406) a publish whose user_id is not the connection's user.
A user_id "guest" is moved, not kept: kept (as a login defaulting to guest would have it),
it would be refused.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as spec

from sidecar.flow.publish_gate import PROBE_ROUTING_KEY
from tests.integration.conftest import route_map_yaml, wait_for
from tests.scripted_broker import ScriptedBroker
from tests.tls_files import TlsFiles, make_tls_files

BOUND_S = 30


class Confirming:
    """Confirms every publish and keeps it whole: method, content header, body."""

    def __init__(self) -> None:
        self.publishes: list[tuple[Any, Any, bytes]] = []

    def __call__(
        self, channel: int, tag: int, method: Any, header: Any, body: bytes
    ) -> list[tuple[int, Any]]:
        """Keep the publish (not the publish gate's probe) and confirm it."""
        if method.routing_key != PROBE_ROUTING_KEY:
            self.publishes.append((method, header, body))
        return [(channel, spec.Basic.Ack(delivery_tag=tag))]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def requiring_a_client_certificate(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    context.load_verify_locations(files.cert)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def with_tls(text: str, files: TlsFiles) -> str:
    tls = f"  tls: {{ca_file: {files.cert}, cert_file: {files.cert}, key_file: {files.key}}}\n"
    head, _, rest = text.partition("\n")  # "broker:" first
    return f"{head}\n{tls}{rest}"


@pytest.mark.parametrize(
    ("userinfo", "user_id_stays"),
    [("", False), ("guest", True)],  # a user in the URL: taken to be the certificate's
)
async def test_external_without_a_user_moves_every_user_id(
    run_sidecar: Callable[..., Any],
    files: TlsFiles,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    userinfo: str,
    *,
    user_id_stays: bool,
) -> None:
    confirming = Confirming()
    tls = requiring_a_client_certificate(files)
    async with ScriptedBroker(mechanisms="EXTERNAL", tls=tls, on_publish=confirming) as server:
        query = "auth_mechanism=external" if userinfo else ""  # a user alone means PLAIN
        url = server.url(userinfo, scheme="amqps", query=query).replace("127.0.0.1", "localhost")
        route = {"name": "r1", "from": "staging", "exchange": "out", "publishers": "apps"}
        text = with_tls(route_map_yaml(url, "quarantine", [route]), files)
        with caplog.at_level(logging.INFO, logger="sidecar.service"):
            async with run_sidecar(text):
                await server.wait_for("Basic.Consume")
                (number,) = [
                    n for n, frame in server.received if isinstance(frame, spec.Basic.Consume)
                ]
                properties = spec.Basic.Properties(message_id="m-1", user_id="guest")
                server.send_content(
                    spec.Basic.Deliver("c", 1, False, "", "staging"),
                    channel=number,
                    body=b"body",
                    properties=properties,
                )
                async with asyncio.timeout(BOUND_S):
                    await server.wait_for("Basic.Publish")
                await wait_for(lambda: bool(server.methods("Basic.Ack")), what="the ack")
    assert server.methods("Connection.StartOk")[0].mechanism == "EXTERNAL"
    ((method, header, body),) = confirming.publishes
    assert (method.exchange, body) == ("out", b"body")
    headers = header.properties.headers or {}
    if user_id_stays:
        assert header.properties.user_id == "guest"
        assert "acemq-original-user-id" not in headers
        assert "every user_id is moved" not in caplog.text
    else:
        assert header.properties.user_id is None
        assert headers["acemq-original-user-id"] == "guest"
        assert "logged in with SASL EXTERNAL as the client certificate's user" in caplog.text
        assert "every user_id is moved to acemq-original-user-id" in caplog.text
