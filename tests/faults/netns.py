"""Test hosts of the tests' own: a network namespace joined to this host by veth links.

``net_host`` makes a namespace with one veth pair per link, each a /30 of its own in
10.213.0.0/16 (the host's end ``.1``, the namespace's ``.2``), and an ``unreachable`` route
for that /16 at a high metric, so that no packet of a test ever follows the default route
off the machine. Every name carries the test process's id (the namespace's in decimal,
the interfaces' and the bridge's in hex, to fit 15 characters): two runs at once never
touch each other's, and what a killed run left behind (its id no longer alive) is swept
away, the processes inside first, by the next run.

``Link.cut`` takes the namespace's end down: every packet across the link is dropped,
with no FIN and no RST, as a NAT or a load balancer that forgot the connection would. (The
host's end is never taken down: its route would go with it.) ``Link.mend`` brings it back.
Each host runs its own Erlang port mapper (epmd), started with it. At the end every
process in the namespace is killed, and the links and the namespace are
removed; the route too once no test host is left.

``net_hosts`` makes several such hosts for a cluster: each has its own link to this host
(for clients) and a link to a bridge the hosts share (for the nodes' own traffic), with a
name of its own on that bridge in every host's ``/etc/hosts`` (``ip netns exec`` mounts
``/etc/netns/NAME/hosts`` there). Cutting a host's ``peer`` link parts it from the others
while its clients still reach it.

Needs root and iproute2's ``ip``: skipped without them, failed under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

SUBNET = "10.213.0.0/16"
# The third octet of each link's /30, from one drawn per process: two runs at once (CI and
# a developer's) rarely share one.
_OCTETS = itertools.count(os.getpid() % 25 * 8)
_PID = f"{os.getpid():x}"  # at most 6 hex digits (Linux's pid_max is 2**22)
NETNS_ETC = Path("/etc/netns")
_OURS = re.compile(r"acemq-\w+-(\d+)")
_OUR_BRIDGE = re.compile(r"ac-[a-z0-9]+-([0-9a-f]{1,6})")
UNREACHABLE_METRIC = "4000"
IP_TIMEOUT_S = 20.0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise with its output when ``check`` and it fails."""
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=False, timeout=IP_TIMEOUT_S
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


@dataclass(frozen=True, slots=True)
class Link:
    """One veth pair between the host and the namespace, with its two addresses."""

    namespace: str
    host_end: str
    inside_end: str
    host_address: str
    inside_address: str

    def cut(self) -> None:
        """Drop every packet across the link, silently: the namespace's end goes down."""
        ip("-n", self.namespace, "link", "set", self.inside_end, "down")

    def mend(self) -> None:
        """Carry packets again: the namespace's end comes back up."""
        ip("-n", self.namespace, "link", "set", self.inside_end, "up")


@dataclass(frozen=True, slots=True)
class NetHost:
    """A namespace and its links; ``exec`` runs a command inside it."""

    name: str
    links: tuple[Link, ...]
    peer: Link | None = None  # its link to the hosts' shared bridge (``net_hosts``)
    hostname: str = ""  # its name on that bridge, in every host's /etc/hosts

    @property
    def exec(self) -> tuple[str, ...]:
        """The prefix that runs a command inside the namespace."""
        return ("ip", "netns", "exec", self.name)


def _require() -> None:
    message = ""
    if shutil.which("ip") is None:
        message = "iproute2's ip is not installed: no test host can be made"
    elif os.geteuid() != 0:
        message = "making a network namespace needs root"
    if message:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def net_host(tag: str, *, links: int) -> Iterator[NetHost]:
    """Make a namespace ``acemq-<tag>`` with ``links`` veth links; remove it all after.

    ``tag`` (a few letters and digits) keeps the names of concurrent tests apart; the
    subnets are counted from one drawn by the process id.
    """
    _require()
    _sweep()
    name = f"acemq-{tag}-{os.getpid()}"
    made: list[Link] = []
    ip("netns", "add", name)
    try:
        if "unreachable" not in ip("route", "show", SUBNET).stdout:
            ip("route", "add", "unreachable", SUBNET, "metric", UNREACHABLE_METRIC)
        ip("-n", name, "link", "set", "lo", "up")
        _start_epmd(name)
        for index in range(links):
            octet = next(_OCTETS) % 200  # 200 and up: the bridges'
            link = Link(
                namespace=name,
                host_end=f"ac{tag}{_PID}{index}h",
                inside_end=f"ac{tag}{_PID}{index}n",
                host_address=f"10.213.{octet}.1",
                inside_address=f"10.213.{octet}.2",
            )
            ip("link", "add", link.host_end, "type", "veth", "peer", "name", link.inside_end)
            made.append(link)
            ip("link", "set", link.inside_end, "netns", name)
            ip("addr", "add", f"{link.host_address}/30", "dev", link.host_end)
            ip("link", "set", link.host_end, "up")
            ip("-n", name, "addr", "add", f"{link.inside_address}/30", "dev", link.inside_end)
            ip("-n", name, "link", "set", link.inside_end, "up")
        yield NetHost(name=name, links=tuple(made))
    finally:
        _kill_inside(name)
        for link in made:
            ip("link", "del", link.host_end, check=False)
        ip("netns", "del", name, check=False)
        if not _ours(ip("netns", "list", check=False).stdout.split()):
            ip("route", "del", "unreachable", SUBNET, "metric", UNREACHABLE_METRIC, check=False)


@contextlib.contextmanager
def net_hosts(tag: str, *, count: int) -> Iterator[tuple[NetHost, ...]]:
    """Make ``count`` test hosts with a client link each and a shared bridge; remove all after.

    Host ``i`` is ``acemq-<tag><i>-<pid>``, named ``<tag><i>`` on the bridge.
    """
    _require()
    _sweep()
    bridge = f"ac-{tag}-{_PID}"
    lan = 200 + os.getpid() % 50  # the bridge's /24: 10.213.<lan>.0
    names = [f"{tag}{index + 1}" for index in range(count)]
    hosts_file = "127.0.0.1 localhost\n" + "".join(
        f"10.213.{lan}.{index + 1} {name}\n" for index, name in enumerate(names)
    )
    folders = [NETNS_ETC / f"acemq-{name}-{os.getpid()}" for name in names]
    ip("link", "add", bridge, "type", "bridge")
    try:
        ip("link", "set", bridge, "up")
        with contextlib.ExitStack() as stack:
            made = []
            for index, (name, folder) in enumerate(zip(names, folders, strict=True)):
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text(hosts_file, encoding="utf-8")
                host = stack.enter_context(net_host(name, links=1))
                peer = Link(
                    namespace=host.name,
                    host_end=f"ac{name}{_PID}p",
                    inside_end=f"ac{name}{_PID}q",
                    host_address="",
                    inside_address=f"10.213.{lan}.{index + 1}",
                )
                ip("link", "add", peer.host_end, "type", "veth", "peer", "name", peer.inside_end)
                stack.callback(ip, "link", "del", peer.host_end, check=False)
                ip("link", "set", peer.inside_end, "netns", host.name)
                ip("link", "set", peer.host_end, "master", bridge)
                ip("link", "set", peer.host_end, "up")
                ip(
                    "-n",
                    host.name,
                    "addr",
                    "add",
                    f"{peer.inside_address}/24",
                    "dev",
                    peer.inside_end,
                )
                ip("-n", host.name, "link", "set", peer.inside_end, "up")
                made.append(NetHost(name=host.name, links=host.links, peer=peer, hostname=name))
            yield tuple(made)
    finally:
        ip("link", "del", bridge, check=False)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _ours(names: list[str]) -> list[tuple[str, int]]:
    """The test hosts among these namespace names, with the id of the process that made each."""
    return [(name, int(m[1])) for name in names if (m := _OURS.fullmatch(name))]


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _sweep() -> None:
    """Remove what killed runs left: their test hosts (processes first), bridges, hosts files."""
    for name, pid in _ours(ip("netns", "list", check=False).stdout.split()):
        if not _alive(pid):
            _kill_inside(name)
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        bridge = line.split(":")[1].strip()
        if (m := _OUR_BRIDGE.fullmatch(bridge)) and not _alive(int(m[1], 16)):
            ip("link", "del", bridge, check=False)
    for folder in NETNS_ETC.glob("acemq-*") if NETNS_ETC.is_dir() else ():
        if (m := _OURS.fullmatch(folder.name)) and not _alive(int(m[1])):
            shutil.rmtree(folder, ignore_errors=True)


def _start_epmd(name: str) -> None:
    """Start the host's own Erlang port mapper and wait until it answers.

    A node's start and the first ``rabbitmqctl`` would each start one otherwise; the
    loser of that race can take the node down with it before it has registered.
    """
    inside = ("ip", "netns", "exec", name)
    subprocess.run([*inside, "epmd", "-daemon"], check=False, timeout=IP_TIMEOUT_S)
    deadline = time.monotonic() + IP_TIMEOUT_S
    while subprocess.run(
        [*inside, "epmd", "-names"], capture_output=True, check=False, timeout=IP_TIMEOUT_S
    ).returncode:
        if time.monotonic() > deadline:
            pytest.fail(f"epmd did not start in test host {name}")
        time.sleep(0.1)


def _kill_inside(name: str) -> None:
    """Kill every process still in the namespace (a node's epmd, say), then wait a moment."""
    for _ in range(3):
        pids = [int(pid) for pid in ip("netns", "pids", name, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
