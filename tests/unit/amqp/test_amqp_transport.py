"""The transport audit's client conditions against the scripted AMQP server.

Each drives the client with frames RabbitMQ never sends, or sends only under conditions a
unit test cannot make: a content header over the agreed frame size, properties that do not
parse, ``channel.flow``, a mechanism list without PLAIN, a return with a header added on
the way, the broker's ``basic.cancel`` with a publish in flight, malformed frames, and TLS
chosen by the scheme in any case.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from typing import Any

import pytest
from pamqp import commands as spec
from pamqp import decode as pamqp_decode

from sidecar.amqp import (
    Channel,
    ChannelLostError,
    ConnectFailedError,
    Connection,
    Delivery,
    PublishOutcome,
    connect,
)
from sidecar.amqp.link import FRAME_MAX_CEILING
from sidecar.broker import BrokerAddress
from sidecar.dialer import OPTIONS
from sidecar.routemap.model import TlsConfig
from sidecar.tls import client_context
from sidecar.wire import FRAME_END, FRAME_HEADER, HEADER
from tests.scripted_broker import ScriptedBroker
from tests.tls_files import TlsFiles, make_tls_files

BOUND_S = 10  # no test waits longer than this for anything
ID = "x-acemq-id"


async def connected(url: str, **kw: Any) -> Connection:
    async with asyncio.timeout(BOUND_S):
        return await connect(
            BrokerAddress.parse(url), heartbeat_s=30, connect_timeout_s=5, options=OPTIONS, **kw
        )


class Queued:
    """A consumer that queues each delivery for the test to await."""

    def __init__(self) -> None:
        self.got: asyncio.Queue[Delivery] = asyncio.Queue()

    def deliver(self, delivery: Delivery) -> None:
        """Queue the delivery."""
        self.got.put_nowait(delivery)

    def body_size(self, size: int) -> None:
        """Not needed here."""
        del size


async def consuming(connection: Connection) -> tuple[Channel, asyncio.Queue[Delivery]]:
    consumer = Queued()
    async with asyncio.timeout(BOUND_S):
        channel = await connection.channel(prefetch=10)
        await channel.consume("staging", consumer, consumer_tag="c")
    return channel, consumer.got


def publishing(channel: Channel, body: bytes, headers: dict[str, Any]) -> asyncio.Task[Any]:
    return asyncio.create_task(
        channel.publish(
            body,
            exchange="ex",
            routing_key="rk",
            properties={"message_id": "m"},
            headers=headers,
            slow_after_s=60,
            on_slow=lambda: None,
        )
    )


def deliver(tag: int) -> spec.Basic.Deliver:
    return spec.Basic.Deliver("c", tag, False, "", "staging")


# --- the broker's frame size, and content the client cannot read ---------------------------


@pytest.mark.parametrize(
    ("broker", "agreed"), [(1_048_576, 1_048_576), (0, FRAME_MAX_CEILING), (4096, 4096)]
)
async def test_the_brokers_frame_size_is_taken(broker: int, agreed: int) -> None:
    """RabbitMQ does not split content headers: the client must read what a publisher could."""
    async with ScriptedBroker(frame_max=broker) as server:
        connection = await connected(server.url())
        (tune_ok,) = server.methods("Connection.TuneOk")
        assert tune_ok.frame_max == agreed
        await connection.close()


async def test_a_content_header_over_the_agreed_frame_size_is_read_not_fatal() -> None:
    """A 300 KB header table on a 128 KiB connection (the URL's frame_max below the broker's).

    The connection stays up: no drop on it, and none on its redelivery.
    """
    async with ScriptedBroker(frame_max=1_048_576) as server:
        connection = await connected(server.url(query="frame_max=131072"))
        channel, got = await consuming(connection)
        big: dict[str, Any] = {"x-big": "b" * 300_000, ID: "id-1"}
        properties = spec.Basic.Properties(message_id="m1", headers=big)
        server.send_content(deliver(1), channel=1, body=b"body", properties=properties)
        async with asyncio.timeout(BOUND_S):
            delivery = await got.get()
        assert delivery.headers["x-big"] == "b" * 300_000
        assert delivery.body == b"body"
        assert delivery.undecodable is None
        assert connection.is_open
        # As it came, it cannot go back out on this connection: refused before sending.
        with pytest.raises(ValueError, match="over the broker's frame size of 131072"):
            await channel.publish(
                delivery.body,
                exchange="ex",
                routing_key="rk",
                properties=delivery.properties,
                headers=delivery.headers,
                slow_after_s=60,
                on_slow=lambda: None,
                content_header=delivery.content_header,
            )
        assert server.methods("Basic.Publish") == []
        assert await channel.ack(delivery.delivery_tag)
        await server.wait_for("Basic.Ack")
        assert connection.is_open
        await connection.close()


async def test_properties_that_do_not_parse_still_make_a_delivery_marked_undecodable() -> None:
    """A short string running past its frame: the relay quarantines it, the link lives on."""
    async with ScriptedBroker() as server:
        connection = await connected(server.url())
        _, got = await consuming(connection)
        server.send(deliver(1), channel=1)
        # class 60, weight 0, body size 4, flags: message_id; its length says 200, 3 follow
        payload = struct.pack(">HHQH", 60, 0, 4, 1 << 7) + bytes((200,)) + b"abc"
        header = HEADER.pack(FRAME_HEADER, 1, len(payload)) + payload + bytes((FRAME_END,))
        server.send_raw(header)
        server.send_raw(b"\x03\x00\x01\x00\x00\x00\x04body\xce")
        async with asyncio.timeout(BOUND_S):
            delivery = await got.get()
        assert delivery.undecodable is not None
        assert "content header cannot be read" in delivery.undecodable.error
        assert delivery.undecodable.raw == payload[12:]  # the property bytes, flags on
        assert delivery.body == b"body"
        assert connection.is_open
        await connection.close()


# --- malformed frames are closed with a reply code, not dropped ---------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\x08\x00\x00\x00\x00\x00\x00\x00", 501),  # a heartbeat without its frame-end
        (b"\x01\x00\x00\x00\x00\x00\x02\x00\x0a\xce", 501),  # a method too short to decode
        (b"\x03\x00\x01\x00\x00\x00\x01x\xce", 505),  # a body with no delivery before it
    ],
)
async def test_a_malformed_frame_is_answered_with_connection_close_not_a_tcp_drop(
    raw: bytes, code: int
) -> None:
    """The broker logs why (501 frame error, 505 unexpected frame) instead of a reset."""
    async with ScriptedBroker() as server:
        connection = await connected(server.url())
        await consuming(connection)
        server.send_raw(raw)
        close = await asyncio.wait_for(server.wait_for("Connection.Close"), BOUND_S)
        async with asyncio.timeout(BOUND_S):
            reason = await connection.wait_closed()
    assert close.reply_code == code
    assert "unreadable frame" in close.reply_text
    assert "unreadable frame" in str(reason)


# --- connection.blocked ---------------------------------------------------------------------


async def test_blocked_keeps_the_brokers_reason_until_unblocked() -> None:
    """The relay stops publishing and says why on /readyz; it waits for the unblock."""
    async with ScriptedBroker() as server:
        connection = await connected(server.url())
        assert connection.blocked_reason is None
        await connection.wait_unblocked()  # not blocked: at once
        server.send(spec.Connection.Blocked("low on memory"))
        await connection.check_exchange("x")  # a round trip: the blocked frame was read
        assert connection.blocked_reason == "low on memory"
        waiting = asyncio.create_task(connection.wait_unblocked())
        await connection.check_exchange("x")
        assert not waiting.done()
        server.send(spec.Connection.Unblocked())
        async with asyncio.timeout(BOUND_S):
            await waiting
        assert connection.blocked_reason is None
        server.send(spec.Connection.Blocked("low on disk"))
        await connection.check_exchange("x")
        waiting = asyncio.create_task(connection.wait_unblocked())
        await connection.close()  # a close ends the wait too
        async with asyncio.timeout(BOUND_S):
            await waiting
        assert connection.blocked_reason is None


# --- channel.flow ---------------------------------------------------------------------------


def ack_every_publish(channel: int, tag: int, *_: Any) -> list[tuple[int, Any]]:
    return [(channel, spec.Basic.Ack(delivery_tag=tag))]


async def test_flow_inactive_holds_publishes_until_the_broker_lets_them_go() -> None:
    """channel.flow(active=false) is obeyed: nothing is published on that channel meanwhile."""
    async with ScriptedBroker(on_publish=ack_every_publish) as server:
        connection = await connected(server.url())
        channel, _ = await consuming(connection)
        server.send(spec.Channel.Flow(active=False), channel=1)
        flow_ok = await asyncio.wait_for(server.wait_for("Channel.FlowOk"), BOUND_S)
        assert flow_ok.active is False
        assert not channel.is_flowing
        held = publishing(channel, b"held", {})
        await connection.check_queue("q")  # later frames on the socket: the publish is not
        assert server.methods("Basic.Publish") == []
        assert not held.done()
        server.send(spec.Channel.Flow(active=True), channel=1)
        async with asyncio.timeout(BOUND_S):
            assert await held == PublishOutcome.CONFIRMED
        assert len(server.methods("Basic.Publish")) == 1
        await connection.close()


async def test_a_publish_held_by_flow_fails_when_the_channel_ends() -> None:
    """It must not wait for ever: the channel's end is its answer (the broker redelivers)."""
    async with ScriptedBroker() as server:
        connection = await connected(server.url())
        channel, _ = await consuming(connection)
        server.send(spec.Channel.Flow(active=False), channel=1)
        await asyncio.wait_for(server.wait_for("Channel.FlowOk"), BOUND_S)
        held = publishing(channel, b"held", {})
        server.send(spec.Channel.Close(320, "CONNECTION_FORCED", 0, 0), channel=1)
        with pytest.raises(ChannelLostError, match="320 CONNECTION_FORCED"):
            async with asyncio.timeout(BOUND_S):
                await held
        await connection.check_exchange("x")  # a round trip: a publish sent would be in
        assert server.methods("Basic.Publish") == []
        await connection.close()


# --- the SASL mechanism ---------------------------------------------------------------------


def amqplain_table(response: str | bytes) -> dict[str, Any]:
    raw = response.encode() if isinstance(response, str) else response
    _, table = pamqp_decode.field_table(struct.pack(">I", len(raw)) + raw)
    return table


async def test_an_amqplain_only_broker_gets_amqplain() -> None:
    """AMQPLAIN, not PLAIN regardless (for which the broker resets the connection: 104)."""
    async with ScriptedBroker(mechanisms="AMQPLAIN") as server:
        connection = await connected(server.url("alice:s3cret"))
        (start_ok,) = server.methods("Connection.StartOk")
        assert start_ok.mechanism == "AMQPLAIN"
        assert amqplain_table(start_ok.response) == {"LOGIN": "alice", "PASSWORD": "s3cret"}
        await connection.close()


@pytest.mark.parametrize(
    ("mechanisms", "query", "says"),
    [
        ("RABBIT-CR-DEMO", "", "the broker offers RABBIT-CR-DEMO, the client logs in with"),
        ("AMQPLAIN", "auth_mechanism=plain", "the URL's auth_mechanism asks for PLAIN"),
        ("", "", "the broker offers none"),
    ],
)
async def test_no_mechanism_in_common_is_a_connect_error_naming_both_lists(
    mechanisms: str, query: str, says: str
) -> None:
    """Which mechanisms were on offer, which the client wanted, what to change."""
    async with ScriptedBroker(mechanisms=mechanisms) as server:
        with pytest.raises(ConnectFailedError) as e:
            await connected(server.url("alice:hunter2", query=query))
    assert "no SASL mechanism in common" in str(e.value)
    assert says in str(e.value)
    assert "hunter2" not in str(e.value)


async def test_a_refused_login_names_the_mechanism() -> None:
    """RabbitMQ closes with 403 after start-ok; the error says with which mechanism."""
    refusal = spec.Connection.Close(403, "ACCESS_REFUSED - Login was refused", 0, 0)
    answers = {"Connection.StartOk": lambda _c, _m: [(0, refusal)]}
    async with ScriptedBroker(mechanisms="AMQPLAIN", answers=answers) as server:
        with pytest.raises(ConnectFailedError) as e:
            await connected(server.url("alice:hunter2"))
    assert "refused the login with SASL mechanism AMQPLAIN as user 'alice'" in str(e.value)
    assert "403 ACCESS_REFUSED" in str(e.value)
    assert "hunter2" not in str(e.value)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A certificate for localhost that is its own CA, and its key."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """TLS that requires a client certificate signed by the test CA (RabbitMQ's verify_peer)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    context.load_verify_locations(files.cert)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_tls(files: TlsFiles) -> ssl.SSLContext:
    """The context the service builds from broker.tls: the CA and a client certificate."""
    config = TlsConfig(ca_file=str(files.cert), cert_file=str(files.cert), key_file=str(files.key))
    return client_context(config)


async def test_external_over_amqps_with_no_user_logs_in_with_the_client_certificate(
    files: TlsFiles,
) -> None:
    """As RabbitMQ's rabbitmq_auth_mechanism_ssl expects: EXTERNAL, an empty response."""
    tls = client_tls(files)
    async with ScriptedBroker(mechanisms="EXTERNAL", tls=server_context(files)) as server:
        connection = await connected(server.url("", scheme="amqps"), ssl_context=tls)
        (start_ok,) = server.methods("Connection.StartOk")
        assert start_ok.mechanism == "EXTERNAL"
        assert start_ok.response in ("", b"")
        await connection.close()


async def test_with_a_user_in_the_url_plain_is_preferred_over_external(files: TlsFiles) -> None:
    """A user in the URL means a password login, even where EXTERNAL is on offer."""
    tls = client_tls(files)
    context = server_context(files)
    async with ScriptedBroker(mechanisms="EXTERNAL PLAIN", tls=context) as server:
        connection = await connected(server.url("alice:pw", scheme="amqps"), ssl_context=tls)
        assert server.methods("Connection.StartOk")[0].mechanism == "PLAIN"
        await connection.close()


# --- TLS is what the parsed address says -----------------------------------------------------


async def test_an_upper_case_amqps_scheme_uses_the_route_maps_client_certificate(
    files: TlsFiles,
) -> None:
    """``AMQPS://`` is TLS with the given context: the server that requires a cert accepts."""
    tls = client_tls(files)
    async with ScriptedBroker(tls=server_context(files)) as server:
        connection = await connected(server.url(scheme="AMQPS"), ssl_context=tls)
        assert server.methods("Connection.Open")
        await connection.close()


async def test_a_context_given_for_a_plain_amqp_url_does_not_turn_tls_on(files: TlsFiles) -> None:
    """The scheme decides, not whether a context was built: ``amqp://`` stays plain."""
    tls = client_tls(files)
    async with ScriptedBroker() as server:
        connection = await connected(server.url(), ssl_context=tls)
        assert server.methods("Connection.Open")
        await connection.close()


# --- returns matched by what a broker never changes ----------------------------------------


def return_with_a_header_added(returned: set[str]) -> Any:
    """Return publishes whose id is in ``returned``, a timestamp header added; ack them all."""

    def answer(channel: int, tag: int, method: Any, header: Any, body: bytes) -> list[Any]:
        headers = dict(header.properties.headers or {})
        frames: list[tuple[int, Any]] = []
        if headers.get(ID) in returned:
            headers["timestamp_in_ms"] = 1_767_323_045_678  # set_header_timestamp's
            properties = spec.Basic.Properties(
                message_id=header.properties.message_id, headers=headers
            )
            back = spec.Basic.Return(312, "NO_ROUTE", method.exchange, method.routing_key)
            frames += [(channel, back), (channel, ("content", properties, body))]
        return [*frames, (channel, spec.Basic.Ack(delivery_tag=tag))]

    return answer


async def test_a_return_with_a_header_added_on_the_way_still_matches_its_publish() -> None:
    """RabbitMQ's message interceptors add headers: the return must still find its publish.

    The channel stays open: an unmatched return would close it and redeliver every publish
    in flight.
    """
    async with ScriptedBroker() as server:
        server.on_publish = content_aware(server, return_with_a_header_added({"id-2"}))
        connection = await connected(server.url())
        channel, _ = await consuming(connection)
        first = publishing(channel, b"same", {ID: "id-1"})
        second = publishing(channel, b"same", {ID: "id-2"})
        async with asyncio.timeout(BOUND_S):
            outcomes = await asyncio.gather(first, second)
        assert list(outcomes) == [PublishOutcome.CONFIRMED, PublishOutcome.RETURNED]
        assert channel.is_open
        await connection.close()


def content_aware(server: ScriptedBroker, answer: Any) -> Any:
    """Let an on_publish answer include a content (method's properties and body) to send."""

    def wrapped(channel: int, tag: int, method: Any, header: Any, body: bytes) -> list[Any]:
        out: list[tuple[int, Any]] = []
        for number, frame in answer(channel, tag, method, header, body):
            if isinstance(frame, tuple):  # ("content", properties, body) after its method
                _, properties, content = frame
                back = out.pop()[1]
                server.send_content(back, channel=number, body=content, properties=properties)
            else:
                out.append((number, frame))
        return out

    return wrapped


# --- the broker's basic.cancel with a publish in flight ------------------------------------


async def test_after_the_brokers_cancel_in_flight_publishes_and_acks_still_complete() -> None:
    """The queue was deleted: what is in flight is settled before the route closes it."""
    acks: list[tuple[int, Any]] = []

    def hold_then_ack(channel: int, tag: int, *_: Any) -> list[tuple[int, Any]]:
        acks.append((channel, spec.Basic.Ack(delivery_tag=tag)))
        return []

    async with ScriptedBroker(on_publish=hold_then_ack) as server:
        connection = await connected(server.url())
        channel, got = await consuming(connection)
        server.send_content(
            deliver(1), channel=1, body=b"b", properties=spec.Basic.Properties(message_id="m")
        )
        async with asyncio.timeout(BOUND_S):
            delivery = await got.get()
        copy = publishing(channel, b"b", {})
        await server.wait_for("Basic.Publish")
        server.send(spec.Basic.Cancel(consumer_tag="c"), channel=1)
        async with asyncio.timeout(BOUND_S):
            reason = await channel.wait_closed()
        assert "cancelled the consumer" in reason
        assert channel.consumer_cancelled
        assert channel.is_open
        (number, ack) = acks.pop()
        server.send(ack, channel=number)
        async with asyncio.timeout(BOUND_S):
            assert await copy == PublishOutcome.CONFIRMED
        assert await channel.ack(delivery.delivery_tag)
        await server.wait_for("Basic.Ack")
        await channel.cancel("c")  # nothing left to cancel: nothing is sent
        assert server.methods("Basic.Cancel") == []
        await channel.close()
        await connection.close()


# --- a return that matches no publish fails every publish in flight ------------------------


def return_changed_then_ack(changed: dict[str, Any]) -> Any:
    """Return every publish with ``changed`` over its parts (a body, headers), then ack it.

    The broker's own confirm follows the return, as RabbitMQ sends them; a plugin or an
    interceptor changing a compared part makes the return match nothing in flight.
    """

    def answer(channel: int, tag: int, method: Any, header: Any, body: bytes) -> list[Any]:
        headers = dict(header.properties.headers or {}) | changed.get("headers", {})
        properties = spec.Basic.Properties(message_id=header.properties.message_id, headers=headers)
        back = spec.Basic.Return(312, "NO_ROUTE", method.exchange, method.routing_key)
        content = changed.get("body", body)
        return [
            (channel, back),
            (channel, ("content", properties, content)),
            (channel, spec.Basic.Ack(delivery_tag=tag)),
        ]

    return answer


@pytest.mark.parametrize(
    "changed",
    [{"body": b"changed on the way"}, {"headers": {ID: "another-id"}}],
    ids=["body", "id"],
)
async def test_a_return_that_matches_no_publish_fails_the_publish_its_confirm_never_settles(
    changed: dict[str, Any],
) -> None:
    """The confirm after an unmatched return must not settle its publish as confirmed.

    Which publish came back cannot be told, so every unconfirmed one of the channel fails
    (its delivery is given back, never acked without a copy) and the channel closes.
    """
    async with ScriptedBroker() as server:
        server.on_publish = content_aware(server, return_changed_then_ack(changed))
        connection = await connected(server.url())
        channel, _ = await consuming(connection)
        copy = publishing(channel, b"same", {ID: "id-1"})
        async with asyncio.timeout(BOUND_S):
            outcome = await asyncio.gather(copy, return_exceptions=True)
        assert isinstance(outcome[0], ChannelLostError), outcome
        assert "matched no publish" in str(outcome[0])
        async with asyncio.timeout(BOUND_S):
            await server.wait_for("Channel.Close")
        await connection.close()


async def test_a_return_with_a_nan_id_matches_its_publish_by_the_ids_encoded_bytes() -> None:
    """A float NaN is never equal to itself: the id is compared as the bytes it was sent as."""
    async with ScriptedBroker() as server:
        server.on_publish = content_aware(server, return_changed_then_ack({}))
        connection = await connected(server.url())
        channel, _ = await consuming(connection)
        copy = publishing(channel, b"same", {ID: float("nan")})
        async with asyncio.timeout(BOUND_S):
            assert await copy == PublishOutcome.RETURNED
        assert channel.is_open
        await connection.close()
