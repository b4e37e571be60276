"""The relay against a real broker: relay, repair, quarantine, audit, fidelity, bounds."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import aiormq.abc
import pytest
from pamqp.commands import Basic

from sidecar.contract import ERROR as ERROR_HEADER
from sidecar.contract.vectors import to_json
from sidecar.observe import metrics
from sidecar.settle import settlement
from sidecar.settle.quarantine_format import QUARANTINED_FROM
from sidecar.wire import (
    ByteArray,
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
)
from tests.brokers import differs_on
from tests.compiled import is_compiled
from tests.integration.conftest import make_topology, route_map_yaml, wait_for
from tests.support import Broker

if TYPE_CHECKING:
    from tests.faults.conftest import RabbitCtl

pytestmark = pytest.mark.integration

FIRST_SEEN = 1_767_323_045_678


def envelope(msg_id: str, **extra: Any) -> dict[str, Any]:
    """A canonical AceMQ envelope, as the Java library writes it."""
    return {
        "x-acemq-id": msg_id,
        "x-acemq-type": "order.placed",
        "x-acemq-version": Int32(1),
        "x-acemq-correlation": msg_id,
        "x-acemq-attempt": Int32(1),
        "x-acemq-first-seen": Int64(FIRST_SEEN),
        **extra,
    }


def headers_of(message: aiormq.abc.DeliveredMessage) -> dict[str, Any]:
    return dict(message.header.properties.headers or {})


def one_route(broker: Broker, topo: Any, **route: Any) -> str:
    return route_map_yaml(
        broker.url,
        topo.quarantine_exchange,
        [{"name": "r1", "from": topo.staging, "exchange": topo.target_exchange} | route],
        mode=route.pop("global_mode", "enforce"),
    )


async def test_canonical_message_is_relayed_unchanged(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A canonical message arrives with the same body and headers, and staging is left empty."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)) as running:
        await broker.publish(
            topo.staging, body=b"\x00\xffbody", headers=envelope("m-1"), message_id="m-1"
        )
        (message,) = await broker.take(topo.target, 1)
        await wait_for(
            lambda: (
                running.sample("acemq_sidecar_messages_total", route="r1", outcome="relayed") == 1
            ),
            what="relayed count",
        )
    assert message.body == b"\x00\xffbody"
    assert to_json(headers_of(message)) == to_json(envelope("m-1"))
    assert message.header.properties.message_id == "m-1"
    assert not isinstance(message.delivery, Basic.GetEmpty)
    assert message.delivery.routing_key == topo.staging  # routing_key: keep
    assert await broker.depth(topo.staging) == 0


async def test_drifted_message_is_repaired_and_counted(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """.NET and Go drift is repaired on the wire and every repair is counted by kind."""
    topo = await make_topology(broker)
    drifted = {
        "x-acemq-id": "",
        "x-acemq-attempt": " 4 ",
        "x-acemq-first-seen": 0,
        "x-acemq-causation": "",
        "x-acemq-replayed-at": "2026-02-03T04:05:06.7891234+00:00",
        "x-tenant": "acme",
    }
    async with run_sidecar(one_route(broker, topo)) as running:
        await broker.publish(
            topo.staging,
            headers=drifted,
            message_id="m-2",
            exchange=topo.staging_exchange,
            routing_key="order.paid",
        )
        (message,) = await broker.take(topo.target, 1)
        await wait_for(
            lambda: (
                running.sample(
                    "acemq_sidecar_violations_total",
                    route="r1",
                    kind="legacy_name",
                    header="x-acemq-replayed-at",
                )
                == 1
            ),
            what="legacy_name counted",
        )
        assert (
            running.sample(
                "acemq_sidecar_violations_total",
                route="r1",
                kind="coerced",
                header="x-acemq-attempt",
            )
            == 1
        )
    headers = headers_of(message)
    assert headers["x-acemq-id"] == "m-2"
    assert type(headers["x-acemq-attempt"]) is Int32
    assert headers["x-acemq-attempt"] == 4
    assert type(headers["x-acemq-first-seen"]) is Int64
    assert headers["x-acemq-first-seen"] > FIRST_SEEN
    assert headers["acemq-replayed-at"] == "2026-02-03T04:05:06.789Z"
    assert "x-acemq-replayed-at" not in headers
    assert "x-acemq-causation" not in headers
    assert headers["x-acemq-type"] == "order.paid"


async def test_app_reserved_header_is_quarantined_with_reason(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Under apps a reserved header sends the original to quarantine, reason and source attached."""
    topo = await make_topology(broker)
    original = {"x-acemq-tenant": "acme", "price": 0.1, "raw": b"\xff\xfe"}
    async with run_sidecar(one_route(broker, topo, publishers="apps")) as running:
        await broker.publish(topo.staging, body=b"payload", headers=original, message_id="q-1")
        (message,) = await broker.take(topo.quarantine, 1)
        await wait_for(
            lambda: (
                running.sample("acemq_sidecar_messages_total", route="r1", outcome="quarantined")
                == 1
            ),
            what="quarantined count",
        )
    headers = headers_of(message)
    assert message.body == b"payload"
    assert not isinstance(message.delivery, Basic.GetEmpty)
    assert message.delivery.routing_key == "r1"
    assert message.header.properties.message_id == "q-1"
    assert '"x-acemq-tenant"' in headers[ERROR_HEADER]
    assert headers[QUARANTINED_FROM] == topo.staging
    assert headers["x-acemq-tenant"] == "acme"
    assert to_json(headers["price"]) == {"$double": 0.1}
    assert headers["raw"] == b"\xff\xfe"
    assert await broker.depth(topo.target) == 0
    assert await broker.depth(topo.staging) == 0


@pytest.mark.version_changed
async def test_unroutable_message_is_quarantined(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A mandatory publish the target cannot route goes to quarantine, not the void."""
    topo = await make_topology(broker, binding="order.#")
    async with run_sidecar(one_route(broker, topo)):
        for msg_id, key in (("u-1", "refund.issued"), ("u-2", "order.placed")):
            await broker.publish(
                topo.staging,
                headers=envelope(msg_id),
                exchange=topo.staging_exchange,
                routing_key=key,
            )
        (quarantined,) = await broker.take(topo.quarantine, 1)
        (relayed,) = await broker.take(topo.target, 1)
    assert headers_of(quarantined)["x-acemq-id"] == "u-1"
    assert "unroutable" in headers_of(quarantined)[ERROR_HEADER]
    assert 'routing key "refund.issued"' in headers_of(quarantined)[ERROR_HEADER]
    assert headers_of(relayed)["x-acemq-id"] == "u-2"


@pytest.mark.version_changed
async def test_returns_are_matched_when_message_ids_repeat(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Redeliveries share a message_id; each returned copy is still matched to its own message."""
    topo = await make_topology(broker, binding="ok.#")
    for i in range(200):  # published before the sidecar starts, so they arrive in a burst
        await broker.publish(
            topo.staging,
            body=str(i).encode(),
            headers=envelope("same"),
            exchange=topo.staging_exchange,
            routing_key="ok.x" if i % 2 else "nope.x",
            message_id="same",
        )
    async with run_sidecar(one_route(broker, topo)):
        relayed = await broker.take(topo.target, 100)
        quarantined = await broker.take(topo.quarantine, 100)
    assert sorted(int(m.body) for m in relayed) == list(range(1, 200, 2))
    assert sorted(int(m.body) for m in quarantined) == list(range(0, 200, 2))


async def test_audit_mode_relays_the_original(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """In audit mode violations are counted but the message goes out exactly as it came in."""
    topo = await make_topology(broker)
    drifted: dict[str, Any] = {
        "x-acemq-attempt": "0",
        "x-acemq-zone": "eu",
        "x-acemq-first-seen": 0,
    }
    async with run_sidecar(one_route(broker, topo, mode="audit", publishers="apps")) as running:
        await broker.publish(topo.staging, headers=drifted, message_id="a-1")
        (message,) = await broker.take(topo.target, 1)
        await wait_for(
            lambda: (
                running.sample("acemq_sidecar_messages_total", route="r1", outcome="audited") == 1
            ),
            what="audited count",
        )
        assert (
            running.sample(
                "acemq_sidecar_violations_total",
                route="r1",
                kind="app_reserved",
                header="x-acemq-*",
            )
            == 1
        )
    assert to_json(headers_of(message)) == to_json({**drifted, "x-acemq-first-seen": Int32(0)})


EVERY_TYPE: dict[str, Any] = {
    "s": "text ünïcode",
    "not-utf8": b"\xc3\x28\xff",
    "bytes": ByteArray(b"\x00\x01\xff"),
    "i8": Int8(-128),
    "u8": UInt8(255),
    "i16": Int16(-32768),
    "u16": UInt16(65535),
    "i32": Int32(-(2**31)),
    "u32": UInt32(2**32 - 1),
    "i64": Int64(2**63 - 1),
    "f32": Float32(1.5),
    "f64": 0.1,
    "dec": Decimal("1.50"),
    "ts": Timestamp(1_767_323_045),
    "yes": True,
    "empty": "",
    "table": {"parent": None, "tags": ["a", None, Int64(3)], "deep": {"x": {"y": Float32(2.0)}}},
    "x-death": [
        {
            "count": Int64(3),
            "reason": "rejected",
            "queue": "orders",
            "time": Timestamp(1_767_323_000),
            "exchange": "",
            "routing-keys": ["orders"],
        }
    ],
}


async def test_every_header_type_survives_the_broker(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Application headers of every AMQP type come out with the same value and the same type.

    All but the unsigned integers, which docs/contract.md section 7 widens to signed tags.
    """
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)):
        await broker.publish(topo.staging, headers=envelope("f-1", **EVERY_TYPE), message_id="f-1")
        (message,) = await broker.take(topo.target, 1)
    headers = headers_of(message)
    widened = {"u8": Int32(255), "u16": Int32(65535), "u32": Int64(2**32 - 1)}
    expected = {**EVERY_TYPE, **widened}
    assert {name: to_json(headers[name]) for name in EVERY_TYPE} == to_json(expected)


async def test_user_id_equal_to_login_passes(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A user_id equal to the sidecar's own login is kept: the broker accepts it."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)):
        await broker.publish(
            topo.staging, headers=envelope("id-1"), message_id="id-1", user_id="guest"
        )
        (message,) = await broker.take(topo.target, 1)
    assert message.header.properties.user_id == "guest"
    assert "acemq-original-user-id" not in headers_of(message)


SIDECAR_USER = "acemq-it-sidecar"


@pytest.fixture(scope="module")
def second_login(rabbitmqctl: RabbitCtl) -> str:
    """A broker user other than guest, so a message's user_id can differ from the sidecar's."""
    ctl = list(rabbitmqctl.command)
    subprocess.run([*ctl, "delete_user", SIDECAR_USER], capture_output=True, check=False)
    for command in (
        [*ctl, "add_user", SIDECAR_USER, "it-secret"],
        [*ctl, "set_permissions", "-p", "/", SIDECAR_USER, ".*", ".*", ".*"],
    ):
        subprocess.run(command, capture_output=True, check=True, timeout=60)
    return SIDECAR_USER


async def test_foreign_user_id_is_moved(
    broker: Broker, run_sidecar: Callable[..., Any], second_login: str
) -> None:
    """A user_id other than the sidecar's login moves to a header, in relay and quarantine."""
    topo = await make_topology(broker)
    url = broker.url.replace("guest:guest@", f"{second_login}:it-secret@")
    text = route_map_yaml(
        url,
        topo.quarantine_exchange,
        [
            {
                "name": "r1",
                "from": topo.staging,
                "exchange": topo.target_exchange,
                "publishers": "apps",
            }
        ],
    )
    async with run_sidecar(text):
        await broker.publish(topo.staging, headers={}, message_id="mv-1", user_id="guest")
        await broker.publish(
            topo.staging, headers={"x-acemq-x": "1"}, message_id="mv-2", user_id="guest"
        )
        (relayed,) = await broker.take(topo.target, 1)
        (quarantined,) = await broker.take(topo.quarantine, 1)
    for message in (relayed, quarantined):
        assert message.header.properties.user_id is None
        assert headers_of(message)["acemq-original-user-id"] == "guest"


async def test_an_id_too_long_for_message_id_is_relayed_in_its_header(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Contract section 2: a 300-byte id travels in x-acemq-id; message_id stays as it came."""
    topo = await make_topology(broker)
    long_id = "x" * 300
    async with run_sidecar(one_route(broker, topo)):
        await broker.publish(topo.staging, headers=envelope(long_id), message_id="short")
        (message,) = await broker.take(topo.target, 1)
    assert headers_of(message)["x-acemq-id"] == long_id
    assert message.header.properties.message_id == "short"


@pytest.mark.skipif(
    is_compiled(metrics),
    reason="replaces a method, which a compiled class does not let be replaced; plain runs it",
)
async def test_prefetch_bounds_in_flight_and_work_is_pipelined(
    broker: Broker, run_sidecar: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-flight messages never exceed prefetch, and more than one is in flight at a time."""
    from sidecar.observe.metrics import Metrics  # noqa: PLC0415

    peak = {"now": 0, "max": 0}
    original = Metrics.add_in_flight

    def record(self: Metrics, route: str, delta: int) -> None:
        peak["now"] += delta
        peak["max"] = max(peak["max"], peak["now"])
        original(self, route, delta)

    monkeypatch.setattr(Metrics, "add_in_flight", record)
    topo = await make_topology(broker)
    for i in range(400):
        await broker.publish(topo.staging, headers=envelope(f"p-{i}"), message_id=f"p-{i}")
    async with run_sidecar(one_route(broker, topo, prefetch=8)):
        await broker.take(topo.target, 400, timeout_s=60)
    assert peak["now"] == 0
    assert 2 <= peak["max"] <= 8, peak


async def test_missing_exchange_pauses_only_its_route(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A route whose target is missing waits in staging and fails readiness; the other flows."""
    good = await make_topology(broker, "good")
    staging = await broker.queue("staging.paused")
    missing = broker.name("not-yet")
    text = route_map_yaml(
        broker.url,
        good.quarantine_exchange,
        [
            {"name": "good", "from": good.staging, "exchange": good.target_exchange},
            {"name": "paused", "from": staging, "exchange": missing},
        ],
    )
    async with run_sidecar(text, ready=False) as running:
        service = running.service
        # The route is named "paused", so wait for the reason itself, not the word.
        await wait_for(
            lambda: f'exchange "{missing}" does not exist' in service.readiness().detail,
            what="paused route reported",
        )
        await broker.publish(staging, headers=envelope("w-1"))
        await broker.publish(good.staging, headers=envelope("g-1"))
        await broker.take(good.target, 1)
        assert running.sample("acemq_sidecar_route_up", route="paused") == 0
        assert running.sample("acemq_sidecar_route_up", route="good") == 1
        assert await broker.depth(staging) == 1
        await broker.exchange("not-yet")
        out = await broker.queue("out.not-yet")
        await broker.bind(out, missing)
        (message,) = await broker.take(out, 1, timeout_s=40)
        await wait_for(lambda: service.readiness().ok, timeout_s=40, what="ready again")
    assert headers_of(message)["x-acemq-id"] == "w-1"


async def test_reload_adds_a_route_and_refuses_an_invalid_map(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A valid new map starts its new route; an invalid one is refused, the old one runs on."""
    first = await make_topology(broker, "one")
    second = await make_topology(broker, "two")
    routes: list[dict[str, Any]] = [
        {"name": "one", "from": first.staging, "exchange": first.target_exchange}
    ]
    async with run_sidecar(
        route_map_yaml(broker.url, first.quarantine_exchange, routes)
    ) as running:
        routes[0]["prefetch"] = 7  # route one restarts under the new map
        routes.append({"name": "two", "from": second.staging, "exchange": second.target_exchange})
        running.path.write_text(route_map_yaml(broker.url, first.quarantine_exchange, routes))
        running.service.request_reload()
        await wait_for(
            lambda: running.sample("acemq_sidecar_config_reloads_total", result="applied") == 1,
            what="reload applied",
        )
        await broker.publish(second.staging, headers=envelope("two-1"))
        await broker.take(second.target, 1)
        await broker.publish(first.staging, headers=envelope("one-0"))
        await broker.take(first.target, 1)
        await asyncio.sleep(0.2)  # the old worker of route one has drained and gone
        assert running.sample("acemq_sidecar_route_up", route="one") == 1
        assert running.service.readiness().ok
        running.path.write_text("routes: [{name: x, frm: y}]\n")
        running.service.request_reload()
        await wait_for(
            lambda: running.sample("acemq_sidecar_config_reloads_total", result="refused") == 1,
            what="reload refused",
        )
        await broker.publish(first.staging, headers=envelope("one-1"))
        await broker.publish(second.staging, headers=envelope("two-2"))
        await broker.take(first.target, 1)
        await broker.take(second.target, 1)
        await asyncio.sleep(0)


async def test_deleted_staging_queue_pauses_then_resumes(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A consumer the broker cancels (queue deleted) pauses the route instead of idling as up."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)) as running:
        service = running.service
        await broker.channel.queue_delete(topo.staging)
        await wait_for(
            lambda: f'queue "{topo.staging}" does not exist' in service.readiness().detail,
            what="paused on the deleted queue",
        )
        assert running.sample("acemq_sidecar_route_up", route="r1") == 0
        await broker.channel.queue_declare(topo.staging, durable=True)
        await broker.publish(topo.staging, headers=envelope("back-1"))
        (message,) = await broker.take(topo.target, 1, timeout_s=40)
        await wait_for(lambda: service.readiness().ok, timeout_s=5, what="ready")
    assert headers_of(message)["x-acemq-id"] == "back-1"


@pytest.mark.skipif(
    is_compiled(settlement),
    reason="replaces a function compiled code binds early; plain runs it, and the unit suite's"
    " planning-bug test covers the compiled build",
)
async def test_internal_error_quarantines_instead_of_spinning(
    broker: Broker, run_sidecar: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug on one message quarantines it with the error; the route goes on with the next."""
    from sidecar.contract import normalise as real  # noqa: PLC0415

    def flaky(routing_key: str, properties: Any, headers: Any, **kwargs: Any) -> Any:
        if headers.get("x-acemq-id") == "bug-1":
            raise RuntimeError("boom")
        return real(routing_key, properties, headers, **kwargs)

    monkeypatch.setattr("sidecar.settle.settlement.normalise", flaky)
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)) as running:
        await broker.publish(topo.staging, headers=envelope("bug-1"))
        await broker.publish(topo.staging, headers=envelope("ok-1"))
        (quarantined,) = await broker.take(topo.quarantine, 1)
        (relayed,) = await broker.take(topo.target, 1)
        await wait_for(
            lambda: (
                running.sample("acemq_sidecar_messages_total", route="r1", outcome="quarantined")
                == 1
            ),
            what="quarantined count",
        )
    assert headers_of(quarantined)[ERROR_HEADER] == "internal error: RuntimeError('boom')"
    assert headers_of(relayed)["x-acemq-id"] == "ok-1"
    assert await broker.depth(topo.staging) == 0


async def test_quarantine_that_does_not_route_holds_and_retries_in_place(
    broker: Broker, run_sidecar: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quarantine nobody can receive pauses the route without reopening (requeueing) it."""
    from sidecar.amqp import Connection  # noqa: PLC0415

    opens = {"count": 0}
    real_channel = Connection.channel

    async def counting_channel(self: Connection, *, prefetch: int) -> Any:
        opens["count"] += 1
        return await real_channel(self, prefetch=prefetch)

    monkeypatch.setattr(Connection, "channel", counting_channel)
    staging = await broker.queue("staging.hold")
    target = await broker.exchange("target.hold")
    quarantine = await broker.exchange("quarantine.unbound", "fanout")
    text = route_map_yaml(
        broker.url,
        quarantine,
        [{"name": "r1", "from": staging, "exchange": target, "publishers": "apps"}],
    )
    async with run_sidecar(text) as running:
        await broker.publish(staging, headers={"x-acemq-tenant": "acme"}, message_id="h-1")
        await wait_for(
            lambda: "quarantine" in running.service.readiness().detail, what="paused on quarantine"
        )
        await asyncio.sleep(2)  # long enough for several retries
        # One open of the route: its consume channel and its publish channel.
        assert opens["count"] == 2, "the route reopened (and requeued) instead of retrying"
        held = await broker.queue("quarantined.late")
        await broker.bind(held, quarantine, "")
        (message,) = await broker.take(held, 1, timeout_s=40)
        await wait_for(lambda: running.service.readiness().ok, timeout_s=10, what="resumed")
        assert running.sample("acemq_sidecar_route_up", route="r1") == 1
    assert headers_of(message)["x-acemq-tenant"] == "acme"
    assert await broker.depth(staging) == 0


async def test_slow_confirm_is_reported_and_never_resent(
    broker: Broker, run_sidecar: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A confirm slower than the limit pauses the route on /readyz; the copy is sent once."""
    import sidecar.relay.publisher  # noqa: PLC0415
    from tests.lag_proxy import LagProxy  # noqa: PLC0415

    monkeypatch.setattr(sidecar.relay.publisher, "CONFIRM_TIMEOUT_S", 0.2)
    topo = await make_topology(broker)
    async with LagProxy(broker.url) as proxy:
        text = one_route(broker, topo).replace(broker.url, proxy.proxied_url)
        async with run_sidecar(text) as running:
            proxy.lag_s = 1.0  # the broker under an alarm, as the sidecar sees it
            await broker.publish(topo.staging, headers=envelope("slow-1"))
            await wait_for(
                lambda: "no confirm" in running.service.readiness().detail, what="slowness reported"
            )
            await wait_for(lambda: running.service.readiness().ok, what="resumed")
            arrived = await broker.take(topo.target, 1)
            await asyncio.sleep(0.5)
            arrived += await broker.drain(topo.target)
    assert [headers_of(m)["x-acemq-id"] for m in arrived] == ["slow-1"]
    assert await broker.depth(topo.staging) == 0


async def test_copy_that_would_loop_into_staging_is_quarantined(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Default exchange with routing_key keep would send a message back to its own queue."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo, exchange='""')):
        await broker.publish(topo.staging, headers=envelope("loop-1"))
        (message,) = await broker.take(topo.quarantine, 1)
    assert "back into staging" in headers_of(message)[ERROR_HEADER]
    assert await broker.depth(topo.staging) == 0


async def test_quarantine_keeps_the_envelope_error(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """The library's own x-acemq-error survives quarantine under acemq-original-error."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo, publishers="apps")):
        await broker.publish(
            topo.staging, headers={"x-acemq-error": "timeout", "x-acemq-x": "1"}, message_id="e-1"
        )
        (message,) = await broker.take(topo.quarantine, 1)
    assert headers_of(message)["acemq-original-error"] == "timeout"
    assert '"x-acemq-x"' in headers_of(message)[ERROR_HEADER]


async def test_route_stays_paused_while_any_delivery_is_held(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """Other messages flowing do not hide a held one: /readyz stays 503 until it is taken."""
    topo = await make_topology(broker, binding="y.#")
    full = await broker.queue("out.full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    await broker.bind(full, topo.target_exchange, "x.#")
    await broker.publish(full, headers={}, body=b"filler")  # the queue is full from the start
    async with run_sidecar(one_route(broker, topo)) as running:
        service = running.service
        await broker.publish(
            topo.staging, headers=envelope("x-1"), exchange=topo.staging_exchange, routing_key="x.1"
        )
        await wait_for(lambda: "nacked" in service.readiness().detail, what="held on a nack")
        for i in range(5):
            await broker.publish(
                topo.staging,
                headers=envelope(f"y-{i}"),
                exchange=topo.staging_exchange,
                routing_key="y.1",
            )
        await broker.take(topo.target, 5)
        assert not service.readiness().ok, "a held delivery was hidden by the flowing ones"
        await broker.drain(full)  # room again: the held copy goes through on its next retry
        (held,) = await broker.take(full, 1, timeout_s=40)
        await wait_for(lambda: service.readiness().ok, timeout_s=10, what="resumed")
    assert headers_of(held)["x-acemq-id"] == "x-1"
    assert await broker.depth(topo.staging) == 0


async def test_target_exchange_deleted_while_running_pauses_the_route(
    broker: Broker, run_sidecar: Callable[..., Any]
) -> None:
    """A publish to an exchange deleted under the route says what to create; nothing is lost."""
    topo = await make_topology(broker)
    async with run_sidecar(one_route(broker, topo)) as running:
        service = running.service
        await broker.channel.exchange_delete(topo.target_exchange)
        await broker.publish(topo.staging, headers=envelope("gone-1"))
        await wait_for(
            lambda: (
                f'exchange "{topo.target_exchange}" does not exist' in service.readiness().detail
            ),
            what="paused on the deleted exchange",
        )
        await broker.channel.exchange_declare(
            topo.target_exchange, exchange_type="topic", durable=True
        )
        await broker.bind(topo.target, topo.target_exchange)
        (message,) = await broker.take(topo.target, 1, timeout_s=40)
        await wait_for(lambda: service.readiness().ok, timeout_s=10, what="resumed")
    assert headers_of(message)["x-acemq-id"] == "gone-1"


async def test_stop_does_not_wait_for_a_broker_that_never_answers(
    run_sidecar: Callable[..., Any],
) -> None:
    """SIGTERM while a route's opening handshake hangs (a broker alarm) still exits at once."""
    from tests.scripted_broker import ScriptedBroker, silent  # noqa: PLC0415

    async with ScriptedBroker(answers={"Queue.Declare": silent}) as server:
        text = route_map_yaml(
            server.url(), "quarantine", [{"name": "r1", "from": "staging", "exchange": "out"}]
        )
        async with run_sidecar(text, ready=False) as running:
            await wait_for(lambda: running.service.readiness().detail == "route r1: starting")
            await server.wait_for("Queue.Declare")
            started = asyncio.get_running_loop().time()
            running.service.request_stop()
            async with asyncio.timeout(5):
                assert await asyncio.shield(running.task) == 0
            assert asyncio.get_running_loop().time() - started < 5


async def test_at_the_smallest_frame_size_a_long_reject_still_reaches_quarantine(
    broker: Broker, run_sidecar: Callable[..., Any], request: pytest.FixtureRequest
) -> None:
    """4 KiB frames: neither the original headers with the reason, nor the whole reason fit."""
    differs_on(
        request,
        ("4.3",),
        "RabbitMQ 4.3.6 resets a connection that asks for frame_max=4096"
        " (under its 8,192-byte minimum): the sidecar never connects",
        raises=pytest.fail.Exception,  # "timed out after 15.0s waiting for readiness"
    )
    topo = await make_topology(broker)
    # 85 names of 40 bytes: the table just fits a 4 KiB frame; the reason naming them all
    # and why the original headers were left out does not.
    names = {f"x-acemq-{'f' * 28}{i:04}": "v" for i in range(85)}
    small_frames = f"{broker.url}?frame_max=4096"  # the least a broker may offer
    text = one_route(broker, topo, publishers="apps").replace(broker.url, small_frames)
    async with run_sidecar(text) as running:
        await broker.publish(topo.staging, body=b"payload", headers=names, message_id="big-1")
        (message,) = await broker.take(topo.quarantine, 1)
        await wait_for(lambda: running.service.readiness().ok, what="still ready")
    reason = headers_of(message)[ERROR_HEADER]
    assert f"x-acemq-{'f' * 28}0000" in reason
    assert "the original headers could not be written" in reason
    assert message.body == b"payload"
    assert await broker.depth(topo.staging) == 0


@pytest.mark.version_changed("4.3")
async def test_a_url_asking_for_4_kib_frames_is_told_to_ask_for_8_on_4_3(
    broker: Broker,
    run_sidecar: Callable[..., Any],
    broker_version: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RabbitMQ 4.1+ ends such a connection: the log names frame_max and the least it takes."""
    if broker_version != "4.3":
        pytest.skip("3.10 and 4.0 take 4,096-byte frames (the test above relays with them)")
    topo = await make_topology(broker)
    small_frames = f"{broker.url}?frame_max=4096"
    text = one_route(broker, topo).replace(broker.url, small_frames)
    caplog.set_level(logging.WARNING, logger="sidecar")

    def told() -> bool:
        return any(
            "frame_max=4096" in record.getMessage() and "less than 8192" in record.getMessage()
            for record in caplog.records
        )

    async with run_sidecar(text, ready=False) as running:
        await wait_for(told, what="the connect error naming frame_max")
        assert not running.service.readiness().ok
