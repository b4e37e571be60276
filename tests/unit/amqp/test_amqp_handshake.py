"""The client against a scripted AMQP server: handshake, tuning, refusals, channel 0."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pamqp import commands as spec

from sidecar.amqp import (
    BrokerConnectionError,
    ChannelState,
    ConnectFailedError,
    Connection,
    MissingEntityError,
    connect,
    lifecycle,
)
from sidecar.amqp import connection as connection_module
from sidecar.broker import BrokerAddress
from sidecar.dialer import OPTIONS
from sidecar.errors import SidecarError
from tests.scripted_broker import Answer, ScriptedBroker, refuse, silent

BOUND_S = 10  # no test waits longer than this for anything


async def connected(server: ScriptedBroker, url: str | None = None, **kw: float) -> Connection:
    options = {"heartbeat_s": 30, "connect_timeout_s": 5} | kw
    async with asyncio.timeout(BOUND_S):
        return await connect(
            BrokerAddress.parse(url or server.url()),
            heartbeat_s=int(options["heartbeat_s"]),
            connect_timeout_s=options["connect_timeout_s"],
            options=OPTIONS,  # as the relay connects
        )


async def test_the_handshake_logs_in_tunes_to_the_least_and_opens_the_vhost() -> None:
    """PLAIN with the URL's decoded login, our capabilities, the broker's lower limits."""
    async with ScriptedBroker(channel_max=100, frame_max=65_536, heartbeat=20) as server:
        connection = await connected(server, server.url("alice:s%2Fcret", "/orders"))
        (start_ok,) = server.methods("Connection.StartOk")
        assert start_ok.mechanism == "PLAIN"
        assert start_ok.response == "\0alice\0s/cret"
        properties = start_ok.client_properties
        assert properties["connection_name"] == "acemq-sidecar"
        assert properties["capabilities"]["publisher_confirms"] is True
        assert properties["capabilities"]["consumer_cancel_notify"] is True
        (tune_ok,) = server.methods("Connection.TuneOk")
        assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (100, 65_536, 20)
        (open_vhost,) = server.methods("Connection.Open")
        assert open_vhost.virtual_host == "orders"
        async with asyncio.timeout(BOUND_S):
            await connection.close()
        assert server.methods("Connection.Close")[0].reply_code == 200
        assert not connection.is_open


@pytest.mark.parametrize(
    ("query", "broker_heartbeat", "agreed"),
    [
        ("", 60, (2047, 131_072, 30)),  # the client's own limits and heartbeat_s
        ("heartbeat=7&channel_max=10&frame_max=4096", 60, (10, 4096, 7)),  # the URL's win
        ("heartbeat=0", 15, (2047, 131_072, 15)),  # 0 on one side takes the other's
        ("frame_max=1048576&channel_max=0", 0, (2047, 131_072, 30)),  # ceilings, not asks
    ],
)
async def test_the_urls_tuning_parameters_are_honoured(
    query: str, broker_heartbeat: int, agreed: tuple[int, int, int]
) -> None:
    """heartbeat, channel_max and frame_max from the URL reach tune-ok."""
    async with ScriptedBroker(heartbeat=broker_heartbeat) as server:
        connection = await connected(server, server.url(query=query))
        (tune_ok,) = server.methods("Connection.TuneOk")
        assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == agreed
        await connection.close()


async def test_the_urls_connection_timeout_wins_over_the_setting() -> None:
    """A server that never starts the handshake: the URL's 200 ms, not the setting's 60 s."""
    async with ScriptedBroker(start=False) as server:
        with pytest.raises(ConnectFailedError) as e:
            await connected(
                server, server.url(query="connection_timeout=200"), connect_timeout_s=60
            )
    assert isinstance(e.value, ConnectionError)  # the service's `except ConnectionError`
    assert isinstance(e.value, SidecarError)
    assert "TimeoutError" in str(e.value)


async def test_a_refused_login_is_a_connect_error_that_names_the_reason_not_the_password() -> None:
    """RabbitMQ closes with 403 after start-ok when the login is wrong."""
    refusal = spec.Connection.Close(403, "ACCESS_REFUSED - Login was refused", 0, 0)
    async with ScriptedBroker(answers={"Connection.StartOk": refuse(refusal)}) as server:
        with pytest.raises(ConnectFailedError) as e:
            await connected(server, server.url("alice:hunter2"))
        await server.wait_for("Connection.CloseOk")  # the client answered the close
    assert "403 ACCESS_REFUSED" in str(e.value)
    assert "hunter2" not in str(e.value)
    assert "hunter2" not in repr(e.value.__cause__)


async def test_a_channel_opens_in_confirm_mode_with_the_prefetch() -> None:
    """open, confirm.select, qos with the route's prefetch, in that order, on channel 1."""
    async with ScriptedBroker() as server:
        connection = await connected(server)
        async with asyncio.timeout(BOUND_S):
            channel = await connection.channel(prefetch=5)
        assert channel.state is ChannelState.OPEN
        on_channel = [(n, f.name) for n, f in server.received if n]
        assert on_channel == [(1, "Channel.Open"), (1, "Confirm.Select"), (1, "Basic.Qos")]
        assert server.methods("Basic.Qos")[0].prefetch_count == 5
        await connection.close()


async def test_a_missing_queue_is_a_missing_entity_and_the_connection_stays() -> None:
    """The passive check's 404 closes only its scratch channel."""
    not_found = spec.Channel.Close(404, "NOT_FOUND - no queue 'staging' in vhost '/'", 50, 10)
    async with ScriptedBroker(answers={"Queue.Declare": refuse(not_found)}) as server:
        connection = await connected(server)
        with pytest.raises(MissingEntityError) as e:
            async with asyncio.timeout(BOUND_S):
                await connection.check_queue("staging")
        assert (e.value.kind, e.value.name) == ("queue", "staging")
        await server.wait_for("Channel.CloseOk")
        assert connection.is_open
        await connection.close()


async def test_the_brokers_close_ends_the_connection_with_its_reason() -> None:
    """A forced close (rabbitmqctl close_connection) is answered, and every waiter told."""
    async with ScriptedBroker() as server:
        connection = await connected(server)
        server.send(spec.Connection.Close(320, "CONNECTION_FORCED - bye", 0, 0))
        async with asyncio.timeout(BOUND_S):
            reason = await connection.wait_closed()
        await server.wait_for("Connection.CloseOk")
    assert isinstance(reason, BrokerConnectionError)
    assert "320 CONNECTION_FORCED" in str(reason)


async def test_a_blocked_connection_is_logged_and_stays_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """connection.blocked and unblocked are logged; the connection stays open meanwhile."""
    async with ScriptedBroker(answers={"Basic.Qos": silent}) as server:
        connection = await connected(server)
        with caplog.at_level(logging.INFO, logger="sidecar.amqp"):
            server.send(spec.Connection.Blocked("low on memory"))
            server.send(spec.Connection.Unblocked())
            opening = asyncio.create_task(connection.channel(prefetch=1))
            await server.wait_for("Basic.Qos")  # everything sent before it was read
        opening.cancel()
        assert connection.is_open
        await connection.close()
    messages = [r.getMessage() for r in caplog.records]
    assert "the broker blocks publishing: low on memory" in messages
    assert "the broker unblocked publishing" in messages


async def test_closing_while_the_broker_blocks_waits_for_no_close_ok(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blocked broker reads nothing, a close included: neither close waits for its answer.

    The number of the channel stays taken until the close-ok comes (it may come after the
    alarm), so that no new channel meets the broker's idea of the old one.
    """
    monkeypatch.setattr(lifecycle, "CLOSE_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(connection_module, "CLOSE_TIMEOUT_S", 3600.0)
    answers: dict[str, Answer] = {"Channel.Close": silent, "Connection.Close": silent}
    async with ScriptedBroker(answers=answers) as server:
        connection = await connected(server)
        channel = await connection.channel(prefetch=1)
        server.send(spec.Connection.Blocked("low on memory"))
        async with asyncio.timeout(BOUND_S):
            await connection.check_queue("q")  # answered after the block was read
            assert connection.blocked_reason == "low on memory"
            await channel.close()
            assert channel.state is ChannelState.CLOSED
            assert channel.number in connection._link.channels
            await connection.close()
        assert not connection.is_open


def drop(_channel: int, _method: object) -> list[tuple[int, object]]:
    """An answer that ends the connection with no close: RabbitMQ 4.3 to frame_max=4096."""
    raise ConnectionResetError("dropped by the scripted broker")


@pytest.mark.parametrize(("frame_max", "named"), [(4096, True), (8192, False)])
async def test_a_connection_ended_after_asking_for_small_frames_says_to_raise_them(
    frame_max: int, *, named: bool
) -> None:
    """Under 8,192 bytes a frame, the error names the URL's frame_max and what 4.1+ wants."""
    async with ScriptedBroker(answers={"Connection.Open": drop}) as server:
        with pytest.raises(ConnectFailedError) as e:
            await connected(server, server.url(query=f"frame_max={frame_max}"))
    said = str(e.value)
    assert ("frame_max=4096" in said and "less than 8192" in said) is named, said
