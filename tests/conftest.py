"""Fixtures shared by every test layer."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def new_id() -> Callable[[], str]:
    """Return a deterministic UUID v4 source, so a failing run can be replayed exactly."""
    rng = random.Random(20261129)  # noqa: S311 - test determinism, not security

    def make() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    return make
