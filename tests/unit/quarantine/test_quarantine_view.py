"""The rows and filters of `acemq-sidecar quarantine list|replay` (pure: quarantine.rows)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest

from sidecar.quarantine.rows import QuarantinedMessage, Selection, format_rows, row_of
from sidecar.settle.quarantine_format import quarantine_copy
from sidecar.wire import Delivery, Int64

NOW_MS = 1_790_000_060_000


def quarantined(
    headers: dict[str, Any], properties: dict[str, Any] | None = None
) -> QuarantinedMessage:
    original = Delivery(
        delivery_tag=1,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType(properties or {"message_id": "m-1"}),
        headers=MappingProxyType(headers),
        body=b"",
    )
    props, copy = quarantine_copy(
        original, reason="unroutable: no binding", queue="staging.orders", login="sidecar"
    )
    return row_of(position=3, routing_key="orders", properties=props, headers=copy, now_ms=NOW_MS)


def test_a_row_names_the_message_its_route_its_queue_and_why() -> None:
    row = quarantined(
        {
            "x-acemq-id": "ord-9",
            "x-acemq-type": "order.placed",
            "x-acemq-origin": "checkout@app-7",
            "x-acemq-first-seen": Int64(1_790_000_000_000),
        }
    )
    assert row == QuarantinedMessage(
        position=3,
        message_id="ord-9",
        route="orders",
        staging_queue="staging.orders",
        reason="unroutable: no binding",
        origin="checkout@app-7",
        type="order.placed",
        age_s=60.0,
    )


def test_a_plain_apps_message_falls_back_to_its_properties() -> None:
    row = quarantined(
        {},
        {"message_id": "inv-2", "app_id": "billing", "type": "invoice", "timestamp": 1_790_000_000},
    )
    assert (row.message_id, row.origin, row.type, row.age_s) == (
        "inv-2",
        "billing",
        "invoice",
        60.0,
    )


def test_a_row_of_junk_headers_is_all_blanks_never_an_error() -> None:
    row = row_of(
        position=1,
        routing_key="r",
        properties={},
        headers={"x-acemq-id": {"a": 1}, "x-acemq-error": b"\xff", "x-acemq-first-seen": True},
        now_ms=NOW_MS,
    )
    assert (row.message_id, row.staging_queue, row.age_s) == (None, None, None)
    assert row.reason == "\ufffd"


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (Selection(), True),
        (Selection(route="orders"), True),
        (Selection(route="billing"), False),
        (Selection(reason_contains="unroutable"), True),
        (Selection(reason_contains="reserved"), False),
        (Selection(message_id="ord-9"), True),
        (Selection(message_id="ord-1"), False),
        (Selection(route="orders", message_id="ord-1"), False),
    ],
)
def test_a_selection_passes_a_row_only_when_every_filter_matches(
    *, selection: Selection, expected: bool
) -> None:
    assert selection.matches(quarantined({"x-acemq-id": "ord-9"})) is expected


def test_a_reason_filter_never_matches_a_message_without_a_reason() -> None:
    row = row_of(position=1, routing_key="r", properties={}, headers={}, now_ms=NOW_MS)
    assert not Selection(reason_contains="x").matches(row)
    assert Selection(reason_contains="").matches(row)


def test_json_lines_carry_every_field() -> None:
    (line,) = format_rows([quarantined({"x-acemq-id": "ord-9"})], as_json=True)
    assert json.loads(line)["message_id"] == "ord-9"
    assert set(json.loads(line)) == set(QuarantinedMessage.__dataclass_fields__)


def test_the_table_has_a_header_and_bounded_one_line_cells() -> None:
    row = quarantined({"x-acemq-id": "ord-9", "x-acemq-origin": "a\nb" + "o" * 200})
    header, line = format_rows([row], as_json=False)
    assert header.split() == ["#", "ID", "ROUTE", "FROM", "AGE", "TYPE", "ORIGIN", "REASON"]
    assert "\n" not in line
    assert "a b" + "o" * 54 + "..." in line
    assert line.endswith("unroutable: no binding")


@pytest.mark.parametrize(
    ("first_seen_ms", "shown"),
    [
        (NOW_MS - 5_000, "5s"),
        (NOW_MS - 120_000, "2m"),
        (NOW_MS - 7_200_000, "2h"),
        (NOW_MS - 3 * 86_400_000, "3d"),
    ],
)
def test_ages_are_shown_in_the_largest_whole_unit(first_seen_ms: int, shown: str) -> None:
    row = quarantined({"x-acemq-first-seen": Int64(first_seen_ms)})
    assert format_rows([row], as_json=False)[1].split()[4] == shown
