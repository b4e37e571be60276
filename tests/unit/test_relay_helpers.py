"""The relay's pure helpers: when a content header may go out as it came; bounded text."""

from __future__ import annotations

from sidecar.relay import _reason_kind, _same_table, bounded
from sidecar.wire import Float32, Int32, Int64


def test_equal_texts_and_same_width_integers_are_the_same_table() -> None:
    nested = {"a": [1, 2]}
    assert _same_table(
        {"id": "m-1", "attempt": Int32(1), "n": nested},
        {"id": "m-1", "attempt": Int32(1), "n": nested},
    )


def test_a_width_a_type_an_order_or_a_copy_of_a_container_is_a_change() -> None:
    assert not _same_table({"attempt": Int64(1)}, {"attempt": Int32(1)})
    assert not _same_table({"flag": True}, {"flag": 1})
    assert not _same_table({"x": Float32(0.5)}, {"x": 0.5})
    assert not _same_table({"a": "1", "b": "2"}, {"b": "2", "a": "1"})
    assert not _same_table({"n": {"a": Int64(1)}}, {"n": {"a": Int32(1)}})
    assert not _same_table({"a": "1"}, {"a": "1", "b": "2"})


def test_bounded_text_is_cut_and_says_how_much() -> None:
    assert bounded("abc", 5) == "abc"
    assert bounded("x" * 10_000, 100) == "x" * 100 + "... (9,900 more characters)"


def test_a_reasons_kind_leaves_out_what_the_message_put_in_it() -> None:
    """Quarantine log lines are rate-limited per kind: names and values must not split it."""
    reserved = 'header "x-acemq-%s" is in the reserved "x-acemq-" namespace and was set by the app'
    assert _reason_kind(reserved % "a") == _reason_kind(reserved % "b") == "header "
    unroutable = 'unroutable: exchange "%s" has no binding for routing key "k"'
    assert _reason_kind(unroutable % "x") == _reason_kind(unroutable % "y") == "unroutable"
    assert _reason_kind("internal error: boom") != _reason_kind("unroutable: x")
