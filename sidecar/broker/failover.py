"""Which broker address to try next: the nodes of a cluster, shuffled once, then in turn.

Pure: no I/O, no clock. The dialer asks :meth:`Failover.next_address` before each
connection attempt and reports what came of it; this module decides the order and when a
whole round has failed (then, and only then, the dialer backs off).

The conventions followed: the RabbitMQ Java client takes a list of addresses and tries
them one after the other until one answers, and the shovel takes a list of URIs and picks
among them at random. Here the list is shuffled once per process (so that replicas
started with the same list spread over the nodes), then walked round: a lost connection
moves on to the next address, so a node that just died is the last one tried again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# Read at run time too: the compiled build (scripts/compile) builds the dataclass below
# from its annotations.
from sidecar.broker.address import BrokerAddress  # noqa: TC001

if TYPE_CHECKING:
    import random

__all__ = ["Failover"]


@dataclass(slots=True)
class Failover:
    """A ring of broker addresses in this process's order, and the failures in a row."""

    addresses: tuple[BrokerAddress, ...]
    _next: int = field(default=0, repr=False)
    _failures: int = field(default=0, repr=False)

    @classmethod
    def shuffled(cls, addresses: tuple[BrokerAddress, ...], *, rng: random.Random) -> Failover:
        """Return a ring of ``addresses`` in an order drawn from ``rng`` (once: keep it)."""
        if not addresses:
            raise ValueError("a failover needs at least one broker address")
        order = list(addresses)
        rng.shuffle(order)
        return cls(tuple(order))

    def next_address(self) -> BrokerAddress:
        """Return the address to try now; the one after it comes next time."""
        address = self.addresses[self._next]
        self._next = (self._next + 1) % len(self.addresses)
        return address

    def failed(self) -> bool:
        """Record a failed attempt; return True when every address failed in a row.

        True once per round: the service backs off then, and tries the next round.
        """
        self._failures += 1
        if self._failures >= len(self.addresses):
            self._failures = 0
            return True
        return False

    def connected(self) -> None:
        """Record a connection that opened: the failures so far no longer count."""
        self._failures = 0

    def replaced(self, addresses: tuple[BrokerAddress, ...], *, rng: random.Random) -> Failover:
        """Return the ring for a reloaded address list: this one if it is the same set."""
        if set(addresses) == set(self.addresses):
            return self
        return Failover.shuffled(addresses, rng=rng)
