"""What /readyz and route_up say of one route as deliveries are held and let go: RouteState."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.observe.route_log import RouteLog
from sidecar.relay.state import HeldDelivery, RouteState


def make_state() -> tuple[RouteState, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="test", contract="1.1")
    clock = Clock(now_ms=lambda: 0, monotonic=lambda: 0.0)
    state = RouteState("orders", metrics=metrics, log=RouteLog("orders"), clock=clock)
    return state, registry


def route_up(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("acemq_sidecar_route_up", {"route": "orders"})


def test_an_idle_route_is_up_again_once_the_broker_took_its_held_deliveries() -> None:
    """Held, channel taken away and reopened, the held ones let go: up again.

    No new message is needed: the route does not stay 503 until the next ack.
    """
    state, registry = make_state()
    state.consuming(queue="staging.orders", exchange="orders")
    held = [HeldDelivery(state) for _ in range(3)]
    for one in held:
        one.take("quarantine exchange returned the copy")
    assert route_up(registry) == 0
    state.channel_closed("channel closed by the broker: 406 delivery acknowledgement timed out")
    state.consuming(queue="staging.orders", exchange="orders")  # reopened, old ones still held
    assert state.pause_reason is not None
    for one in held:
        one.release()  # their settlers see the old channel gone and let go
    assert state.pause_reason is None
    assert route_up(registry) == 1


def test_letting_go_of_held_deliveries_does_not_resume_a_closed_channel() -> None:
    state, registry = make_state()
    state.consuming(queue="staging.orders", exchange="orders")
    one = HeldDelivery(state)
    one.take("nacked")
    state.channel_closed("connection lost")
    one.release()
    assert state.pause_reason == "connection lost"
    assert route_up(registry) == 0


def test_letting_go_does_not_hide_a_pause_that_is_not_the_holds() -> None:
    """A missing exchange stays reported until the route proves otherwise."""
    state, _ = make_state()
    state.consuming(queue="staging.orders", exchange="orders")
    one = HeldDelivery(state)
    one.take("nacked")
    state.pause('exchange "orders" does not exist; create it')
    one.release()
    assert state.pause_reason == 'exchange "orders" does not exist; create it'


def test_the_last_held_delivery_settled_resumes_the_route() -> None:
    state, registry = make_state()
    state.consuming(queue="staging.orders", exchange="orders")
    first, second = HeldDelivery(state), HeldDelivery(state)
    first.take("nacked")
    second.take("nacked")
    first.release()
    assert state.pause_reason == "nacked"
    second.release()
    state.settled()
    assert state.pause_reason is None
    assert route_up(registry) == 1
