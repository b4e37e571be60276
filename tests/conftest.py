"""Fixtures shared by every test layer, and the broker versions' matrix (tests/brokers.py).

``broker_version`` is a session parameter: each test that takes it (through ``amqp_url``,
``rabbitmqctl`` or a private node of its module) runs once per ``--broker-versions``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pytest

from tests import brokers
from tests.support import Broker, broker_url, open_broker

if TYPE_CHECKING:
    from tests.e2e.conftest import Sidecar
    from tests.faults.conftest import RabbitCtl
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


LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
CTL_TIMEOUT_S = 90.0


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--broker-versions`` and ``--broker-subset`` (tests/brokers.py)."""
    brokers.add_options(parser)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``broker_version`` runs once per selected version."""
    brokers.parametrise(metafunc)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its suite (`-m "not cluster"`); keep the versions' selection."""
    suites = []
    for item in items:
        suite = item.path.relative_to(REPO / "tests").parts[0]
        suites.append(suite)
        if suite in SUITES:
            item.add_marker(getattr(pytest.mark, suite))
    brokers.deselect(config, items, suites)


@pytest.fixture
def new_id() -> Callable[[], str]:
    """Return a deterministic UUID v4 source, so a failing run can be replayed exactly."""
    rng = random.Random(20261129)

    def make() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    return make


@pytest.fixture(scope="session")
def broker_version(request: pytest.FixtureRequest) -> str:
    """The broker version of the test's run: ``local``, ``4.0`` or ``4.3``."""
    return str(getattr(request, "param", brokers.LOCAL))


@pytest.fixture(scope="session")
def broker_nodes() -> Iterator[brokers.Matrix]:
    """The session's private node of each 4.x version, all stopped at its end."""
    with contextlib.ExitStack() as stack:
        yield brokers.Matrix(stack, {})


@pytest.fixture(scope="session")
def amqp_url(broker_version: str, broker_nodes: brokers.Matrix) -> Iterator[str]:
    """The broker every integration and e2e test uses.

    ``local``: AMQP_URL, else the local broker (tests/support.py); 4.x: the session's
    private node of that version.
    """
    if broker_version != brokers.LOCAL:
        yield broker_nodes.node(broker_version).node.url
        return
    with broker_url() as url:
        yield url


@pytest.fixture(scope="session")
def rabbitmqctl(amqp_url: str, broker_version: str, broker_nodes: brokers.Matrix) -> RabbitCtl:
    """rabbitmqctl for the broker behind ``amqp_url`` alone; skip where none is local.

    On 4.x, the private node's (through chroot). ``local``: ``-n RABBITMQCTL_NODE`` when
    that is set, and refused unless the node it talks to listens on AMQP_URL's port: a
    fault must never hit somebody else's node.
    """
    from tests.faults.conftest import RabbitCtl  # noqa: PLC0415 - it imports this module

    if broker_version != brokers.LOCAL:
        return broker_nodes.node(broker_version).node.ctl
    executable = shutil.which("rabbitmqctl")
    if executable is None:
        pytest.skip("rabbitmqctl is not on PATH")
    parts = urlsplit(amqp_url)
    if parts.hostname not in LOCAL_HOSTS:
        pytest.skip(f"AMQP_URL names a broker that is not local: {parts.hostname}")
    node = os.environ.get("RABBITMQCTL_NODE")
    command = [executable, "-n", node] if node else [executable]
    port = parts.port or 5672
    ports = _amqp_ports(command)
    if port not in ports:
        pytest.fail(
            f"rabbitmqctl talks to node {node or '(default)'}, which serves AMQP on {ports},"
            f" not on {port} (AMQP_URL): set RABBITMQCTL_NODE to the node under test"
        )
    return RabbitCtl(command=tuple(command), vhost=unquote(parts.path[1:]) or "/")


def _amqp_ports(command: list[str]) -> set[int]:
    """Return the AMQP ports the node that ``command`` talks to listens on."""
    diagnostics = shutil.which("rabbitmq-diagnostics")
    assert diagnostics is not None, "rabbitmq-diagnostics is not on PATH"
    result = subprocess.run(
        [diagnostics, *command[1:], "listeners", "--formatter", "json"],
        capture_output=True,
        check=False,
        timeout=CTL_TIMEOUT_S,
        text=True,
    )
    assert result.returncode == 0, f"cannot list the node's listeners: {result.stdout}"
    listeners = json.loads(result.stdout.strip().splitlines()[-1])["listeners"]
    return {int(item["port"]) for item in listeners if item["protocol"] == "amqp"}


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
