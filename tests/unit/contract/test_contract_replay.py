"""stamp_replay: how a message sent again by hand is stamped (docs/contract.md sections 2, 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sidecar.contract import (
    REPLAY_COUNT,
    REPLAYED_AT,
    REPLAYED_FROM,
    Policy,
    Relay,
    normalise,
    stamp_replay,
)
from sidecar.wire import Int32, Int64

NOW_MS = 1_790_000_000_123  # 2026-09-21T14:13:20.123Z


@pytest.mark.parametrize(
    ("given", "count"),
    [
        ({}, 1),
        ({REPLAY_COUNT: Int32(2)}, 3),
        ({REPLAY_COUNT: " 4 "}, 5),
        ({"x-acemq-replay-count": "4"}, 5),
        ({REPLAY_COUNT: Int32(7), "x-acemq-replay-count": Int32(1)}, 8),
        ({REPLAY_COUNT: "junk", "x-acemq-replay-count": Int32(3)}, 4),
        ({REPLAY_COUNT: Int32(0)}, 1),
        ({REPLAY_COUNT: Int64(-5)}, 1),
        ({REPLAY_COUNT: Int64(2**40)}, 1),
        ({REPLAY_COUNT: Int32(2**31 - 1)}, 2**31 - 1),
    ],
)
def test_the_count_is_one_more_than_the_message_carried(given: dict[str, Any], count: int) -> None:
    """Read as section 3 reads it, either spelling, the current one first; never past int32."""
    stamped = stamp_replay(given, replayed_from="acemq.quarantined", now_ms=NOW_MS)
    assert stamped[REPLAY_COUNT] == count
    assert type(stamped[REPLAY_COUNT]) is Int32


def test_the_stamps_are_canonical_and_replace_the_legacy_spellings() -> None:
    given: dict[str, Any] = {
        "a": "1",
        "x-acemq-replayed-from": "old",
        "x-acemq-replayed-at": "2020-01-01T00:00:00Z",
        REPLAYED_AT: "2021-01-01T00:00:00+01:00",
        "b": Int32(2),
    }
    stamped = stamp_replay(given, replayed_from="q.quarantine", now_ms=NOW_MS)
    assert stamped == {
        "a": "1",
        REPLAYED_AT: "2026-09-21T14:13:20.123Z",
        "b": Int32(2),
        REPLAYED_FROM: "q.quarantine",
        REPLAY_COUNT: Int32(1),
    }
    assert list(stamped)[:3] == ["a", REPLAYED_AT, "b"]  # the others keep their places
    assert "x-acemq-replayed-from" in given  # the input is left as it was


def test_a_whole_second_is_written_without_a_fraction() -> None:
    stamped = stamp_replay({}, replayed_from="q", now_ms=1_790_000_000_000)
    assert stamped[REPLAYED_AT] == "2026-09-21T14:13:20Z"


def test_a_stamped_message_is_already_normal(new_id: Callable[[], str]) -> None:
    """The sidecar relays a replay without repairing its stamps: they are canonical."""
    stamped = stamp_replay(
        {"x-acemq-id": "m-1", "x-acemq-replay-count": "2"}, replayed_from="q", now_ms=NOW_MS
    )
    verdict = normalise(
        "t", {"message_id": "m-1"}, stamped, policy=Policy(), now_ms=NOW_MS, new_id=new_id
    )
    assert isinstance(verdict, Relay)
    assert verdict.headers[REPLAY_COUNT] == 3
    assert verdict.headers[REPLAYED_AT] == "2026-09-21T14:13:20.123Z"
    replay_violations = [v for v in verdict.violations if v.header.startswith("acemq-repl")]
    assert replay_violations == []


def test_a_clock_outside_rfc_3339_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the years 1 to 9999"):
        stamp_replay({}, replayed_from="q", now_ms=10**18)
