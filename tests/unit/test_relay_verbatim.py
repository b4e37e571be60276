"""When the relay may send a delivery's content header as it came: only if nothing changed."""

from __future__ import annotations

from sidecar.relay import _same_table
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
