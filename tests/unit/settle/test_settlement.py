"""The relay's decisions, branch by branch, with no broker: sidecar.settle.settlement."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from sidecar.contract import ERROR, ORIGINAL_USER_ID, Policy, Publishers, Reject, Relay
from sidecar.errors import WireError
from sidecar.settle.holds import delivery_limit_reached, slow_confirm
from sidecar.settle.quarantine_format import (
    ORIGINAL_ERROR,
    ORIGINAL_HEADER_BYTES,
    ORIGINAL_HEADERS,
    QUARANTINED_FROM,
    SHORT_REASON_MAX,
    fallbacks,
    original_headers,
    quarantine_copy,
    reason_only,
)
from sidecar.settle.settlement import (
    DEFAULT_DELIVERY_LIMIT,
    DELIVERY_COUNT,
    Copy,
    DeadLetter,
    Hold,
    Outcome,
    Quarantine,
    Target,
    bounded,
    internal_error,
    log_origin,
    nacked,
    plan_delivery,
    reason_kind,
    same_table,
    unencodable,
    unroutable,
    untaken,
    unwritable_quarantine,
)
from sidecar.wire import (
    ByteArray,
    Delivery,
    FieldValue,
    Float32,
    Int32,
    Int64,
    PublishOutcome,
    UndecodableTable,
    UnreadHeader,
)

NOW_MS = 1_790_000_000_000
LOGIN = "sidecar"
CANONICAL: dict[str, Any] = {
    "x-acemq-id": "m-1",
    "x-acemq-type": "order.placed",
    "x-acemq-version": Int32(1),
    "x-acemq-correlation": "m-1",
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
}


def delivery(
    headers: dict[str, Any] | None = None,
    *,
    properties: dict[str, Any] | None = None,
    routing_key: str = "order.placed",
    undecodable: UndecodableTable | None = None,
) -> Delivery:
    return Delivery(
        delivery_tag=7,
        exchange="",
        routing_key=routing_key,
        redelivered=False,
        properties=MappingProxyType({"message_id": "m-1"} if properties is None else properties),
        headers=MappingProxyType(dict(CANONICAL) if headers is None else headers),
        body=b"body",
        undecodable=undecodable,
        content_header=b"as-received",
    )


def target(
    *,
    audit: bool = False,
    exchange: str = "orders",
    routing_key: str | None = None,
    publishers: Publishers = Publishers.ACEMQ,
) -> Target:
    return Target(
        queue="staging.orders",
        exchange=exchange,
        routing_key=routing_key,
        audit=audit,
        policy=Policy(publishers=publishers, origin=None, login=LOGIN),
    )


def plan(
    new_id: Callable[[], str], message: Delivery, where: Target | None = None
) -> tuple[Copy | Quarantine, Relay | Reject | None]:
    return plan_delivery(message, where or target(), now_ms=NOW_MS, new_id=new_id)


# --- plan_delivery -------------------------------------------------------------------------


def test_an_undecodable_table_goes_to_quarantine_without_a_verdict(
    new_id: Callable[[], str],
) -> None:
    """The contract never sees a table the codec refused; the reason names the codec's error."""
    message = delivery({}, undecodable=UndecodableTable(raw=b"\x00", error="truncated at 0"))
    decided, verdict = plan(new_id, message)
    assert decided == Quarantine("header table cannot be decoded: truncated at 0")
    assert verdict is None


@pytest.mark.parametrize(
    ("headers", "limit", "expected"),
    [
        ({}, 20, False),  # a classic queue: no count
        ({DELIVERY_COUNT: 19}, 0, False),  # no limit assumed
        ({DELIVERY_COUNT: "19"}, 20, False),  # not the broker's count
        ({DELIVERY_COUNT: True}, 2, False),
        ({DELIVERY_COUNT: 1}, 2, True),
        ({DELIVERY_COUNT: 0}, 1, False),  # limit 1: quarantined only on its last
        ({DELIVERY_COUNT: 1}, 1, True),
        ({DELIVERY_COUNT: 2}, 3, True),
        ({DELIVERY_COUNT: 1}, 3, False),
    ],
)
def test_delivery_limit_reached_reads_the_brokers_count_only(
    headers: dict[str, FieldValue], limit: int, *, expected: bool
) -> None:
    assert (delivery_limit_reached(headers, limit, redelivered=True) is not None) is expected


@pytest.mark.parametrize("spent", [19, 25, 2**40])
def test_a_first_deliverys_count_is_its_producers_not_the_brokers(spent: int) -> None:
    """A quorum queue writes x-delivery-count only when it delivers a message again.

    On a first delivery the header is one a producer copied in (Spring's
    RepublishMessageRecoverer, a retry topology, a shovel off a quorum queue).
    """
    headers: dict[str, FieldValue] = {DELIVERY_COUNT: spent}
    assert delivery_limit_reached(headers, 20, redelivered=False) is None
    assert delivery_limit_reached(headers, 20, redelivered=True) is not None
    assert DEFAULT_DELIVERY_LIMIT == 20  # RabbitMQ 4.0's default for quorum queues


def test_a_reject_goes_to_quarantine_with_the_contracts_reason(new_id: Callable[[], str]) -> None:
    message = delivery({**CANONICAL, "x-acemq-tenant": "acme"})
    decided, verdict = plan(new_id, message, target(publishers=Publishers.APPS))
    assert isinstance(verdict, Reject)
    assert decided == Quarantine(verdict.reason)


def test_a_reject_in_audit_mode_goes_to_the_target_unchanged(new_id: Callable[[], str]) -> None:
    """Audit counts and logs; it never quarantines and never changes a message."""
    headers = {**CANONICAL, "x-acemq-tenant": "acme"}
    message = delivery(headers)
    decided, verdict = plan(new_id, message, target(audit=True, publishers=Publishers.APPS))
    assert isinstance(verdict, Reject)
    assert isinstance(decided, Copy)
    assert decided.outcome is Outcome.AUDITED
    assert decided.headers == headers
    assert decided.content_header == b"as-received"


def test_a_relay_is_a_copy_with_the_normalised_envelope(new_id: Callable[[], str]) -> None:
    message = delivery({"x-acemq-id": "m-1", "x-acemq-attempt": " 3 "})
    decided, verdict = plan(new_id, message)
    assert isinstance(verdict, Relay)
    assert isinstance(decided, Copy)
    assert decided.outcome is Outcome.RELAYED
    assert decided.headers == dict(verdict.headers)
    assert decided.headers["x-acemq-attempt"] == 3
    assert decided.properties == dict(verdict.properties)
    assert decided.content_header is None  # changed: encoded again


def test_a_canonical_message_reuses_its_content_header(new_id: Callable[[], str]) -> None:
    """Nothing changed, so the content header goes out byte for byte as it came."""
    decided, _ = plan(new_id, delivery())
    assert isinstance(decided, Copy)
    assert decided.content_header == b"as-received"


@pytest.mark.parametrize(
    ("configured", "expected"), [(None, "order.placed"), ("fixed.key", "fixed.key")]
)
def test_the_routing_key_is_kept_or_the_configured_literal(
    new_id: Callable[[], str], configured: str | None, expected: str
) -> None:
    decided, _ = plan(new_id, delivery(), target(routing_key=configured))
    assert isinstance(decided, Copy)
    assert decided.routing_key == expected


def test_a_copy_that_would_loop_into_staging_goes_to_quarantine(new_id: Callable[[], str]) -> None:
    """Default exchange and the staging queue's name as routing key: the copy would loop."""
    message = delivery(routing_key="staging.orders")
    decided, verdict = plan(new_id, message, target(exchange=""))
    assert isinstance(verdict, Relay)
    assert isinstance(decided, Quarantine)
    assert 'back into staging queue "staging.orders"' in decided.reason


def test_the_default_exchange_to_another_queue_is_a_copy(new_id: Callable[[], str]) -> None:
    decided, _ = plan(new_id, delivery(routing_key="orders.out"), target(exchange=""))
    assert isinstance(decided, Copy)


def test_audit_moves_a_foreign_user_id_as_a_normalised_copy_would(
    new_id: Callable[[], str],
) -> None:
    message = delivery(properties={"message_id": "m-1", "user_id": "someone"})
    decided, _ = plan(new_id, message, target(audit=True))
    assert isinstance(decided, Copy)
    assert "user_id" not in decided.properties
    assert decided.headers[ORIGINAL_USER_ID] == "someone"
    assert decided.content_header is None


# --- what the broker's answers mean, in the route's words ----------------------------------


def test_a_returned_copy_is_unroutable_naming_the_exchange_and_key() -> None:
    assert unroutable("orders", "k.1") == Quarantine(
        'unroutable: exchange "orders" has no binding for routing key "k.1"'
    )


def test_a_nacked_copy_is_held_and_may_duplicate() -> None:
    assert nacked("orders") == Hold(
        'the broker refused (nacked) a publish to exchange "orders"; is a target queue'
        " full with overflow reject-publish?",
        may_duplicate=True,
    )


@pytest.mark.parametrize(
    ("published", "passing", "expected"),
    [
        (
            PublishOutcome.RETURNED,
            False,
            Hold(
                'quarantine exchange "acemq.quarantine" returned the copy (routing key'
                ' "orders"); bind a queue to it. The message is held meanwhile (until'
                " broker.consumer_timeout_s x 0.75, then dead-lettered)"
            ),
        ),
        (
            PublishOutcome.NACKED,
            False,
            Hold(
                'quarantine exchange "acemq.quarantine" nacked the copy (routing key'
                ' "orders"); bind a queue to it. The message is held meanwhile (until'
                " broker.consumer_timeout_s x 0.75, then dead-lettered)",
                may_duplicate=True,
            ),
        ),
        (
            PublishOutcome.RETURNED,
            True,
            Hold(
                'quarantine exchange "acemq.quarantine" returned the copy (routing key'
                ' "orders"); bind a queue to it. The message goes back to its staging queue'
                " meanwhile (its body passed through and is not held), to pass through again"
            ),
        ),
    ],
)
def test_a_quarantine_copy_not_taken_is_held_saying_what_to_do(
    published: PublishOutcome, *, passing: bool, expected: Hold
) -> None:
    """Returned or nacked, the copy waits for a binding; only a nack may have been routed."""
    assert (
        untaken(published, exchange="acemq.quarantine", route="orders", passing=passing) == expected
    )


def test_faults_while_publishing_quarantine_with_what_happened() -> None:
    assert unencodable(ValueError("too long")) == Quarantine(
        "the normalised message cannot be encoded: too long"
    )
    assert internal_error(RuntimeError("boom")) == Quarantine(
        "internal error: RuntimeError('boom')"
    )
    reason = slow_confirm("orders", limit_s=30)
    assert reason.startswith(
        'no confirm from the broker within 30s for a publish to exchange "orders"'
    )
    assert "it will not be sent twice" in reason


# --- the quarantine copy -------------------------------------------------------------------


def test_a_quarantine_copy_is_the_original_plus_the_reason_and_the_staging_queue() -> None:
    message = delivery({"a": "1", "x-acemq-id": "m-1"})
    properties, headers = quarantine_copy(message, reason="why", queue="staging.o", login=LOGIN)
    assert properties == {"message_id": "m-1"}
    assert list(headers) == ["a", "x-acemq-id", ERROR, QUARANTINED_FROM]
    assert headers[ERROR] == "why"
    assert headers[QUARANTINED_FROM] == "staging.o"
    assert dict(message.headers) == {"a": "1", "x-acemq-id": "m-1"}  # the original untouched


def test_a_quarantine_copy_keeps_the_envelopes_own_error() -> None:
    message = delivery({ERROR: "the app's error"})
    _, headers = quarantine_copy(message, reason="why", queue="q", login=LOGIN)
    assert headers[ORIGINAL_ERROR] == "the app's error"
    assert headers[ERROR] == "why"


def test_a_quarantine_copy_carries_an_undecodable_table_whole() -> None:
    message = delivery({}, undecodable=UndecodableTable(raw=b"\x00\x01", error="bad"))
    _, headers = quarantine_copy(message, reason="why", queue="q", login=LOGIN)
    assert headers[ORIGINAL_HEADERS] == b"\x00\x01"
    assert type(headers[ORIGINAL_HEADERS]) is ByteArray


def test_a_quarantine_copy_moves_a_foreign_user_id_and_bounds_the_reason() -> None:
    message = delivery(properties={"message_id": "m-1", "user_id": "other"})
    properties, headers = quarantine_copy(message, reason="r" * 5000, queue="q", login=LOGIN)
    assert "user_id" not in properties
    assert headers[ORIGINAL_USER_ID] == "other"
    assert headers[ERROR] == "r" * 4096 + "... (904 more characters)"


def test_the_fallbacks_are_the_reason_alone_then_cut_to_the_smallest_frame() -> None:
    error = ValueError("frame too large")
    larger, smaller = fallbacks("x" * 5000, error, "q")
    assert larger == reason_only("x" * 5000, error, "q", short=False)
    assert smaller == reason_only("x" * 5000, error, "q", short=True)
    assert len(str(smaller)) < len(str(larger))


@pytest.mark.parametrize("short", [False, True])
def test_reason_only_says_why_the_headers_are_missing(*, short: bool) -> None:
    headers = reason_only("x" * 5000, ValueError("frame too large"), "q", short=short)
    assert set(headers) == {ERROR, QUARANTINED_FROM}
    text = headers[ERROR]
    assert isinstance(text, str)
    assert "the original headers could not be written: frame too large" in text
    if short:
        assert len(text) < 2 * SHORT_REASON_MAX + 100
    else:
        assert text.startswith("x" * 4096 + "... (904 more characters)")


def test_bounded_text_is_cut_and_says_how_much() -> None:
    assert bounded("abc", 5) == "abc"
    assert bounded("x" * 10_000, 100) == "x" * 100 + "... (9,900 more characters)"


def test_a_reasons_kind_leaves_out_what_the_message_put_in_it() -> None:
    """Quarantine log lines are rate-limited per kind: names and values must not split it."""
    reserved = 'header "x-acemq-%s" is in the reserved "x-acemq-" namespace and was set by the app'
    assert reason_kind(reserved % "a") == reason_kind(reserved % "b") == "header "
    unroutable = 'unroutable: exchange "%s" has no binding for routing key "k"'
    assert reason_kind(unroutable % "x") == reason_kind(unroutable % "y") == "unroutable"
    assert reason_kind("internal error: boom") != reason_kind("unroutable: x")


def test_the_logged_origin_is_the_normalised_one_else_the_received_one(
    new_id: Callable[[], str],
) -> None:
    message = delivery({**CANONICAL, "x-acemq-origin": "checkout@a"})
    _, verdict = plan(new_id, message)
    assert log_origin(verdict, message) == "checkout@a"
    from_app = delivery(properties={"message_id": "m-1", "app_id": "billing"})
    assert log_origin(None, from_app) == "billing"
    assert log_origin(None, delivery({"x-acemq-origin": "o" * 500})) == "o" * 200 + (
        "... (300 more characters)"
    )
    assert log_origin(None, delivery({})) is None


def test_equal_texts_and_same_width_integers_are_the_same_table() -> None:
    nested: FieldValue = {"a": [1, 2]}
    assert same_table(
        {"id": "m-1", "attempt": Int32(1), "n": nested},
        {"id": "m-1", "attempt": Int32(1), "n": nested},
    )


def test_any_change_that_alters_the_bytes_is_a_different_table() -> None:
    assert not same_table({"attempt": Int64(1)}, {"attempt": Int32(1)})
    assert not same_table({"flag": True}, {"flag": 1})
    assert not same_table({"x": Float32(0.5)}, {"x": 0.5})
    assert not same_table({"a": "1", "b": "2"}, {"b": "2", "a": "1"})
    assert not same_table({"n": {"a": Int64(1)}}, {"n": {"a": Int32(1)}})
    assert not same_table({"a": "1"}, {"a": "1", "b": "2"})


@pytest.mark.parametrize(
    "received",
    [
        {"a": "1", "x-acemq-id": "m-1"},
        {"a": "1", ERROR: "the app's own error", "b": Int32(2)},
        {},
    ],
)
def test_the_original_headers_come_back_from_a_quarantine_copy(received: dict[str, Any]) -> None:
    """original_headers undoes quarantine_copy: same names, values and order."""
    _, copy = quarantine_copy(delivery(received), reason="why", queue="q", login=LOGIN)
    restored = original_headers(copy)
    assert restored is not None
    assert list(restored.items()) == list(received.items())


def test_an_undecodable_original_cannot_be_restored() -> None:
    message = delivery({}, undecodable=UndecodableTable(raw=b"\x00\x01", error="bad"))
    _, copy = quarantine_copy(message, reason="why", queue="q", login=LOGIN)
    assert original_headers(copy) is None


def unread_delivery() -> Delivery:
    """A delivery whose content header was too large to read: a body, nothing else."""
    return Delivery(
        delivery_tag=7,
        exchange="",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({}),
        headers=MappingProxyType({}),
        body=b"body",
        unread_header=UnreadHeader(size=20_971_520, limit=16_777_216),
    )


@pytest.mark.parametrize("audit", [False, True])
def test_a_content_header_too_large_to_read_is_quarantined_with_its_size(*, audit: bool) -> None:
    """Audit mode too: a copy without its properties and headers is not the original."""
    plan, verdict = plan_delivery(
        unread_delivery(), target(audit=audit), now_ms=NOW_MS, new_id=lambda: "new"
    )
    assert verdict is None
    assert isinstance(plan, Quarantine)
    assert "20971520 bytes, over the limit of 16777216" in plan.reason
    assert "its properties and headers could not be read" in plan.reason
    assert reason_kind(plan.reason) == "content header too large to read"


def test_the_quarantine_copy_of_an_unread_header_keeps_the_body_and_the_size() -> None:
    message = unread_delivery()
    properties, headers = quarantine_copy(message, reason="why", queue="q", login=LOGIN)
    assert properties == {}
    assert headers == {ERROR: "why", QUARANTINED_FROM: "q", ORIGINAL_HEADER_BYTES: 20_971_520}
    assert original_headers(headers) == {ORIGINAL_HEADER_BYTES: 20_971_520}


def test_a_quarantine_copy_that_cannot_be_written_is_dead_lettered_with_both_reasons() -> None:
    decision = unwritable_quarantine("r" * 5000, WireError("too big"))
    assert isinstance(decision, DeadLetter)
    assert decision.reason.startswith("r" * 4096 + "... (904 more characters); and the")
    assert decision.reason.endswith("the quarantine copy cannot be written: too big")


@pytest.mark.parametrize("audit", [False, True])
def test_a_copy_leaves_the_staging_queues_counters_behind(
    new_id: Callable[[], str], *, audit: bool
) -> None:
    """x-delivery-count and x-acquired-count are the staging queue's bookkeeping.

    Carried on, the next hop would read staging's returns as its own (a classic target
    queue never overwrites them); the application's other headers stay, in their order.
    """
    headers = {**CANONICAL, DELIVERY_COUNT: Int64(3), "x-acquired-count": Int64(5), "k": "v"}
    decided, _ = plan(new_id, delivery(headers), target(audit=audit))
    assert isinstance(decided, Copy)
    assert DELIVERY_COUNT not in decided.headers
    assert "x-acquired-count" not in decided.headers
    assert list(decided.headers) == [*CANONICAL, "k"]
    assert decided.content_header is None  # changed: encoded afresh, not sent as it came
