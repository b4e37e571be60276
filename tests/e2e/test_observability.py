"""What an operator sees of a running sidecar: /metrics counts, /readyz, the violation log.

The sidecar runs as users run it (``python -m sidecar run --config FILE``) against the
real broker. Expected counts come from the script itself: outcomes by hand, violations
from ``sidecar.contract.normalise`` per message plus hand-derived anchors, never from the
sidecar under test.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from sidecar import __version__
from sidecar.broker import BrokerAddress
from sidecar.contract import CONTRACT_VERSION, Publishers
from sidecar.observe.metrics import DRIFT_VIOLATIONS
from tests.e2e.conftest import (
    Flow,
    Sidecar,
    declare_flow,
    declare_quarantine,
    declare_target,
    eventually,
    take_until,
)
from tests.e2e.observe import (
    Sample,
    ShortLogIntervalSidecar,
    expected_violations,
    json_lines,
    labelled,
    publish_sample,
    samples,
    series,
    stdout_of,
)
from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

P = "acemq_sidecar_"
FIRST_SEEN = 1_767_323_045_678
ORDERS_ORIGIN = "orders@sidecar"
SETTLE_TIMEOUT_S = 30.0

# orders: publishers acemq, target bound to order.# only (refund.* is unroutable).
ORDERS = [
    Sample(
        "java-canonical",
        "order.placed",
        {
            "x-acemq-id": "{id}",
            "x-acemq-type": "order.placed",
            "x-acemq-version": 2,
            "x-acemq-correlation": "{id}",
            "x-acemq-attempt": 1,
            "x-acemq-first-seen": FIRST_SEEN,
            "x-acemq-origin": "checkout@app-7",
            "x-tenant": "acme",
        },
        {"message_id": "{id}"},
        count=3,
    ),
    Sample(
        "dotnet-drift",
        "order.paid",
        {
            "x-acemq-id": "",
            "x-acemq-type": "order.paid",
            "x-acemq-version": " 3 ",
            "x-acemq-attempt": 0,
            "x-acemq-first-seen": 0,
            "x-acemq-causation": "",
        },
        {"message_id": "{id}"},
        count=2,
    ),
    Sample(
        "legacy-replay",
        "order.placed",
        {
            "x-acemq-id": "{id}",
            "x-acemq-type": "order.placed",
            "x-acemq-version": 1,
            "x-acemq-correlation": "{id}",
            "x-acemq-attempt": 1,
            "x-acemq-first-seen": FIRST_SEEN,
            "x-acemq-replayed-from": "orders.dlq",
            "x-acemq-replayed-at": "2026-02-03T04:05:06.7891234+00:00",
            "x-acemq-replay-count": 2,
        },
        {"message_id": "{id}"},
    ),
    Sample(
        "newer-library",
        "order.shipped",
        {"x-acemq-id": "{id}", "x-acemq-zone": "eu-west", "x-tenant": "acme"},
        {"message_id": "{id}"},
        count=4,
    ),
    Sample("unroutable", "refund.issued", {"x-acemq-id": "{id}"}, {"message_id": "{id}"}, count=2),
]
# invoices: publishers apps, target bound to everything.
INVOICES = [
    Sample(
        "plain-app",
        "invoice.issued",
        {"x-customer": "c-17"},
        {
            "message_id": "{id}",
            "correlation_id": "cart-9",
            "type": "invoice.issued",
            "app_id": "billing",
        },
        count=3,
    ),
    Sample(
        "app-reserved",
        "invoice.voided",
        {"x-acemq-tenant": "acme", "x-acemq-zone": "eu-west"},
        {"message_id": "{id}"},
        count=2,
    ),
    Sample("bare", "invoice.paid", {}, {"message_id": "{id}"}),
]
# Outcomes, by hand: apps rejects and unroutable keys are quarantined, the rest relayed.
OUTCOMES = {
    ("orders", "relayed"): 3 + 2 + 1 + 4,
    ("orders", "quarantined"): 2,
    ("orders", "audited"): 0,
    ("invoices", "relayed"): 3 + 1,
    ("invoices", "quarantined"): 2,
    ("invoices", "audited"): 0,
}
# Violations derived by hand from docs/contract.md for a few (route, kind, header) triples.
HAND_DERIVED = {
    ("orders", "legacy_name", "x-acemq-replayed-from"): 1,
    ("orders", "legacy_name", "x-acemq-replayed-at"): 1,
    ("orders", "legacy_name", "x-acemq-replay-count"): 1,
    ("orders", "unknown_reserved", "x-acemq-*"): 4,
    ("orders", "empty_value", "x-acemq-id"): 2,
    ("orders", "empty_value", "x-acemq-causation"): 2,
    ("orders", "coerced", "x-acemq-version"): 2,
    ("orders", "out_of_range", "x-acemq-attempt"): 2,
    ("orders", "out_of_range", "x-acemq-first-seen"): 2,
    ("invoices", "app_reserved", "x-acemq-*"): 2 * 2,  # two reserved names, two messages
    # Filled from the "type" property (3 plain-app) or defaulted (1 bare): both count (section 6).
    ("invoices", "defaulted", "x-acemq-type"): 3 + 1,
}


async def declare_routes(broker: Broker) -> tuple[str, str, str, Flow, Flow]:
    """Declare both routes behind one staging exchange; return it, quarantine and flows."""
    quarantine, quarantined = await declare_quarantine(broker)
    stage = await broker.exchange("stage")
    orders_staging = await broker.queue("orders.staging")
    orders_exchange = await broker.exchange("orders.exchange")
    orders_target = await broker.queue("orders.target")
    await broker.bind(orders_target, orders_exchange, "order.#")
    for key in ("order.#", "refund.#"):
        await broker.bind(orders_staging, stage, key)
    orders = Flow("orders", orders_staging, orders_exchange, orders_target)
    invoices = await declare_flow(broker, "invoices")
    await broker.bind(invoices.staging, stage, "invoice.#")
    return stage, quarantine, quarantined, orders, invoices


def write_route_map(sidecar: Sidecar, *, quarantine: str, orders: Flow, invoices: Flow) -> None:
    route_map = sidecar.route_map(quarantine=quarantine, flows=[orders, invoices])
    orders_route, invoices_route = route_map["routes"]
    orders_route.update(publishers="acemq", origin=ORDERS_ORIGIN)
    invoices_route.update(publishers="apps")
    sidecar.write(route_map)


async def test_metrics_count_exactly_what_a_scripted_mix_carried(
    broker: Broker, sidecar: Sidecar
) -> None:
    """Every counter, per route, outcome, kind and header, is exactly what the script implies."""
    stage, quarantine, quarantined, orders, invoices = await declare_routes(broker)
    write_route_map(sidecar, quarantine=quarantine, orders=orders, invoices=invoices)
    orders_expected, orders_rejects = expected_violations(
        ORDERS, route="orders", publishers=Publishers.ACEMQ, origin=ORDERS_ORIGIN
    )
    invoices_expected, invoices_rejects = expected_violations(
        INVOICES, route="invoices", publishers=Publishers.APPS, origin=None
    )
    expected = orders_expected + invoices_expected
    # The two derivations agree before the sidecar is asked anything.
    assert {key: expected[key] for key in HAND_DERIVED} == HAND_DERIVED
    assert (orders_rejects, invoices_rejects) == (0, 2)
    await sidecar.start()

    for sample in [*ORDERS, *INVOICES]:
        await publish_sample(broker, sample, exchange=stage)
    total = sum(OUTCOMES.values())

    async def all_settled() -> bool:
        scrape = samples(await sidecar.metrics_text())
        return sum(series(scrape, P + "messages_total").values()) >= total

    await eventually(
        all_settled, timeout_s=SETTLE_TIMEOUT_S, what=f"{total} messages", context=sidecar.output
    )
    await asyncio.sleep(0.5)  # nothing more may come: a late count would show below
    text = await sidecar.metrics_text()
    scrape = samples(text)

    assert labelled(scrape, P + "messages_total", "route", "outcome") == OUTCOMES
    violations = labelled(scrape, P + "violations_total", "route", "kind", "header")
    counted = {key: value for key, value in violations.items() if value}
    assert counted == dict(expected), (
        f"counted but not expected: {set(counted.items()) - set(expected.items())}\n"
        f"expected but not counted: {set(expected.items()) - set(counted.items())}"
    )
    for route in ("orders", "invoices"):  # the drift series exist, at zero where nothing drifted
        for kind, header in DRIFT_VIOLATIONS:
            assert (route, kind, header) in violations
    route_totals = Counter[str]()
    for (route, _), count in OUTCOMES.items():
        route_totals[route] += count
    assert labelled(scrape, P + "relay_seconds_count", "route") == {
        (route,): float(count) for route, count in route_totals.items()
    }
    assert labelled(scrape, P + "in_flight", "route") == {("orders",): 0, ("invoices",): 0}
    assert labelled(scrape, P + "route_up", "route") == {("orders",): 1, ("invoices",): 1}
    assert scrape[(P + "broker_connected", ())] == 1
    assert scrape[(P + "reconnects_total", ())] == 0
    assert labelled(scrape, P + "config_reloads_total", "result") == {
        ("applied",): 0,
        ("refused",): 0,
    }
    assert labelled(scrape, P + "build_info", "version", "contract") == {
        (__version__, CONTRACT_VERSION): 1
    }

    # Bounded labels: no message id, no raw reserved name, no hostname anywhere.
    values = {value for _, labels in scrape for _, value in labels}
    ids = {properties["message_id"] for s in [*ORDERS, *INVOICES] for properties, _ in s.messages()}
    forbidden = ids | {"x-acemq-zone", "x-acemq-tenant", socket.gethostname()}
    assert not values & forbidden, values & forbidden

    # OpenMetrics, for a scraper that asks for it, carries the same counts.
    status, body, content_type = await openmetrics(sidecar)
    assert status == 200
    assert content_type.startswith("application/openmetrics-text"), content_type
    relayed = {
        (sample.labels["route"], sample.labels["outcome"]): sample.value
        for family in openmetrics_families(body)
        if family.name == P + "messages"
        for sample in family.samples
        if sample.name == P + "messages_total"
    }
    assert relayed == OUTCOMES

    # The messages went where the outcomes say.
    assert await broker.depth(orders.target) == OUTCOMES["orders", "relayed"]
    assert await broker.depth(invoices.target) == OUTCOMES["invoices", "relayed"]
    assert await broker.depth(quarantined) == (
        OUTCOMES["orders", "quarantined"] + OUTCOMES["invoices", "quarantined"]
    )
    # Logs are JSON lines on stderr (not a terminal here); `run` prints nothing on stdout.
    assert json_lines(sidecar.stderr()), sidecar.output()
    assert stdout_of(sidecar) == ""


async def openmetrics(sidecar: Sidecar) -> tuple[int, str, str]:
    """GET /metrics asking for OpenMetrics; return status, body and content type."""
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
    writer.write(
        b"GET /metrics HTTP/1.0\r\n"
        b"Accept: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n\r\n"
    )
    await writer.drain()
    async with asyncio.timeout(5):
        response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), body.decode(), headers["Content-Type"]


async def test_readyz_names_the_route_whose_exchange_was_deleted_until_it_is_back(
    broker: Broker, sidecar: Sidecar
) -> None:
    """Deleting a target exchange turns /readyz 503 naming that route; re-creating it, 200."""
    stage, quarantine, quarantined, orders, invoices = await declare_routes(broker)
    write_route_map(sidecar, quarantine=quarantine, orders=orders, invoices=invoices)
    await sidecar.start()
    status, body = await sidecar.get("/readyz")
    assert status == 200, body
    assert json.loads(body) == {
        "ready": True,
        "broker": "connected",
        "node": BrokerAddress.parse(sidecar.amqp_url).masked(),  # the password never shown
        "routes": {"orders": "consuming", "invoices": "consuming"},
    }

    await broker.channel.exchange_delete(orders.exchange)
    # The route learns of it when it next publishes there: a message arrives.
    await broker.publish(
        "", exchange=stage, routing_key="order.placed", headers={"x-acemq-id": "after-delete"}
    )
    last: tuple[int, str] = (0, "")

    async def orders_down(because: str) -> bool:
        nonlocal last
        last = await sidecar.get("/readyz")
        return last[0] == 503 and because in json.loads(last[1])["routes"]["orders"]

    # First the broker's own words (the channel it closed), naming the exchange ...
    await eventually(
        lambda: orders_down(orders.exchange),
        timeout_s=SETTLE_TIMEOUT_S,
        what="/readyz 503 naming the deleted exchange",
        context=lambda: f"last /readyz: {last}\n{sidecar.output()}",
    )
    # ... then, once the route re-checked its topology, what to do about it.
    missing = f'exchange "{orders.exchange}" does not exist; create it'
    await eventually(
        lambda: orders_down(missing),
        timeout_s=SETTLE_TIMEOUT_S,
        what="/readyz saying the exchange does not exist",
        context=lambda: f"last /readyz: {last}\n{sidecar.output()}",
    )
    report = json.loads(last[1])
    assert report["ready"] is False
    assert report["broker"] == "connected"
    assert report["routes"]["invoices"] == "consuming"
    assert await sidecar.metric(P + "route_up", route="orders") == 0
    assert await sidecar.metric(P + "route_up", route="invoices") == 1
    assert (await sidecar.get("/healthz"))[0] == 200  # not ready is not dead

    await declare_target(broker, exchange=orders.exchange, target=orders.target)
    await broker.bind(orders.target, orders.exchange, "order.#")
    declared = time.monotonic()
    await sidecar.wait_ready(timeout_s=SETTLE_TIMEOUT_S)
    print(f"ready again {time.monotonic() - declared:.1f}s after the exchange came back")  # noqa: T201
    status, body = await sidecar.get("/readyz")
    assert (status, json.loads(body)["routes"]["orders"]) == (200, "consuming")
    # The message held in staging meanwhile went through, not to quarantine.
    await take_until(
        broker, orders.target, ["after-delete"], timeout_s=SETTLE_TIMEOUT_S, context=sidecar.output
    )
    assert await broker.depth(quarantined) == 0


FLOOD = 10_000
LOG_INTERVAL_S = 2.0
FLOOD_HEADERS = {
    "x-acemq-id": "{id}",
    "x-acemq-type": "order.placed",
    "x-acemq-version": 1,
    "x-acemq-correlation": "{id}",
    "x-acemq-attempt": 1,
    "x-acemq-first-seen": FIRST_SEEN,
    "x-acemq-origin": "checkout@app-7",
    "x-acemq-zone": "eu-west",  # the one violation: unknown_reserved on x-acemq-*
}


@pytest.mark.timeout(150)
async def test_a_flood_of_one_violation_logs_a_handful_of_lines_and_the_count(
    broker: Broker, tmp_path: Path, amqp_url: str
) -> None:
    """10,000 identical violations: a few log lines, and together they account for all of them.

    The violation log interval is cut from 60 s to 2 s so that the line after the flood,
    which carries the suppressed count, comes within the test.
    """
    parts = [
        Sample(f"flood{n}", "order.placed", FLOOD_HEADERS, {"message_id": "{id}"}, count=500)
        for n in range(FLOOD // 500)
    ]
    last = Sample("last", "order.placed", FLOOD_HEADERS, {"message_id": "{id}"})
    counts, _ = expected_violations(
        parts, route="orders", publishers=Publishers.ACEMQ, origin=ORDERS_ORIGIN
    )
    key = ("orders", "unknown_reserved", "x-acemq-*")
    assert counts == {key: FLOOD}, counts  # one violation per message, nothing else

    sidecar = ShortLogIntervalSidecar(
        amqp_url=amqp_url, workdir=tmp_path, interval_s=LOG_INTERVAL_S
    )
    try:
        stage, quarantine, _, orders, invoices = await declare_routes(broker)
        write_route_map(sidecar, quarantine=quarantine, orders=orders, invoices=invoices)
        await sidecar.start()
        started = time.monotonic()
        for part in parts:
            await publish_sample(broker, part, exchange=stage)

        async def relayed(count: int) -> bool:
            return await sidecar.metric(P + "messages_total", route="orders") >= count

        await eventually(
            lambda: relayed(FLOOD),
            timeout_s=90,
            what="the flood relayed",
            context=sidecar.output,
        )
        took = time.monotonic() - started
        lines = violation_lines(sidecar)
        # At most one line per interval (and the first at once) while the flood ran.
        assert 1 <= len(lines) <= took / LOG_INTERVAL_S + 2, (len(lines), took)
        first = lines[0]
        assert {k: first[k] for k in ("route", "kind", "header", "suppressed")} == {
            "route": "orders",
            "kind": "unknown_reserved",
            "header": "x-acemq-*",
            "suppressed": 0,
        }
        assert first["names"] == "x-acemq-zone"
        assert first["origin"] == "checkout@app-7"
        assert first["message_id"] == "flood0-0"  # the first consumed

        await asyncio.sleep(LOG_INTERVAL_S + 0.5)  # the next violation is let through
        await publish_sample(broker, last, exchange=stage)
        await eventually(
            lambda: any(line["message_id"] == "last-0" for line in violation_lines(sidecar)),
            timeout_s=SETTLE_TIMEOUT_S,
            what="the line after the flood",
            context=sidecar.output,
        )
        lines = violation_lines(sidecar)
        assert lines[-1]["message_id"] == "last-0"
        assert lines[-1]["suppressed"] > 0
        # Every violation is a line or counted in a later line's suppressed field.
        assert len(lines) + sum(line["suppressed"] for line in lines) == FLOOD + 1, [
            (line["message_id"], line["suppressed"]) for line in lines
        ]
        assert stdout_of(sidecar) == ""
    finally:
        await sidecar.kill()


def violation_lines(sidecar: Sidecar) -> list[dict[str, Any]]:
    """The JSON log lines the relay wrote for violations of the orders route."""
    return [
        record
        for record in json_lines(sidecar.stderr())
        if record.get("kind") == "unknown_reserved" and record.get("route") == "orders"
    ]


async def test_a_stop_logs_what_the_rate_limit_held_back(broker: Broker, sidecar: Sidecar) -> None:
    """Five identical violations in one interval: one line, then "4 more" when it stops."""
    few = Sample("few", "order.placed", FLOOD_HEADERS, {"message_id": "{id}"}, count=5)
    stage, quarantine, _, orders, invoices = await declare_routes(broker)
    write_route_map(sidecar, quarantine=quarantine, orders=orders, invoices=invoices)
    await sidecar.start()
    await publish_sample(broker, few, exchange=stage)

    async def relayed() -> bool:
        return await sidecar.metric(P + "messages_total", route="orders") >= few.count

    await eventually(
        relayed, timeout_s=SETTLE_TIMEOUT_S, what="five relayed", context=sidecar.output
    )
    sidecar.send(signal.SIGTERM)
    assert await sidecar.wait_exit(timeout_s=30) == 0, sidecar.output()
    lines = violation_lines(sidecar)
    assert [line["suppressed"] for line in lines] == [0, 4], lines
    assert (
        lines[-1]["msg"] == "route orders: 4 more unknown_reserved on x-acemq-* since the last line"
    )
