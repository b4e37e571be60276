"""A tracer that raises never reaches the relay: each hook returns, the failure is counted.

Unit tests of ``guard`` with spans whose every method raises, then the whole hop through
the real ``Settler`` with a span processor of the user's that raises at each span's end.
"""

from __future__ import annotations

import asyncio
import logging
from types import MappingProxyType
from typing import Any, NoReturn

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from sidecar.observe.tracing.guard import TraceFaults, guarded
from sidecar.observe.tracing.hooks import DeliveryTrace, SendTrace
from sidecar.observe.tracing.sampling import Parent
from sidecar.settle import Ack, Answer, Confirmed, Copy, Event, Outcome, Plan
from sidecar.wire import Delivery, PublishOutcome
from tests.unit.observe.test_tracing import Traced, delivery

PLAN = Copy(properties={}, headers={}, routing_key="k", outcome=Outcome.RELAYED)


def _raise(*_args: object) -> NoReturn:
    raise RuntimeError("a span processor's bug")


class RaisingSend:
    """A send span whose every method raises."""

    plan: Plan = PLAN

    def answered(self, answer: Answer) -> None:
        """Raise."""
        _raise(answer)


class RaisingTrace:
    """A process span whose every method raises but ``send`` (its send span raises)."""

    def saw(self, events: tuple[Event, ...]) -> None:
        """Raise."""
        _raise(events)

    def send(self, plan: Plan) -> SendTrace:
        """Start a send span that raises."""
        assert plan is PLAN
        return RaisingSend()

    def end(self, action: object) -> None:
        """Raise."""
        _raise(action)


class Dropped:
    """The span-drop counter, as ``Metrics.count_spans_dropped`` takes it."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, reason: str, count: int) -> None:
        """Count."""
        self.counts[reason] = self.counts.get(reason, 0) + count


def message() -> Delivery:
    empty: MappingProxyType[str, Any] = MappingProxyType({})
    return Delivery(
        delivery_tag=1,
        exchange="",
        routing_key="",
        redelivered=False,
        properties=empty,
        headers=empty,
        body=b"",
    )


def test_every_hook_returns_when_the_tracer_raises_and_each_failure_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dropped, now = Dropped(), [0.0]
    faults = TraceFaults(dropped=dropped, monotonic=lambda: now[0])

    def begin(_delivery: Delivery, _parent: Parent | None) -> DeliveryTrace:
        return RaisingTrace()

    with caplog.at_level(logging.WARNING, logger="sidecar.observe.tracing.guard"):
        trace = guarded(begin, faults)(message(), None)
        assert trace is not None
        for _ in range(2):  # the same failures again: counted, not logged again
            trace.saw(())
            send = trace.send(PLAN)
            assert send.plan is PLAN
            send.answered(Confirmed())
            trace.end(Ack(outcome=Outcome.RELAYED))
    assert dropped.counts == {"tracer_failed": 6}
    hooks = [record.__dict__["hook"] for record in caplog.records]
    assert hooks == ["saw", "answered", "end"]
    assert "a span processor's bug" in caplog.records[0].getMessage()


def test_a_span_that_cannot_start_leaves_the_delivery_untraced() -> None:
    dropped = Dropped()
    assert guarded(_raise, TraceFaults(dropped=dropped))(message(), None) is None
    assert dropped.counts == {"tracer_failed": 1}


def test_a_send_span_that_cannot_start_leaves_the_copy_as_planned() -> None:
    dropped = Dropped()

    class NoSend(RaisingTrace):
        def send(self, plan: Plan) -> SendTrace:
            _raise(plan)

    def begin(_delivery: Delivery, _parent: Parent | None) -> DeliveryTrace:
        return NoSend()

    trace = guarded(begin, TraceFaults(dropped=dropped))(message(), None)
    assert trace is not None
    send = trace.send(PLAN)
    assert send.plan is PLAN
    send.answered(Confirmed())  # nothing to end: no second count
    assert dropped.counts == {"tracer_failed": 1}


class RaisingProcessor(SpanProcessor):
    """A user's span processor that raises at every span's start and end."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Raise for a send span."""
        if span.name.startswith("send"):
            _raise(parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        """Raise."""
        _raise(span)


async def test_a_raising_span_processor_neither_gives_back_nor_repeats_a_confirmed_delivery() -> (
    None
):
    traced = Traced()
    traced.tracing.provider.add_span_processor(RaisingProcessor())
    async with asyncio.timeout(5):  # unguarded, the delivery is given back and never acked
        channel = await traced.settle([PublishOutcome.CONFIRMED], delivery())
    assert channel.acked == [7]
    assert len(channel.sent) == 1  # published once, not given back for another round
    failed = traced.sample("acemq_sidecar_trace_spans_dropped_total", {"reason": "tracer_failed"})
    assert failed is not None
    assert failed >= 2  # the send span's start, the process span's end
