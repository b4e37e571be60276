"""A three-node RabbitMQ cluster on this machine, of the test session's own.

Each node has its own name (``acemq-RUN-c1@localhost`` ..., RUN drawn per session, so
that two runs on one machine never meet), AMQP port (loopback only),
distribution port, config, data and log folders, started the way
``tests/faults/private_node.py`` starts one node. The nodes share an Erlang cookie drawn for
the session and passed to the server (``-setcookie``) and to every ``rabbitmqctl``
(``--erlang-cookie``): nothing else on the machine can reach them, and no command of these
tests can reach the shared broker, whose cookie differs. c2 and c3 ``join_cluster`` c1.

The cluster runs with ``cluster_partition_handling = pause_minority`` (docs/scaling.md says
why), and is stopped and its folder removed at the end whatever happened.

Given test hosts (``tests/faults/netns.py``'s ``net_hosts``), each node runs inside its own,
named for that host (``acemq-RUN-c1@p1``), its nodes' traffic on the hosts' bridge and its
clients' on the host's own link: a partition of one host from the others leaves its clients
connected.

Given a root file system (``scripts/brokers``: RabbitMQ 4.0 or 4.3, tests/brokers.py), the
three nodes and every CLI command run in it through ``chroot``, their folder under the
root's ``/tmp`` and named to them by the path it has inside the root.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.brokers import in_root
from tests.e2e.conftest import free_port
from tests.faults.conftest import RabbitCtl
from tests.faults.private_node import rabbitmq_ids

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.netns import NetHost

MEMBERS = ("c1", "c2", "c3")
START_TIMEOUT_S = 240.0  # a node starts in 10 to 40 s; on a machine loaded by others, more
CTL_TIMEOUT_S = 90.0
POLL_S = 0.5
NET_TICKTIME_S = 8  # the nodes' silence that parts them: found in 6 to 10 s
CONFIG = """\
listeners.tcp.local = {listen}:{amqp_port}
cluster_partition_handling = pause_minority
loopback_users = none
"""


@dataclass
class Node:
    """One node of the cluster: where to connect, how to reach it with rabbitmqctl."""

    name: str
    amqp_port: int
    dist_port: int
    base: Path
    cookie: str = field(repr=False)
    inside: tuple[str, ...] = ()  # the prefix that runs a command in its test host or root
    address: str = "127.0.0.1"  # where its clients reach it
    start_output: str = ""  # what the last start printed, for a failure message
    root: Path | None = None  # the root file system it runs in (chroot), if any
    taken_down: bool = False  # stopped or killed by a test, not yet started again

    @property
    def in_test_host(self) -> bool:
        """Whether the node runs in a test host's network namespace."""
        return bool(self.inside) and self.root is None

    @property
    def seen(self) -> Path:
        """The node's folder as the node sees it (inside its root, if it has one)."""
        return self.base if self.root is None else Path("/") / self.base.relative_to(self.root)

    @property
    def url(self) -> str:
        """The node's AMQP URL (guest may log in: the listener is loopback only)."""
        return f"amqp://guest:guest@{self.address}:{self.amqp_port}/"

    @property
    def endpoint(self) -> str:
        """``ADDRESS:PORT``, as the sidecar's /readyz and logs name the node."""
        return f"{self.address}:{self.amqp_port}"

    @property
    def ctl(self) -> RabbitCtl:
        """``rabbitmqctl`` for this node alone (the session's cookie, its name)."""
        return RabbitCtl(command=self._command("rabbitmqctl"), vhost="/")

    def _command(self, tool: str) -> tuple[str, ...]:
        return (*self.inside, tool, "--erlang-cookie", self.cookie, "-n", self.name)

    def run(self, tool: str, *args: str, check: bool = True) -> str:
        """Run a RabbitMQ CLI tool against this node; fail the test if it fails (``check``)."""
        result = subprocess.run(
            [*self._command(tool), *args],
            capture_output=True,
            check=False,
            text=True,
            timeout=CTL_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            pytest.fail(f"{tool} {' '.join(args)} on {self.name}: {result.stdout}{result.stderr}")
        return result.stdout

    def environment(self) -> dict[str, str]:
        """The environment ``rabbitmq-server`` starts this node with."""
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.seen / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.seen / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.seen / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.seen / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.seen / "rabbitmq-env.conf"),
            # In a test host, a partition is to be seen in seconds, not the default minute.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-setcookie {self.cookie}"
            + (f" -kernel net_ticktime {NET_TICKTIME_S}" if self.in_test_host else ""),
        }

    def write_files(self) -> None:
        """Write the node's config, plugins (none) and environment file."""
        self.base.mkdir(parents=True, exist_ok=True)
        # In a test host every address is the test's own; on this one, loopback only.
        listen = "0.0.0.0" if self.in_test_host else "127.0.0.1"  # noqa: S104
        (self.base / "rabbitmq.conf").write_text(
            CONFIG.format(listen=listen, amqp_port=self.amqp_port), encoding="utf-8"
        )
        (self.base / "enabled_plugins").write_text("[].\n", encoding="utf-8")
        # Our own environment file: the system one names the shared node. On this host the
        # nodes' own traffic stays on loopback.
        env_file = f"NODENAME={self.name}\n"
        if not self.in_test_host:
            env_file += 'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"\n'
        (self.base / "rabbitmq-env.conf").write_text(env_file, encoding="utf-8")
        _hand_to_rabbitmq(self.base, self.root)

    def start(self) -> None:
        """``rabbitmq-server -detached`` (returns before the node is up: see await_up)."""
        self.taken_down = False
        started = subprocess.run(
            [*self.inside, "rabbitmq-server", "-detached"],
            env=self.environment(),
            capture_output=True,
            check=False,
            text=True,
            timeout=CTL_TIMEOUT_S,
        )
        self.start_output = (
            f"rabbitmq-server exited {started.returncode}: {started.stdout}{started.stderr}"
        )

    def is_up(self) -> bool:
        """Whether the node answers ``await_startup`` now."""
        result = subprocess.run(
            [*self._command("rabbitmqctl"), "await_startup", "--timeout", "5"],
            capture_output=True,
            check=False,
            timeout=CTL_TIMEOUT_S,
        )
        return result.returncode == 0

    def await_up(self) -> None:
        """Wait until the node runs RabbitMQ; fail with its log if it does not in time."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.is_up():
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.name} did not start in {START_TIMEOUT_S:g}s\n{self.start_output}\n"
                    f"{self.log_tail()}"
                )
            time.sleep(POLL_S)

    def os_pid(self) -> int:
        """The node's Erlang VM process (beam.smp)."""
        return int(self.run("rabbitmqctl", "eval", "list_to_integer(os:getpid()).").strip())

    def kill(self) -> None:
        """``kill -9`` the node's VM: no goodbye to its peers or its clients."""
        pid = self.os_pid()
        self.taken_down = True
        self._sigkill(pid)

    def kill_vm(self) -> None:
        """``kill -9`` the node's VM if it runs, found by its environment (no CLI call)."""
        for pid in vm_pids(self.name):
            self._sigkill(pid)

    def _sigkill(self, pid: int) -> None:
        """SIGKILL the node's VM ``pid`` and wait until it is gone."""
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + CTL_TIMEOUT_S
        while _alive(pid):
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} (pid {pid}) survived SIGKILL")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the node (the VM too); its quorum queue members go with it."""
        self.taken_down = True
        self.run("rabbitmqctl", "stop")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the node's log, for a failure message."""
        logs = sorted(self.base.glob("log/*.log"))
        if not logs:
            return "(no node log)"
        text = logs[-1].read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


def vm_pids(name: str) -> list[int]:
    """The Erlang VMs (beam.smp) started with ``RABBITMQ_NODENAME=name``, chroot or not."""
    wanted = f"RABBITMQ_NODENAME={name}".encode()
    pids: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"beam.smp" not in (proc / "cmdline").read_bytes().split(b"\0", 1)[0]:
                continue
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def _hand_to_rabbitmq(base: Path, root: Path | None) -> None:
    """Let the server, which the scripts run as ``rabbitmq`` under root, write its folder."""
    if os.geteuid() != 0:
        return
    ids = rabbitmq_ids(root)
    if ids is None:
        return
    for path in [base.parent, base, *base.rglob("*")]:
        os.chown(path, *ids)


@dataclass
class Cluster:
    """Three running nodes joined in one cluster."""

    nodes: tuple[Node, ...]

    @property
    def urls(self) -> list[str]:
        """Every node's AMQP URL, c1 first."""
        return [node.url for node in self.nodes]

    def node(self, endpoint: str) -> Node:
        """The node serving AMQP at ``endpoint`` (``127.0.0.1:PORT``)."""
        return next(node for node in self.nodes if node.endpoint == endpoint)

    def others(self, *nodes: Node) -> list[Node]:
        """The nodes not given."""
        return [node for node in self.nodes if node not in nodes]

    def running(self) -> list[str]:
        """The nodes that run RabbitMQ by their own word and as the first of them sees them.

        Asked of each node: a node paused by ``pause_minority`` may still be counted
        running by its peers for a while, and it answers nothing until it resumes (a
        consumer it held keeps its unacked deliveries until then).
        """
        up = [node for node in self.nodes if node.is_up()]
        if not up:
            return []
        out = up[0].run("rabbitmqctl", "eval", "rabbit_nodes:all_running().")
        return sorted(node.name for node in up if f"'{node.name}'" in out)

    def wait_all_running(self) -> None:
        """Wait until every node runs and sees the other two."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while (running := self.running()) != sorted(node.name for node in self.nodes):
            if time.monotonic() > deadline:
                pytest.fail(f"the cluster did not come back: only {running} run")
            time.sleep(POLL_S)

    def leader(self, queue: str) -> Node:
        """The node that leads a quorum queue now."""
        for node in self.nodes:
            if not node.is_up():
                continue
            out = node.run(
                "rabbitmqctl", "list_queues", "name", "leader", "--no-table-headers", "-q"
            )
            for line in out.splitlines():
                name, _, leader = line.partition("\t")
                if name == queue:
                    return next(n for n in self.nodes if n.name == leader.strip())
        pytest.fail(f"no node knows a leader of {queue}")

    def beam_pids(self) -> list[int]:
        """The Erlang VM process of every running node (for CPU from /proc)."""
        return [node.os_pid() for node in self.nodes if node.is_up()]


def _require_rabbitmq() -> None:
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        message = "rabbitmq-server is not installed: the three-node cluster cannot start"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def three_node_cluster(
    hosts: tuple[NetHost, ...] = (), *, root: Path | None = None
) -> Iterator[Cluster]:
    """Start three nodes, join them, yield the cluster; stop them and remove their folder after.

    Refuses to start when a node of one of these names already runs (it may be somebody's,
    or a previous run's left behind: ``rabbitmqctl -n NAME stop`` with its cookie).
    ``hosts``: three test hosts to run the nodes in; ``root``: the root file system to run
    them from (see the module docstring).
    """
    assert not (hosts and root), "the nodes run in test hosts or in a root, not both"
    if root is None:
        _require_rabbitmq()
    cookie = secrets.token_hex(16).upper()
    run = secrets.token_hex(3)  # two runs at once (CI and a developer) must not share names
    parent = None if root is None else root / "tmp"
    chrooted: tuple[str, ...] = () if root is None else in_root(root)
    with tempfile.TemporaryDirectory(prefix="acemq-cluster-", dir=parent) as folder:
        nodes = tuple(
            Node(
                name=f"acemq-{run}-{member}@{host.hostname if host else 'localhost'}",
                amqp_port=free_port(),
                dist_port=free_port(),
                base=Path(folder) / member,
                cookie=cookie,
                inside=host.exec if host else chrooted,
                address=host.links[0].inside_address if host else "127.0.0.1",
                root=root,
            )
            for member, host in zip(MEMBERS, hosts or (None,) * len(MEMBERS), strict=True)
        )
        for node in nodes:
            if subprocess.run(
                [*node.inside, "epmd", "-names"],
                capture_output=True,
                check=False,
                text=True,
                timeout=10,
            ).stdout.count(f"name {node.name.partition('@')[0]} "):
                pytest.fail(f"a node called {node.name} already runs; stop it first")
        try:
            for node in nodes:
                node.write_files()
                node.start()
            for node in nodes:
                node.await_up()
            first = nodes[0]
            for node in nodes[1:]:
                node.run("rabbitmqctl", "stop_app")
                node.run("rabbitmqctl", "join_cluster", first.name)
                node.run("rabbitmqctl", "start_app")
            cluster = Cluster(nodes)
            cluster.wait_all_running()
            yield cluster
        finally:
            # Killed, not stopped: the nodes are thrown away with their folders, and a
            # graceful stop of three (each waiting on its quorum queues' peers) took 38 s.
            for node in nodes:
                node.kill_vm()
