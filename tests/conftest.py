"""Fixtures shared by every test layer."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import Broker, broker_url, open_broker

if TYPE_CHECKING:
    from tests.e2e.conftest import Sidecar
    from tests.faults.private_node import PrivateNode

REPO = Path(__file__).resolve().parents[1]

SUITES = (
    "unit",
    "contract",
    "integration",
    "e2e",
    "faults",
    "cluster",
    "soak",
    "deploy",
    "interop",
)
"""The folders under tests/, each a marker of the same name (pyproject.toml lists them)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its suite, so that `-m "not cluster"` picks suites by name."""
    for item in items:
        suite = item.path.relative_to(REPO / "tests").parts[0]
        if suite in SUITES:
            item.add_marker(getattr(pytest.mark, suite))


@pytest.fixture
def new_id() -> Callable[[], str]:
    """Return a deterministic UUID v4 source, so a failing run can be replayed exactly."""
    rng = random.Random(20261129)

    def make() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    return make


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The broker every integration and e2e test uses (see tests/support.py)."""
    with broker_url() as url:
        yield url


@pytest.fixture
async def broker(amqp_url: str) -> AsyncIterator[Broker]:
    """A test client with uniquely named, self-deleting topology."""
    async with open_broker(amqp_url) as client:
        yield client


# The modules that start a RabbitMQ node of their own define ``node``: these two serve
# each of them, in the fault and end-to-end suites alike.


@pytest.fixture
async def nb(node: PrivateNode) -> AsyncIterator[Broker]:
    """A test client on the private node, with self-deleting topology."""
    async with open_broker(node.url) as client:
        yield client


@pytest.fixture
async def sidecar_on_node(node: PrivateNode, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar process on the private node, killed at teardown whatever happened."""
    from tests.e2e.conftest import Sidecar  # noqa: PLC0415 - only where a node runs

    process = Sidecar(amqp_url=node.url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()
