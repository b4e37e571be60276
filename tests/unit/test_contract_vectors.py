"""Conformance: every vector of tests/contract/vectors.json, and idempotence on each.

tests/contract/vectors.json is the project's copy of ../shared/contract/vectors.json, so a
clone with no ../shared beside it runs every vector; where ../shared exists, the copy must
be byte-identical to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.contract import Kind, Relay, normalise
from sidecar.vectors import message_from_json, run_vector, to_json

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "tests" / "contract" / "vectors.json"
SHARED = Path(os.environ.get("ACEMQ_SHARED", REPO.parent / "shared"))
SHARED_VECTORS = SHARED / "contract" / "vectors.json"


def _load() -> list[dict[str, Any]]:
    # Missing vectors are a failure, never a skip: a conformance run without them proves nothing.
    if not VECTORS.is_file():
        pytest.fail(f"{VECTORS} is missing: the repository's copy of the conformance vectors")
    vectors: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    return vectors


def test_vector_copy_matches_the_shared_vectors() -> None:
    """The repository's copy is byte-identical to ../shared/contract/vectors.json.

    Runs only where ../shared (or ACEMQ_SHARED) exists: a user's clone has only the copy.
    To take a new shared set: cp ../shared/contract/vectors.json tests/contract/vectors.json
    """
    if not SHARED_VECTORS.is_file():
        pytest.skip(f"{SHARED_VECTORS} does not exist here; the repository's copy is used")
    assert VECTORS.read_bytes() == SHARED_VECTORS.read_bytes(), (
        f"{VECTORS} differs from {SHARED_VECTORS}: copy the shared file over the repository's"
    )


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


READINGS = Path(__file__).resolve().parent / "vectors" / "readings.json"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise over the shared vectors, and this project's readings, by name."""
    if "vector" in metafunc.fixturenames:
        vectors = _load()
        metafunc.parametrize("vector", vectors, ids=_ids(vectors))
    if "reading" in metafunc.fixturenames:
        readings = json.loads(READINGS.read_text(encoding="utf-8"))["vectors"]
        metafunc.parametrize("reading", readings, ids=_ids(readings))


def test_vector_file_is_not_trivial() -> None:
    """A truncated vector file would make the suite pass vacuously."""
    vectors = _load()
    assert len(vectors) >= 93
    assert len(set(_ids(vectors))) == len(vectors)


def test_vector(vector: dict[str, Any], new_id: Callable[[], str]) -> None:
    """normalise gives exactly the expected verdict, properties, headers and violations."""
    assert run_vector(vector, new_id=new_id) is None


def test_vector_output_is_a_fixed_point(vector: dict[str, Any], new_id: Callable[[], str]) -> None:
    """Normalising a relayed message again changes nothing (CONTRACT.md section 1)."""
    routing_key, properties, headers, policy, now_ms = message_from_json(vector)
    first = normalise(routing_key, properties, headers, policy=policy, now_ms=now_ms, new_id=new_id)
    if not isinstance(first, Relay):
        return
    second = normalise(
        routing_key, first.properties, first.headers, policy=policy, now_ms=now_ms, new_id=new_id
    )
    assert isinstance(second, Relay)
    assert second.properties == first.properties
    assert to_json(dict(second.headers)) == to_json(dict(first.headers))
    assert all(
        v.kind is Kind.UNREADABLE and v.header == "acemq-replayed-at" for v in second.violations
    ), second.violations


def test_reading(reading: dict[str, Any], new_id: Callable[[], str]) -> None:
    """normalise follows this project's recorded readings of CONTRACT.md's fine print."""
    assert run_vector(reading, new_id=new_id) is None
