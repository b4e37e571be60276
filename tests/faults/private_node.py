"""A RabbitMQ node of a test's own: its name, ports, data and logs under a temporary folder.

For a fault that must not reach anybody else's broker (closing every connection, say):
``private_node`` starts ``rabbitmq-server -detached`` with its own node name, AMQP port
(loopback only), distribution port, config, plugins (none) and environment file, waits for
``await_startup``, yields the node, and stops it whatever happened. ``rabbitmqctl`` runs
with ``-n`` that node, so no command can land on the shared broker.

RabbitMQ's scripts run the server as the ``rabbitmq`` user when started by root: the
folder is handed to that user then.

Given a test host (``tests/faults/netns.py``), the node runs inside its network namespace,
listening on every address there (the host reaches it across the host's links), and every
``rabbitmqctl`` runs inside it too: the namespace has its own epmd.

Given a root file system (``scripts/brokers``: another RabbitMQ version's Debian packages),
the node and every ``rabbitmqctl`` run in it through ``chroot``; its folder is under the
root's ``/tmp``, named to the node by the path it has inside the root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.brokers import in_root
from tests.e2e.conftest import free_port
from tests.faults.conftest import RabbitCtl

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.netns import NetHost

START_TIMEOUT_S = 90.0
CTL_TIMEOUT_S = 60.0
POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class PrivateNode:
    """A running private node: where to connect, and rabbitmqctl for it alone."""

    name: str
    amqp_port: int
    base: Path
    inside: tuple[str, ...] = ()  # the prefix that runs a command where the node runs

    @property
    def url(self) -> str:
        """The AMQP URL of the node (guest may log in: the listener is loopback only)."""
        return self.url_at("127.0.0.1")

    def url_at(self, host: str) -> str:
        """The AMQP URL of the node at ``host`` (an address of its test host's links)."""
        return f"amqp://guest:guest@{host}:{self.amqp_port}/"

    @property
    def ctl(self) -> RabbitCtl:
        """``rabbitmqctl -n NAME`` on the default vhost."""
        return RabbitCtl(command=(*self.inside, "rabbitmqctl", "-n", self.name), vhost="/")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the node's log, for a failure message."""
        logs = sorted(self.base.glob("log/*.log"))
        if not logs:
            return "(no node log)"
        text = logs[-1].read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _ctl(name: str, *args: str, inside: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*inside, "rabbitmqctl", "-n", name, *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=CTL_TIMEOUT_S,
    )


def rabbitmq_ids(root: Path | None) -> tuple[int, int] | None:
    """The ``rabbitmq`` user's uid and gid: the host's, or those in ``root``'s passwd."""
    if root is None:
        try:
            user = pwd.getpwnam("rabbitmq")
        except KeyError:
            return None
        return user.pw_uid, user.pw_gid
    for line in (root / "etc/passwd").read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if fields[0] == "rabbitmq":
            return int(fields[2]), int(fields[3])
    return None


def _hand_to_rabbitmq(base: Path, root: Path | None = None) -> None:
    """Let the server, which the scripts run as ``rabbitmq`` under root, write its folder."""
    if os.geteuid() != 0:
        return
    ids = rabbitmq_ids(root)
    if ids is None:
        return
    for path in [base, *base.rglob("*")]:
        os.chown(path, *ids)


@contextlib.contextmanager
def private_node(
    name: str,
    *,
    conf: str = "",
    advanced: str = "[].",
    host: NetHost | None = None,
    root: Path | None = None,
) -> Iterator[PrivateNode]:
    """Start a node called ``name`` (``short@localhost``) in a new folder; stop it after.

    ``conf`` adds lines to its rabbitmq.conf (``consumer_timeout = 5000``...); ``advanced``
    is its advanced.config, for what rabbitmq.conf cannot set (``channel_tick_interval``).
    ``host``: run it inside that test host's namespace (see the module docstring).
    ``root``: run it from that root file system through chroot (``scripts/brokers``).

    The folder is under the system's temporary directory, not pytest's (which only its
    owner may enter), and is removed afterwards. Skips where RabbitMQ is not installed
    (fails under CI=true, where it must be), and refuses to start when a node of that
    name already runs: it may be somebody's.
    """
    if root is not None:
        assert host is None, "a node runs in a network namespace or a root, not both"
        inside: tuple[str, ...] = in_root(root)
    else:
        if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
            message = "rabbitmq-server is not installed: the private node cannot start"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)
        inside = host.exec if host is not None else ()
    if _ctl(name, "status", inside=inside).returncode == 0:
        pytest.fail(f"a node called {name} already runs; stop it: rabbitmqctl -n {name} stop")
    with _folder(None if root is None else root / "tmp") as folder:
        yield from _run_node(name, folder, conf=conf, advanced=advanced, inside=inside, root=root)


@contextlib.contextmanager
def _folder(parent: Path | None) -> Iterator[Path]:
    """A new folder, removed after; a node still exiting may write in it for a moment."""
    folder = Path(tempfile.mkdtemp(prefix="acemq-node-", dir=parent))
    try:
        yield folder
    finally:
        for _ in range(20):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                break
            time.sleep(POLL_S)


def _run_node(
    name: str,
    base: Path,
    *,
    conf: str,
    advanced: str,
    inside: tuple[str, ...],
    root: Path | None = None,
) -> Iterator[PrivateNode]:
    amqp_port, dist_port = free_port(), free_port()
    node = PrivateNode(name=name, amqp_port=amqp_port, base=base, inside=inside)
    # In a test host's namespace, every address there is the test's own.
    listen = "0.0.0.0" if inside else "127.0.0.1"  # noqa: S104
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.local = {listen}:{amqp_port}\n{conf}", encoding="utf-8"
    )
    (base / "advanced.config").write_text(f"{advanced}\n", encoding="utf-8")
    (base / "enabled_plugins").write_text("[].\n", encoding="utf-8")
    # Our own environment file: the system one names the shared node.
    (base / "rabbitmq-env.conf").write_text(
        f'NODENAME={name}\nexport ERL_FLAGS="-kernel inet_dist_use_interface {{127,0,0,1}}"\n',
        encoding="utf-8",
    )
    _hand_to_rabbitmq(base, root)
    seen = base if root is None else Path("/") / base.relative_to(root)  # the node's path
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(seen / "mnesia"),
        "RABBITMQ_LOG_BASE": str(seen / "log"),
        "RABBITMQ_CONFIG_FILE": str(seen / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(seen / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(seen / "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": str(seen / "rabbitmq-env.conf"),
    }
    started = subprocess.run(
        [*inside, "rabbitmq-server", "-detached"],
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=CTL_TIMEOUT_S,
    )
    try:
        _await_startup(node, output=f"{started.stdout}{started.stderr}")
        yield node
    finally:
        _ctl(name, "stop", inside=inside)


def _await_startup(node: PrivateNode, *, output: str) -> None:
    # await_startup fails at once until the node has registered with epmd: poll it.
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        result = _ctl(node.name, "await_startup", inside=node.inside)
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"private node {node.name} did not start within {START_TIMEOUT_S:g}s:"
                f" {result.stdout}{result.stderr}\n{output}\n{node.log_tail()}"
            )
        time.sleep(POLL_S)
