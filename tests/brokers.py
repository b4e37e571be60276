"""Private nodes of each RabbitMQ version the sidecar is proven on, and the suites' matrix.

``local`` is the machine's own packages (Debian 12's 3.10.8 here); ``4.0`` and ``4.3`` run
from the root file systems ``scripts/brokers`` makes and caches outside the clone (Debian
13's 4.0.5, Debian unstable's 4.3.x), through chroot. Each node has its own name, ports and
folder (``tests/faults/private_node.py``) and is stopped at the end; the shared broker is
never touched. A root that cannot be made fails the test under ``CI=true`` and skips it
otherwise, naming the command to run.

The matrix: ``--broker-versions=local,4.0,4.3`` (default ``local``, or
``$ACEMQ_BROKER_VERSIONS``) runs every test that takes ``broker_version`` (through
``amqp_url``, ``rabbitmqctl``, a module's private ``node`` or the cluster) once per version:
``local`` on the shared broker as ever, a 4.x version on one private node of the session's
(``Matrix``). ``--broker-subset=marked`` (or ``$ACEMQ_BROKER_SUBSET``) keeps, on 4.x, only
the tests marked ``version_changed`` (their subject a version changed), as CI runs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from tests.faults.private_node import PrivateNode

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "brokers"
VERSIONS = ("local", "4.0", "4.3")
"""The broker versions of the matrix: the machine's own, then the cached roots'."""
MAKE_TIMEOUT_S = 900.0
RUN = secrets.token_hex(3)  # in every node's name: two runs on one machine never meet


# The broker's log line when its consumer_timeout takes a channel's deliveries back, on
# every version (read from each version's rabbit_channel):
#   3.10.8: "Consumer ~s on channel ~w has timed out waiting for delivery acknowledgement."
#   4.0.5, 4.3.6: "Consumer '~ts' on channel ~w and ~ts has timed out waiting for a consumer
#   acknowledgement of a delivery with delivery tag = ~b."
# tests/unit/test_log_patterns.py shows that it matches each.
CONSUMER_TIMED_OUT = re.compile(
    r"has timed out waiting for (?:delivery|a consumer) acknowledgement"
)


def node_name(label: str) -> str:
    """A node name of this run's own: ``acemq-LABEL-RUN@localhost``."""
    return f"acemq-{label}-{RUN}@localhost"


def in_root(root: Path) -> tuple[str, ...]:
    """The prefix that runs a command in ``root`` (chroot), with a ``/proc`` of its own.

    RabbitMQ 4.x reads its memory use from ``/proc``: without it the memory monitor does
    not run (no memory alarm, ``set_vm_memory_high_watermark`` and ``status`` fail). The
    command runs in a mount namespace of its own (``unshare``) where ``/proc`` is mounted
    on the root's; the mount goes with the namespace's last process, the node's VM.
    """
    script = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root))


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
    from tests.faults.private_node import private_node  # noqa: PLC0415 - conftest imports us

    root = broker_root(version)
    with private_node(name, conf=conf, advanced=advanced, root=root) as node:
        inside = () if root is None else in_root(root)
        reported = subprocess.run(
            [*inside, "rabbitmqctl", "-n", node.name, "version"],
            capture_output=True,
            check=True,
            text=True,
            timeout=60,
        )
        yield VersionedNode(node, reported.stdout.strip().splitlines()[-1])


# --- the suites as a matrix of broker versions -------------------------------------------

LOCAL = "local"
MARKER = "version_changed"
"""The marker of a test whose subject a broker version changed (``--broker-subset=marked``)."""
WIRE_SUITES = frozenset({"integration", "e2e", "faults", "cluster", "interop"})
SUBSETS = ("all", "marked")


def add_options(parser: pytest.Parser) -> None:
    """``--broker-versions`` and ``--broker-subset`` (see the module docstring)."""
    group = parser.getgroup("broker versions", "the suites as a matrix of RabbitMQ versions")
    group.addoption(
        "--broker-versions",
        default=os.environ.get("ACEMQ_BROKER_VERSIONS", LOCAL),
        help=f"comma-separated, of {', '.join(VERSIONS)} (default: $ACEMQ_BROKER_VERSIONS"
        f" or {LOCAL})",
    )
    group.addoption(
        "--broker-subset",
        default=os.environ.get("ACEMQ_BROKER_SUBSET", "all"),
        choices=SUBSETS,
        help=f"on versions other than {LOCAL}: every test (all) or those marked {MARKER}"
        " (marked); default $ACEMQ_BROKER_SUBSET or all",
    )


def selected_versions(config: pytest.Config) -> tuple[str, ...]:
    """The versions ``--broker-versions`` names, in the matrix's order."""
    named = {v.strip() for v in str(config.getoption("--broker-versions")).split(",")}
    named.discard("")
    unknown = named - set(VERSIONS)
    if unknown or not named:
        raise pytest.UsageError(
            f"--broker-versions: {', '.join(sorted(unknown)) or 'none named'};"
            f" known: {', '.join(VERSIONS)}"
        )
    return tuple(version for version in VERSIONS if version in named)


def parametrise(metafunc: pytest.Metafunc) -> None:
    """Run a test that takes ``broker_version`` once per selected version."""
    if "broker_version" in metafunc.fixturenames:
        versions = selected_versions(metafunc.config)
        metafunc.parametrize("broker_version", versions, indirect=True, scope="session")


def _runs(item: pytest.Item, suite: str, versions: tuple[str, ...], subset: str) -> bool:
    callspec = getattr(item, "callspec", None)
    version = None if callspec is None else callspec.params.get("broker_version")
    if version is None:  # a wire test of no version runs with the local broker's
        return suite not in WIRE_SUITES or LOCAL in versions
    if version == LOCAL or subset == "all":
        return True
    marker = item.get_closest_marker(MARKER)
    return marker is not None and (not marker.args or version in marker.args)


def deselect(config: pytest.Config, items: list[pytest.Item], suites: Iterable[str]) -> None:
    """Drop what the selected versions and subset leave out (``suites``: each item's)."""
    versions = selected_versions(config)
    subset = str(config.getoption("--broker-subset"))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item, suite in zip(items, suites, strict=True):
        (kept if _runs(item, suite, versions, subset) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@dataclass
class Matrix:
    """The session's private node of each 4.x version, started on first use, stopped at the end."""

    stack: contextlib.ExitStack
    nodes: dict[str, VersionedNode]

    def node(self, version: str) -> VersionedNode:
        """The node of ``version`` (not ``local``: that is the shared broker)."""
        assert version != LOCAL, "the local version is the shared broker, not a private node"
        if version not in self.nodes:
            name = node_name(f"matrix{version_slug(version)}")
            self.nodes[version] = self.stack.enter_context(versioned_node(version, name))
        return self.nodes[version]


def version_slug(version: str) -> str:
    """The version as a node name may hold it: ``local``, ``40``, ``43``."""
    return re.sub(r"[^0-9a-z]", "", version)


@contextlib.contextmanager
def module_node(
    version: str, label: str, *, conf: str = "", advanced: str = "[]."
) -> Iterator[PrivateNode]:
    """A test module's own private node of ``version`` (``label`` names it); stopped after."""
    from tests.faults.private_node import private_node  # noqa: PLC0415 - conftest imports us

    name = node_name(f"{label}{version_slug(version)}")
    with private_node(name, conf=conf, advanced=advanced, root=broker_root(version)) as node:
        yield node


def differs_on(
    request: pytest.FixtureRequest,
    versions: tuple[str, ...],
    reason: str,
    *,
    raises: type[BaseException] | tuple[type[BaseException], ...],
) -> None:
    """Expect the test to fail (strictly) on ``versions``, with ``raises`` and for ``reason``.

    Any other failure there (a crash, a lost message that fails another way) fails the run:
    the expected one names what the difference makes the test meet.
    """
    if request.getfixturevalue("broker_version") in versions:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason, raises=raises))
