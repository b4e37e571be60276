"""A publish's result read into the settle step's answer: the one reading, both paths'."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.errors import ChannelClosedError, ChannelLostError, MissingEntityError, WireError
from sidecar.settle import (
    Blocked,
    Confirmed,
    Failed,
    Lost,
    Refused,
    Unwritable,
    answer_of,
    not_now,
    waits_unblock,
)
from sidecar.settle.answers import Nacked, Returned
from sidecar.wire import PublishOutcome


def never() -> bool:
    raise AssertionError("asked whether the channel went, for an answer that does not need it")


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        (PublishOutcome.CONFIRMED, Confirmed()),
        (PublishOutcome.RETURNED, Returned()),
        (PublishOutcome.NACKED, Nacked()),
        (ChannelClosedError(406, "PRECONDITION_FAILED"), Refused(406, "PRECONDITION_FAILED")),
        (WireError("a header too large"), Unwritable("a header too large")),
        (ValueError("not encodable"), Unwritable("not encodable")),
        (TypeError("not a field"), Unwritable("not a field")),
    ],
)
def test_what_each_result_means(result: PublishOutcome | Exception, answer: object) -> None:
    assert answer_of(result, gone=never) == answer


@pytest.mark.parametrize("gone", [True, False])
def test_a_lost_channel_is_gone_only_when_a_stop_or_the_connection_took_it(*, gone: bool) -> None:
    lost = ChannelLostError("channel 2 closed")
    assert answer_of(lost, gone=lambda: gone) == Lost(gone=gone, error="channel 2 closed")


def test_a_missing_entity_is_the_routes_and_is_raised_again() -> None:
    missing = MissingEntityError(kind="exchange", name="orders")
    with pytest.raises(MissingEntityError):
        answer_of(missing, gone=never)


def test_any_other_exception_is_a_bug_kept_whole() -> None:
    bug = RuntimeError("boom")
    answer = answer_of(bug, gone=never)
    assert isinstance(answer, Failed)
    assert answer.error is bug


def test_a_cancellation_is_never_an_answer() -> None:
    with pytest.raises(asyncio.CancelledError):
        answer_of(asyncio.CancelledError(), gone=never)


@pytest.mark.parametrize(
    ("channel_open", "blocked", "expected"),
    [
        (True, None, None),
        (True, "low on memory", Blocked("low on memory")),
        (False, None, Lost(gone=True, error="the channel it came on is closing")),
        (False, "low on memory", Lost(gone=True, error="the channel it came on is closing")),
    ],
)
def test_a_publish_waits_for_an_unblock_and_never_goes_for_a_closing_channel(
    *, channel_open: bool, blocked: str | None, expected: object
) -> None:
    """A closing channel wins: its delivery is the broker's again, a copy would duplicate."""
    assert not_now(channel_open=channel_open, blocked=blocked) == expected


def test_only_a_blocked_publish_is_still_to_be_made() -> None:
    assert waits_unblock(Blocked("low on memory"))
    assert not any(
        waits_unblock(answer)
        for answer in (Confirmed(), Returned(), Nacked(), Lost(gone=True), Failed(OSError()))
    )
