"""What the relay calls on tracing: Protocols, so that the relay never imports the SDK.

A route's ``RouteTracer`` starts a ``DeliveryTrace`` per delivery (None when the sampler
drops it: the delivery then goes on untraced, on either path); the trace hears the
settle step's events, makes a ``SendTrace`` per copy published and ends with the step's
last action. ``Tracing`` is the process's: a tracer per route, and the flush at the end.
No hook the relay calls raises: what a tracer raises stays in ``guard``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sidecar.routemap import Route
    from sidecar.settle import Ack, Answer, DeadLetter, Event, GiveBack, LetGo, Plan, Requeue
    from sidecar.wire import Delivery

__all__ = ["DeliveryTrace", "RouteTracer", "SendTrace", "Tracing"]


class SendTrace(Protocol):
    """One copy's PRODUCER span: started as it is published, ended by the broker's answer."""

    plan: Plan  # the plan to publish: a target copy may carry the send span's traceparent

    def answered(self, answer: Answer) -> None:
        """End the span with the broker's answer (its outcome, and an error type if it failed)."""


class DeliveryTrace(Protocol):
    """One delivery's CONSUMER span, from its arrival to its last action."""

    def saw(self, events: tuple[Event, ...]) -> None:
        """Record what the settle step saw: violations, the quarantine's reason, a bug."""

    def send(self, plan: Plan) -> SendTrace:
        """Start the span of one publish of ``plan``."""

    def end(self, action: Ack | DeadLetter | GiveBack | LetGo | Requeue | None) -> None:
        """End the span with the verdict ``action`` says (None: the delivery left unsettled)."""


class RouteTracer(Protocol):
    """One route's tracer."""

    def start(self, delivery: Delivery) -> DeliveryTrace | None:
        """Start a delivery's span from its headers' trace context; None: not sampled."""


class Tracing(Protocol):
    """The process's tracing: a tracer per route, flushed and stopped once at the end."""

    def for_route(self, route: Route, *, quarantine_exchange: str) -> RouteTracer:
        """Return the tracer of ``route``."""

    def shutdown(self, *, timeout_s: float) -> None:
        """Export what is queued, waiting at most ``timeout_s``; then stop exporting."""
