"""producer_of and ProducerLabels: a bounded, id-free label (sidecar.contract.producers)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.contract import Publishers
from sidecar.contract.producers import OTHER, UNKNOWN, ProducerLabels, producer_of


@pytest.mark.parametrize(
    ("headers", "properties", "publishers", "expected"),
    [
        ({"x-acemq-origin": "checkout@app-7"}, {}, Publishers.ACEMQ, "checkout"),
        ({"x-acemq-origin": "checkout"}, {}, Publishers.ACEMQ, "checkout"),
        ({"x-acemq-origin": " billing @ host-1"}, {}, Publishers.ACEMQ, "billing"),
        ({}, {"app_id": "invoicer"}, Publishers.APPS, "invoicer"),
        ({}, {"app_id": "invoicer"}, Publishers.ACEMQ, UNKNOWN),
        ({"x-acemq-origin": "orders@x"}, {"app_id": "invoicer"}, Publishers.APPS, "orders"),
        ({}, {}, Publishers.ACEMQ, UNKNOWN),
        ({"x-acemq-origin": ""}, {}, Publishers.ACEMQ, UNKNOWN),
        ({"x-acemq-origin": "@host"}, {}, Publishers.ACEMQ, UNKNOWN),
        ({"x-acemq-origin": 5}, {}, Publishers.ACEMQ, UNKNOWN),
        ({"x-acemq-origin": "3f2504e0-4f89-41d3-9a0c-0305e82c3301@h"}, {}, Publishers.ACEMQ, OTHER),
        ({"x-acemq-origin": "10.0.0.7@h"}, {}, Publishers.ACEMQ, OTHER),
        ({"x-acemq-origin": "pod-0123456789abcdef0123"}, {}, Publishers.ACEMQ, OTHER),
        ({"x-acemq-origin": "has space@h"}, {}, Publishers.ACEMQ, OTHER),
        ({"x-acemq-origin": "a" * 64}, {}, Publishers.ACEMQ, OTHER),
        ({"x-acemq-origin": 'quote"s'}, {}, Publishers.ACEMQ, OTHER),
    ],
)
def test_the_producer_is_the_service_part_never_a_host_or_an_id(
    headers: dict[str, Any], properties: dict[str, Any], publishers: Publishers, expected: str
) -> None:
    assert producer_of(headers, properties, publishers=publishers) == expected


@given(st.text(max_size=100))
def test_any_origin_gives_a_safe_label(origin: str) -> None:
    """Whatever the header holds, the label is a short service name or a marker."""
    label = producer_of({"x-acemq-origin": origin}, {}, publishers=Publishers.ACEMQ)
    assert label in (OTHER, UNKNOWN) or (len(label) <= 63 and label.isascii() and "@" not in label)


def test_the_first_producers_keep_their_labels_and_the_rest_are_other() -> None:
    labels = ProducerLabels(limit=2)
    assert [labels.label("r", p) for p in ("a", "b", "c", "a", "b")] == ["a", "b", OTHER, "a", "b"]
    assert labels.label("r", UNKNOWN) == UNKNOWN  # markers never count against the limit
    assert labels.label("other-route", "c") == "c"  # the limit is per route


def test_a_limit_of_zero_turns_every_producer_into_other() -> None:
    assert ProducerLabels(limit=0).label("r", "a") == OTHER


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        ProducerLabels(limit=-1)


def test_forgetting_a_route_frees_its_labels() -> None:
    labels = ProducerLabels(limit=1)
    labels.label("r", "a")
    labels.forget("r")
    assert labels.label("r", "b") == "b"
