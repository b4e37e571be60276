"""Private nodes of each RabbitMQ version the sidecar is proven on.

``local`` is the machine's own packages (Debian 12's 3.10.8 here); ``4.0`` and ``4.3`` run
from the root file systems ``scripts/brokers`` makes and caches outside the clone (Debian
13's 4.0.5, Debian unstable's 4.3.x), through chroot. Each node has its own name, ports and
folder (``tests/faults/private_node.py``) and is stopped at the end; the shared broker is
never touched. A root that cannot be made fails the test under ``CI=true`` and skips it
otherwise, naming the command to run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.faults.private_node import PrivateNode, private_node

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "brokers"
VERSIONS = ("local", "4.0", "4.3")
"""The broker versions of the matrix: the machine's own, then the cached roots'."""
MAKE_TIMEOUT_S = 900.0
RUN = secrets.token_hex(3)  # in every node's name: two runs on one machine never meet


def node_name(label: str) -> str:
    """A node name of this run's own: ``acemq-LABEL-RUN@localhost``."""
    return f"acemq-{label}-{RUN}@localhost"


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def broker_root(version: str) -> Path | None:
    """The root file system of ``version`` (made now if missing); None for ``local``."""
    if version == "local":
        return None
    command = [str(SCRIPT), version]
    try:
        made = subprocess.run(
            command, capture_output=True, check=False, text=True, timeout=MAKE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        _fail_or_skip(f"scripts/brokers {version} took over {MAKE_TIMEOUT_S:g}s; run it by hand")
        raise  # unreachable: fail and skip raise
    if made.returncode != 0:
        _fail_or_skip(
            f"no RabbitMQ {version} root: run `sudo scripts/brokers {version}`"
            f" ({made.stderr.strip()})"
        )
    return Path(made.stdout.split()[1])


@dataclass(frozen=True, slots=True)
class VersionedNode:
    """A private node and the RabbitMQ version it runs (``rabbitmqctl version``)."""

    node: PrivateNode
    version: str

    @property
    def release(self) -> tuple[int, int]:
        """The major and minor version: (3, 10), (4, 0), (4, 3)."""
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)


@contextlib.contextmanager
def versioned_node(
    version: str, name: str, *, conf: str = "", advanced: str = "[]."
) -> Iterator[VersionedNode]:
    """Start a private node of ``version`` called ``name``; stop it after."""
    root = broker_root(version)
    with private_node(name, conf=conf, advanced=advanced, root=root) as node:
        inside = () if root is None else ("chroot", str(root))
        reported = subprocess.run(
            [*inside, "rabbitmqctl", "-n", node.name, "version"],
            capture_output=True,
            check=True,
            text=True,
            timeout=60,
        )
        yield VersionedNode(node, reported.stdout.strip().splitlines()[-1])
