"""The probes' decisions from a snapshot: what /healthz and /readyz say, branch by branch."""

from __future__ import annotations

from sidecar.broker import BrokerAddress
from sidecar.observe.probes import liveness, readiness

NODE = BrokerAddress.parse("amqp://relay:s3cret@rabbit-1:5672/")


def test_a_loop_that_ticked_within_the_limit_is_alive() -> None:
    """Exactly at the limit is still alive: only a longer silence fails /healthz."""
    assert liveness(stopping=False, stale_s=60.0, limit_s=60.0).ok


def test_a_loop_silent_past_the_limit_is_reported_dead_with_the_silence() -> None:
    """The kubelet restarts a sidecar whose loop is stuck; the body says for how long."""
    probe = liveness(stopping=False, stale_s=75.2, limit_s=60.0)
    assert not probe.ok
    assert probe.detail == "event loop has not run for 75s"


def test_a_stopping_process_is_alive_however_long_since_the_last_tick() -> None:
    """Draining ends the ticks; a restart then would cut the drain short."""
    probe = liveness(stopping=True, stale_s=10_000.0, limit_s=60.0)
    assert probe.ok
    assert probe.detail == "stopping"


def test_a_blocked_broker_is_not_ready_and_named_first() -> None:
    """A memory or disk alarm publishes nothing: /readyz says so before any route line."""
    probe = readiness(
        connected=True,
        routes=["orders", "invoices"],
        pause_reasons={"orders": None, "invoices": "held: the broker nacked a copy"},
        blocked="low on memory",
        node=NODE,
    )
    assert not probe.ok
    assert probe.detail == (
        "broker: blocked: low on memory\nroute invoices: held: the broker nacked a copy"
    )
    assert probe.report == {
        "ready": False,
        "broker": "blocked: low on memory",
        "routes": {"orders": "consuming", "invoices": "held: the broker nacked a copy"},
        "node": "amqp://relay:***@rabbit-1:5672/",
    }


def test_ready_names_the_node_with_its_password_masked() -> None:
    """Which cluster node serves this replica, never its password."""
    probe = readiness(
        connected=True, routes=["orders"], pause_reasons={"orders": None}, blocked=None, node=NODE
    )
    assert probe.ok
    assert probe.detail == "ok"
    assert probe.report == {
        "ready": True,
        "broker": "connected",
        "routes": {"orders": "consuming"},
        "node": "amqp://relay:***@rabbit-1:5672/",
    }
    assert "s3cret" not in str(probe.report)


def test_a_worker_of_a_route_no_longer_in_the_map_is_not_reported() -> None:
    """A removed route's worker may still drain; readiness is about the routes of the map."""
    probe = readiness(
        connected=True,
        routes=["orders"],
        pause_reasons={"orders": None, "gone": "stopping"},
        blocked=None,
        node=None,
    )
    assert probe.ok
    assert probe.report == {"ready": True, "broker": "connected", "routes": {"orders": "consuming"}}
