"""Conformance: every vector of tests/contract/vectors.json, and idempotence on each.

tests/contract/vectors.json is the project's copy of the shared conformance vectors, so a
clone with nothing beside it runs every vector; where the shared originals exist
(../shared, or ACEMQ_SHARED), it, its format and docs/contract.md must be byte-identical
to them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.contract import Kind, Relay, normalise
from sidecar.contract.vectors import message_from_json, run_vector, to_json

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "tests" / "contract" / "vectors.json"
SHARED = Path(os.environ.get("ACEMQ_SHARED", REPO.parent / "shared"))

COPIES = {
    "tests/contract/vectors.json": "contract/vectors.json",
    "tests/contract/FORMAT.md": "contract/README.md",
    "docs/contract.md": "CONTRACT.md",
}
"""The repository's copy of each shared file -> the original's path under ../shared."""


def _load() -> list[dict[str, Any]]:
    # Missing vectors are a failure, never a skip: a conformance run without them proves nothing.
    if not VECTORS.is_file():
        pytest.fail(f"{VECTORS} is missing: the repository's copy of the conformance vectors")
    vectors: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    return vectors


@pytest.mark.parametrize(("copy", "original"), COPIES.items())
def test_copy_matches_the_shared_original(copy: str, original: str) -> None:
    """The repository's copy of the contract, its vectors and their format is byte-identical.

    Runs only where ../shared (or ACEMQ_SHARED) exists: a user's clone has only the copy.
    To take a new shared file: cp ../shared/ORIGINAL COPY
    """
    mine, theirs = REPO / copy, SHARED / original
    if not theirs.is_file():
        pytest.skip(f"{theirs} does not exist here; the repository's copy is used")
    assert mine.is_file(), f"{mine} is missing: copy {theirs} to it"
    assert mine.read_bytes() == theirs.read_bytes(), (
        f"{mine} differs from {theirs}: copy the shared file over the repository's"
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
    """Normalising a relayed message again changes nothing (docs/contract.md section 1)."""
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
    """normalise follows this project's recorded readings of docs/contract.md's fine print."""
    assert run_vector(reading, new_id=new_id) is None
