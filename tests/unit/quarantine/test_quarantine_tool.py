"""The decisions of `quarantine replay` and the command line's refusals, without a broker."""

from __future__ import annotations

import io
from collections import Counter
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.cli import main
from sidecar.quarantine.reader import CHANNELS_TARGET, PREFETCH_MAX, window_for
from sidecar.quarantine.tool import (
    Progress,
    ReadReport,
    Replay,
    ReplayReport,
    Unreplayable,
    plan_replay,
)
from sidecar.settle.quarantine_format import quarantine_copy
from sidecar.wire import (
    ByteArray,
    Delivery,
    FieldValue,
    Float32,
    Int32,
    UndecodableTable,
    UnreadHeader,
)

NOW_MS = 1_790_000_000_123  # 2026-09-21T14:13:20.123Z


def delivery(
    headers: dict[str, Any],
    *,
    properties: dict[str, Any] | None = None,
    undecodable: UndecodableTable | None = None,
) -> Delivery:
    return Delivery(
        delivery_tag=1,
        exchange="",
        routing_key="orders",
        redelivered=False,
        properties=MappingProxyType(properties or {"message_id": "m-1"}),
        headers=MappingProxyType(headers),
        body=b"body",
        undecodable=undecodable,
    )


def copy_of(headers: dict[str, Any], *, reason: str = "unroutable: x") -> Delivery:
    """The quarantine copy the relay makes of an original with these headers."""
    properties, copy = quarantine_copy(
        delivery(headers), reason=reason, queue="staging.orders", login="guest"
    )
    return delivery(copy, properties=properties)


def test_a_replay_is_the_original_stamped_once() -> None:
    """Quarantine headers off, every application header kept with its type, three stamps on."""
    original: dict[str, FieldValue] = {
        "x-acemq-id": "m-1",
        "x-float": Float32(1.5),
        "x-bytes": ByteArray(b"\xff"),
    }
    plan = plan_replay(copy_of(original), quarantine="q.orders", to=None, now_ms=NOW_MS)
    assert plan == Replay(
        queue="staging.orders",
        properties={"message_id": "m-1"},
        headers={
            **original,
            "acemq-replayed-from": "q.orders",
            "acemq-replayed-at": "2026-09-21T14:13:20.123Z",
            "acemq-replay-count": Int32(1),
        },
    )
    assert isinstance(plan, Replay)
    assert type(plan.headers["x-float"]) is Float32


def test_the_envelope_error_a_reason_displaced_goes_back() -> None:
    """An error the producer wrote is the original's; the quarantine reason is not."""
    plan = plan_replay(
        copy_of({"x-acemq-error": "upstream timeout"}), quarantine="q", to=None, now_ms=NOW_MS
    )
    assert isinstance(plan, Replay)
    assert plan.headers["x-acemq-error"] == "upstream timeout"
    assert "acemq-original-error" not in plan.headers


@pytest.mark.parametrize(
    ("stamps", "count"),
    [
        ({"x-acemq-replay-count": Int32(2), "x-acemq-replayed-from": "old"}, 3),
        ({"acemq-replay-count": Int32(4), "x-acemq-replay-count": Int32(9)}, 5),
        ({"acemq-replay-count": "junk"}, 1),
    ],
)
def test_a_replay_counts_one_more_than_it_carried(stamps: dict[str, Any], count: int) -> None:
    """Legacy spellings are read and removed; the current one wins (docs/contract.md section 5)."""
    plan = plan_replay(copy_of(stamps), quarantine="q", to=None, now_ms=NOW_MS)
    assert isinstance(plan, Replay)
    assert plan.headers["acemq-replay-count"] == Int32(count)
    assert not any(name.startswith("x-acemq-replay") for name in plan.headers)


def test_to_wins_over_the_queue_it_came_from() -> None:
    plan = plan_replay(copy_of({}), quarantine="q", to="staging.fixed", now_ms=NOW_MS)
    assert isinstance(plan, Replay)
    assert plan.queue == "staging.fixed"


def test_the_quorum_queues_delivery_count_does_not_travel() -> None:
    """A quorum quarantine queue counts its own deliveries; staging keeps its own count."""
    redelivered = copy_of({"x-acemq-id": "m-1"})
    headers = {**redelivered.headers, "x-delivery-count": 3, "x-acquired-count": 4}
    plan = plan_replay(delivery(headers), quarantine="q", to=None, now_ms=NOW_MS)
    assert isinstance(plan, Replay)
    assert "x-delivery-count" not in plan.headers
    assert "x-acquired-count" not in plan.headers


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (delivery({"x-acemq-error": "why"}), "no acemq-quarantined-from header: give --to QUEUE"),
        (
            delivery({}, undecodable=UndecodableTable(raw=b"\x00", error="junk")),
            "the quarantine copy's header table cannot be decoded",
        ),
    ],
)
def test_what_cannot_be_replayed_says_why(message: Delivery, reason: str) -> None:
    assert plan_replay(message, quarantine="q", to=None, now_ms=NOW_MS) == Unreplayable(reason)


def test_an_undecodable_original_is_not_replayed() -> None:
    """Its table travels as raw bytes: there are no headers to restore or stamp."""
    original = delivery({}, undecodable=UndecodableTable(raw=b"\x00\x00\x00\x09", error="x"))
    properties, copy = quarantine_copy(original, reason="r", queue="s", login="guest")
    plan = plan_replay(delivery(copy, properties=properties), quarantine="q", to=None, now_ms=1)
    assert isinstance(plan, Unreplayable)
    assert plan.reason.startswith("undecodable original")


def test_an_original_whose_content_header_went_unread_is_not_replayed() -> None:
    """Only its body was kept: a replay would lose its properties and headers for good."""
    original = Delivery(
        delivery_tag=1,
        exchange="",
        routing_key="orders",
        redelivered=False,
        properties=MappingProxyType({}),
        headers=MappingProxyType({}),
        body=b"body",
        unread_header=UnreadHeader(size=20_000_000, limit=16_777_216),
    )
    properties, copy = quarantine_copy(original, reason="r", queue="s", login="guest")
    plan = plan_replay(delivery(copy, properties=properties), quarantine="q", to=None, now_ms=1)
    assert isinstance(plan, Unreplayable)
    assert plan.reason.startswith("unread original")


@given(st.integers(min_value=1, max_value=200_000_000))
def test_a_window_fits_basic_qos_and_the_channels_stay_few(total: int) -> None:
    """basic.qos has 16 bits; 0 would mean no limit at all."""
    window = window_for(total)
    assert 1 <= window <= min(total, PREFETCH_MAX)
    if total <= PREFETCH_MAX * CHANNELS_TARGET:
        assert -(-total // window) <= CHANNELS_TARGET


def report(*, read: int, selected: int, replayed: int, failed: Counter[str]) -> ReplayReport:
    return ReplayReport(
        read=ReadReport(at_start=read, consumers=0, read=read, selected=selected),
        dry_run=False,
        replayed=replayed,
        failed=failed,
    )


def test_the_summary_counts_and_gives_reasons() -> None:
    done = report(read=10, selected=4, replayed=3, failed=Counter({"returned: no queue": 1}))
    assert done.summary() == [
        "replayed 3, skipped 6 (not selected), failed 1, of 10 read",
        "  failed 1: returned: no queue",
    ]
    assert not done.all_replayed
    assert report(read=10, selected=4, replayed=4, failed=Counter()).all_replayed


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        """Say so."""
        return True


def test_progress_is_drawn_on_a_terminal_only() -> None:
    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        bar = Progress(stream, total=10)
        bar.update(report(read=5, selected=5, replayed=4, failed=Counter()))
        bar.end()
    assert terminal.getvalue() == "\r[############             ] 5/10 read, 4 replayed, 0 failed\n"
    assert pipe.getvalue() == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["quarantine", "list", "q", "--limit", "0"],
        ["quarantine", "list", "q", "--limit", "x"],
        ["quarantine", "list", "q", "--route", ""],
        ["quarantine", "replay", "q", "--to", ""],
        ["quarantine", "list", "q", "--url", "amqp://h/", "--config", "r.yaml"],
        ["quarantine", "list"],
        ["quarantine", "replay", "q", "--json"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "http://h/"], "must start with amqp:// or amqps://"),
        (["--url", "amqp://u:p/w@h/"], "percent-encode"),
        ([], "no broker: give --config routes.yaml or --url URL, or set AMQP_URL"),
        (["--config", "/nonexistent/routes.yaml"], "/nonexistent/routes.yaml"),
    ],
)
def test_a_bad_broker_is_named_and_exits_2(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The password is never shown, even in the URL that could not be read."""
    monkeypatch.delenv("AMQP_URL", raising=False)
    assert main(["quarantine", "list", "q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "p/w" not in err
