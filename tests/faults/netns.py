"""Test hosts of the tests' own: a network namespace joined to this host by veth links.

``net_host`` makes a namespace with one veth pair per link, each a /30 of its own in
10.213.0.0/16 (the host's end ``.1``, the namespace's ``.2``), and an ``unreachable`` route
for that /16 at a high metric, so that no packet of a test ever follows the default route
off the machine. ``Link.cut`` takes the namespace's end down: every packet across the link
is dropped, with no FIN and no RST, as a NAT or a load balancer that forgot the connection
would. (The host's end is never taken down: its route would go with it.) ``Link.mend``
brings it back. At the end every process in the namespace is killed, and the links, the
namespace and the route (if this made it) are removed.

Needs root and iproute2's ``ip``: skipped without them, failed under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

SUBNET = "10.213.0.0/16"
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
    subnets come from the process id, so two runs at once do not share one.
    """
    _require()
    name = f"acemq-{tag}"
    base = os.getpid() % 60 * 4  # the third octet of this run's first link
    made: list[Link] = []
    added_route = False
    ip("netns", "del", name, check=False)  # one a killed run left behind
    ip("netns", "add", name)
    try:
        if "unreachable" not in ip("route", "show", SUBNET).stdout:
            ip("route", "add", "unreachable", SUBNET, "metric", UNREACHABLE_METRIC)
            added_route = True
        ip("-n", name, "link", "set", "lo", "up")
        for index in range(links):
            octet = base + index
            link = Link(
                namespace=name,
                host_end=f"ac{tag}{index}h"[:15],
                inside_end=f"ac{tag}{index}n"[:15],
                host_address=f"10.213.{octet}.1",
                inside_address=f"10.213.{octet}.2",
            )
            ip("link", "del", link.host_end, check=False)
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
        if added_route:
            ip("route", "del", "unreachable", SUBNET, "metric", UNREACHABLE_METRIC, check=False)


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
