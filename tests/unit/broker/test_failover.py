"""Failover between the nodes of a cluster: shuffled once, walked round, backing off per round."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.broker import BrokerAddress, Failover

NODES = tuple(BrokerAddress.parse(f"amqp://relay:pw@rabbit-{i}/") for i in range(3))


def test_replicas_started_with_one_list_spread_over_the_nodes() -> None:
    """Each process draws its own order: over 3,000 processes each node comes first ~1/3."""
    firsts = Counter(
        Failover.shuffled(NODES, rng=random.Random(seed)).next_address().host
        for seed in range(3000)
    )
    assert set(firsts) == {"rabbit-0", "rabbit-1", "rabbit-2"}
    assert all(800 < count < 1200 for count in firsts.values()), firsts


@given(seed=st.integers(), steps=st.integers(min_value=1, max_value=20))
def test_the_ring_visits_every_node_in_turn(seed: int, steps: int) -> None:
    """A lost node is tried again last: the next address is always the one after."""
    failover = Failover.shuffled(NODES, rng=random.Random(seed))
    assert sorted(a.host for a in failover.addresses) == ["rabbit-0", "rabbit-1", "rabbit-2"]
    tried = [failover.next_address() for _ in range(steps)]
    assert tried == [failover.addresses[i % 3] for i in range(steps)]


def test_it_backs_off_only_after_a_whole_round_failed() -> None:
    """Three nodes: two failures move on at once, the third means every node is down."""
    failover = Failover.shuffled(NODES, rng=random.Random(1))
    assert [failover.failed() for _ in range(7)] == [False, False, True, False, False, True, False]


def test_a_connection_forgets_the_failures_before_it() -> None:
    failover = Failover.shuffled(NODES, rng=random.Random(1))
    failover.failed()
    failover.failed()
    failover.connected()
    assert [failover.failed() for _ in range(3)] == [False, False, True]


def test_one_address_backs_off_after_every_failure() -> None:
    """A single URL (one Service in Kubernetes) behaves as before failover existed."""
    failover = Failover.shuffled(NODES[:1], rng=random.Random(1))
    assert [failover.failed() for _ in range(3)] == [True, True, True]
    assert failover.next_address() == failover.next_address() == NODES[0]


def test_a_reload_keeps_the_ring_unless_the_nodes_changed() -> None:
    """The same nodes keep their order and place; new ones are shuffled afresh."""
    rng = random.Random(7)
    failover = Failover.shuffled(NODES, rng=rng)
    failover.next_address()
    assert failover.replaced(tuple(reversed(NODES)), rng=rng) is failover
    new = failover.replaced(NODES[:2], rng=rng)
    assert new is not failover
    assert set(new.addresses) == set(NODES[:2])


def test_no_address_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Failover.shuffled((), rng=random.Random(1))
