"""The relay hop's spans: made by the settler on fakes, read back from the SDK's memory exporter.

Each test settles one delivery through the real ``Settler`` (a scripted fake channel, no
broker) with tracing on, and reads the spans the OpenTelemetry SDK exported.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sidecar.observe import start_tracing, tracing_wanted
from sidecar.observe.tracing.export import SdkTracing
from sidecar.observe.tracing.spans import destination
from sidecar.relay.lane import PublishLane
from sidecar.relay.settler import Settler
from sidecar.routemap import RouteLimits, TraceLink, TraceParent, TracingConfig
from sidecar.wire import Delivery, PublishOutcome, UnreadBody
from tests.fakes import FakeBroker, FakeChannel
from tests.fakes.route import CANONICAL, QUARANTINE, OrdersRoute, orders_route, settle_one

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN}-01"


class Traced:
    """Route orders with tracing on, its settler, and the spans it exported."""

    def __init__(
        self,
        config: TracingConfig | None = None,
        *,
        trace_header_values: bool = False,
        limits: RouteLimits | None = None,
    ) -> None:
        self.orders: OrdersRoute = orders_route(limits=limits)
        self.exporter = InMemorySpanExporter()
        tracing = start_tracing(
            config or TracingConfig(),
            env={},
            metrics=self.orders.context.metrics,
            version="test",
            exporter=self.exporter,
        )
        assert isinstance(tracing, SdkTracing)
        self.tracing = tracing
        route = dataclasses.replace(
            self.orders.context.route, trace_header_values=trace_header_values
        )
        context = dataclasses.replace(
            self.orders.context,
            route=route,
            tracer=tracing.for_route(route, quarantine_exchange=QUARANTINE),
        )
        self.settler = Settler(context, state=self.orders.state, log=self.orders.log, stop=_event())

    async def settle(self, answers: list[Any], message: Delivery) -> FakeChannel:
        """Settle one delivery on a fake channel answering ``answers``; return the channel."""
        channel = FakeChannel(FakeBroker(answers=answers), 1)
        connection = channel.broker.connection(one_channel=channel)
        self.settler.attach(connection, PublishLane(connection, stop=_event()))
        await settle_one(self.settler, self.orders.state, channel, message)
        return channel

    def spans(self) -> list[ReadableSpan]:
        """Return every span exported so far."""
        self.tracing.provider.force_flush()
        return list(self.exporter.get_finished_spans())

    def by_name(self) -> dict[str, list[ReadableSpan]]:
        """Return the exported spans by name."""
        out: dict[str, list[ReadableSpan]] = {}
        for span in self.spans():
            out.setdefault(span.name, []).append(span)
        return out

    def sample(self, name: str, labels: dict[str, str]) -> float | None:
        """Return a metric sample of the route's registry."""
        return self.orders.registry.get_sample_value(name, labels)


def _event() -> asyncio.Event:
    return asyncio.Event()


def delivery(headers: dict[str, Any] | None = None, **properties: Any) -> Delivery:
    return Delivery(
        delivery_tag=7,
        exchange="shop",
        routing_key="order.placed",
        redelivered=False,
        properties=MappingProxyType({"message_id": "m-1", **properties}),
        headers=MappingProxyType(
            {**CANONICAL, "traceparent": TRACEPARENT} if headers is None else headers
        ),
        body=b"body",
    )


async def test_a_relayed_message_is_a_process_span_under_the_producers_and_a_send_span() -> None:
    traced = Traced()
    channel = await traced.settle([PublishOutcome.CONFIRMED], delivery(correlation_id="c-9"))
    assert channel.acked == [7]
    spans = traced.by_name()
    (process,) = spans["process staging.orders"]
    (send,) = spans["send orders"]
    assert process.kind is SpanKind.CONSUMER
    assert send.kind is SpanKind.PRODUCER
    assert process.parent is not None
    assert format(process.parent.span_id, "016x") == PRODUCER_SPAN
    assert process.parent.is_remote
    assert format(process.context.trace_id, "032x") == TRACE_ID
    assert send.parent is not None
    assert send.parent.span_id == process.context.span_id
    assert dict(process.attributes or {}) == {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "shop:order.placed:staging.orders",
        "messaging.rabbitmq.destination.routing_key": "order.placed",
        "messaging.rabbitmq.message.delivery_tag": 7,
        "messaging.message.body.size": 4,
        "messaging.message.id": "m-1",
        "messaging.message.conversation_id": "m-1",  # x-acemq-correlation before the property
        "acemq.route": "orders",
        "acemq.producer": "unknown",
        "acemq.verdict": "relayed",
    }
    attributes = dict(send.attributes or {})
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.destination.name"] == "orders:order.placed"
    assert attributes["messaging.rabbitmq.destination.routing_key"] == "order.placed"
    assert attributes["acemq.copy"] == "target"
    assert attributes["acemq.publish.outcome"] == "confirmed"
    assert "error.type" not in attributes
    assert channel.sent[0].headers["traceparent"] == TRACEPARENT  # as the producer wrote it


async def test_a_repaired_message_has_an_event_per_violation_and_no_header_value() -> None:
    traced = Traced()
    headers = {**CANONICAL, "traceparent": TRACEPARENT, "x-acemq-attempt": " 4 "}
    headers["x-acemq-origin"] = "checkout@app-7"
    await traced.settle([PublishOutcome.CONFIRMED], delivery(headers))
    (process,) = traced.by_name()["process staging.orders"]
    attributes = dict(process.attributes or {})
    assert attributes["acemq.verdict"] == "repaired"
    assert attributes["acemq.producer"] == "checkout"
    events = [dict(e.attributes or {}) for e in process.events if e.name == "acemq.violation"]
    assert {"acemq.violation.kind": "coerced", "acemq.violation.header": "x-acemq-attempt"} in (
        events
    )
    assert all("acemq.violation.value" not in event for event in events)
    assert attributes["acemq.violations"] == len(events)


async def test_a_route_that_opts_in_shows_the_header_value_on_the_event() -> None:
    traced = Traced(trace_header_values=True)
    headers = {**CANONICAL, "traceparent": TRACEPARENT, "x-acemq-attempt": " 4 "}
    await traced.settle([PublishOutcome.CONFIRMED], delivery(headers))
    (process,) = traced.by_name()["process staging.orders"]
    values = [
        (e.attributes or {}).get("acemq.violation.value")
        for e in process.events
        if (e.attributes or {}).get("acemq.violation.header") == "x-acemq-attempt"
    ]
    assert values == ["' 4 '"]


async def test_a_quarantined_message_shows_why_and_both_copies() -> None:
    traced = Traced(limits=RouteLimits(return_max_attempts=0))  # no retry of the return
    channel = await traced.settle([PublishOutcome.RETURNED, PublishOutcome.CONFIRMED], delivery())
    assert channel.acked == [7]
    spans = traced.by_name()
    (process,) = spans["process staging.orders"]
    (target,) = spans["send orders"]
    (quarantine,) = spans[f"send {QUARANTINE}"]
    reason = dict(process.attributes or {})["acemq.quarantine.reason"]
    assert isinstance(reason, str)
    assert reason.startswith("unroutable:")
    assert dict(process.attributes or {})["acemq.verdict"] == "quarantined"
    assert dict(target.attributes or {})["error.type"] == "returned"
    assert target.status.status_code is StatusCode.ERROR
    assert dict(quarantine.attributes or {})["acemq.copy"] == "quarantine"
    assert dict(quarantine.attributes or {})["messaging.destination.name"] == (
        f"{QUARANTINE}:orders"
    )
    assert dict(quarantine.attributes or {})["acemq.publish.outcome"] == "confirmed"
    assert channel.sent[1].headers["traceparent"] == TRACEPARENT


async def test_a_returned_copy_published_again_shows_on_the_span() -> None:
    traced = Traced(limits=RouteLimits(return_max_attempts=1, return_delay_s=0.01))
    answers = [PublishOutcome.RETURNED, PublishOutcome.CONFIRMED]
    channel = await traced.settle(answers, delivery())
    assert channel.acked == [7]
    spans = traced.by_name()
    (process,) = spans["process staging.orders"]
    returned, routed = spans["send orders"]
    assert dict(returned.attributes or {})["error.type"] == "returned"
    assert dict(routed.attributes or {})["acemq.publish.outcome"] == "confirmed"
    events = [e.name for e in process.events]
    assert events.count("acemq.return_retried") == 1
    assert events.count("acemq.routed_on_retry") == 1
    assert dict(process.attributes or {})["acemq.verdict"] != "quarantined"


@pytest.mark.parametrize("bad", ["00-zz-00f067aa0ba902b7-01", f"00-{'0' * 32}-{'0' * 16}-01"])
async def test_an_invalid_traceparent_is_ignored_counted_and_relayed_as_it_came(bad: str) -> None:
    traced = Traced()
    channel = await traced.settle(
        [PublishOutcome.CONFIRMED], delivery({**CANONICAL, "traceparent": bad})
    )
    assert channel.acked == [7]
    assert channel.sent[0].headers["traceparent"] == bad
    (process,) = traced.by_name()["process staging.orders"]
    assert process.parent is None
    labels = {"route": "orders"}
    assert traced.sample("acemq_sidecar_trace_context_invalid_total", labels) == 1


async def test_links_mode_starts_a_trace_linked_to_the_producers_span() -> None:
    traced = Traced(TracingConfig(link=TraceLink.LINKS))
    await traced.settle([PublishOutcome.CONFIRMED], delivery())
    (process,) = traced.by_name()["process staging.orders"]
    assert process.parent is None
    assert format(process.context.trace_id, "032x") != TRACE_ID
    (link,) = process.links
    assert format(link.context.span_id, "016x") == PRODUCER_SPAN


async def test_send_span_mode_makes_the_send_span_the_copys_traceparent() -> None:
    traced = Traced(TracingConfig(traceparent=TraceParent.SEND_SPAN))
    channel = await traced.settle([PublishOutcome.CONFIRMED], delivery())
    (send,) = traced.by_name()["send orders"]
    expected = f"00-{TRACE_ID}-{send.context.span_id:016x}-01"
    assert channel.sent[0].headers["traceparent"] == expected


async def test_a_delivery_the_sampler_drops_takes_the_fast_pass_with_no_span() -> None:
    traced = Traced(TracingConfig(sampler_ratio=0.0))
    channel = await traced.settle([PublishOutcome.CONFIRMED], delivery(dict(CANONICAL)))
    assert channel.acked == [7]
    assert traced.spans() == []


def test_the_destination_names_follow_the_rabbitmq_conventions() -> None:
    assert destination("orders", "order.placed") == "orders:order.placed"
    assert destination("", "work") == "work"
    assert destination("orders", "") == "orders"
    assert destination("", "") == "amq.default"
    assert destination("shop", "order.placed", "staging") == "shop:order.placed:staging"
    assert destination("", "staging", "staging") == "staging"


@pytest.mark.parametrize(
    ("config", "env", "on"),
    [
        (None, {}, False),
        (None, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
        (None, {"OTEL_TRACES_EXPORTER": "none"}, False),
        (TracingConfig(), {}, True),
        (TracingConfig(enabled=False), {"OTEL_TRACES_EXPORTER": "otlp"}, False),
        (TracingConfig(), {"OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_off_unless_asked_for(
    config: TracingConfig | None,
    env: dict[str, str],
    on: bool,  # noqa: FBT001 - a parameter of the table
) -> None:
    assert tracing_wanted(config, env) is on


class _Stuck(SpanExporter):
    """A collector that does not answer until released, then refuses."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches += len(spans)
        self.release.wait(10)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_a_stuck_collector_drops_spans_from_the_bounded_queue_and_counts_them() -> None:
    orders = orders_route()
    stuck = _Stuck()
    tracing = start_tracing(
        TracingConfig(max_queue_size=4),
        env={},
        metrics=orders.context.metrics,
        version="test",
        exporter=stuck,
    )
    assert isinstance(tracing, SdkTracing)
    for _ in range(20):
        tracing.tracer.start_span("s").end()  # never waits for the collector
    stuck.release.set()
    tracing.shutdown(timeout_s=5)
    dropped = orders.registry.get_sample_value(
        "acemq_sidecar_trace_spans_dropped_total", {"reason": "queue_full"}
    )
    failed = orders.registry.get_sample_value(
        "acemq_sidecar_trace_spans_dropped_total", {"reason": "export_failed"}
    )
    assert dropped is not None
    assert failed is not None
    assert dropped >= 20 - 4 - 4  # at most the queue and one batch in the exporter's hands
    assert dropped + failed == 20


@pytest.mark.parametrize(("flags", "spans"), [("01", 2), ("00", 0)])
async def test_the_producers_sampled_flag_decides_under_the_parent_based_sampler(
    flags: str, spans: int
) -> None:
    traced = Traced(TracingConfig(sampler_ratio=0.0))
    headers = {**CANONICAL, "traceparent": f"00-{TRACE_ID}-{PRODUCER_SPAN}-{flags}"}
    channel = await traced.settle([PublishOutcome.CONFIRMED], delivery(headers))
    assert channel.acked == [7]
    assert len(traced.spans()) == spans


async def test_an_invalid_traceparent_is_counted_when_sampled_out_too() -> None:
    traced = Traced(TracingConfig(sampler_ratio=0.0))
    await traced.settle([PublishOutcome.CONFIRMED], delivery({**CANONICAL, "traceparent": b"\xff"}))
    assert traced.spans() == []
    labels = {"route": "orders"}
    assert traced.sample("acemq_sidecar_trace_context_invalid_total", labels) == 1


def test_a_ratio_samples_by_the_producers_trace_id_as_the_sdk_does() -> None:
    from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased  # noqa: PLC0415

    from sidecar.observe.tracing.sampling import Sampling  # noqa: PLC0415

    sampling, sdk = Sampling(parent_based=False, ratio=0.25), TraceIdRatioBased(0.25)
    for low in (0, 1 << 61, (1 << 62) - 1, 1 << 62, (1 << 64) - 1):
        ours = sampling.sampled((True, f"{low:016x}"), follows=True)
        theirs = sdk.should_sample(None, low, "s").decision is Decision.RECORD_AND_SAMPLE
        assert ours is theirs, low


def test_tracing_on_without_the_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys  # noqa: PLC0415

    from sidecar.observe import TracingUnavailableError  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace.export", None)
    with pytest.raises(TracingUnavailableError, match=r"acemq-sidecar\[otel\]"):
        start_tracing(
            TracingConfig(), env={}, metrics=orders_route().context.metrics, version="test"
        )


TRACEPARENTS = [
    TRACEPARENT,
    f"00-{TRACE_ID}-{PRODUCER_SPAN}-00",
    f" \t00-{TRACE_ID}-{PRODUCER_SPAN}-01\t ",
    f"01-{TRACE_ID}-{PRODUCER_SPAN}-01-extra",
    f"00-{TRACE_ID}-{PRODUCER_SPAN}-01-extra",
    f"ff-{TRACE_ID}-{PRODUCER_SPAN}-01",
    f"00-{TRACE_ID.upper()}-{PRODUCER_SPAN}-01",
    f"00-{'0' * 32}-{PRODUCER_SPAN}-01",
    f"00-{TRACE_ID}-{'0' * 16}-01",
    f"00-{TRACE_ID}-{PRODUCER_SPAN}-0g",
    f"00-{TRACE_ID}_{PRODUCER_SPAN}-01",
    f"00-{TRACE_ID[:-1]}-{PRODUCER_SPAN}-01",
    f"00-{TRACE_ID}-{PRODUCER_SPAN}-01-",
    f"00-{TRACE_ID[:10]}+{TRACE_ID[11:]}-{PRODUCER_SPAN}-01",
    f"0-{TRACE_ID}-{PRODUCER_SPAN}-01x",
    "",
    "00",
]


@pytest.mark.parametrize("value", TRACEPARENTS)
def test_the_traceparent_is_valid_where_the_sdks_propagator_reads_one(value: str) -> None:
    from opentelemetry.trace import get_current_span  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    from sidecar.observe.tracing.sampling import traceparent  # noqa: PLC0415

    extracted = TraceContextTextMapPropagator().extract({"traceparent": value})
    theirs = get_current_span(extracted).get_span_context()
    ours = traceparent(value)
    assert (ours is not None) is theirs.is_valid
    if ours is not None:
        low = theirs.trace_id & ((1 << 64) - 1)
        assert (ours[0], int(ours[1], 16)) == (theirs.trace_flags.sampled, low)


async def test_send_span_mode_writes_the_traceparent_as_the_producer_did_bytes_too() -> None:
    """A header keeps its AMQP type: a byte-string traceparent comes out a byte string."""
    traced = Traced(TracingConfig(traceparent=TraceParent.SEND_SPAN))
    message = delivery({**CANONICAL, "traceparent": TRACEPARENT.encode()})
    channel = await traced.settle([PublishOutcome.CONFIRMED], message)
    (send,) = traced.by_name()["send orders"]
    assert channel.sent[0].headers["traceparent"] == (
        f"00-{TRACE_ID}-{send.context.span_id:016x}-01".encode()
    )


async def test_a_publish_held_by_the_brokers_block_has_one_send_span_once_written() -> None:
    """Nothing is written while the broker blocks: no span says a publish that never was."""
    traced = Traced()
    channel = FakeChannel(FakeBroker(answers=[PublishOutcome.CONFIRMED]), 1)
    connection = channel.broker.connection(one_channel=channel)
    connection.block("low on memory")
    traced.settler.attach(connection, PublishLane(connection, stop=_event()))
    settling = asyncio.create_task(
        settle_one(traced.settler, traced.orders.state, channel, delivery())
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert channel.sent == []
    connection.unblock()
    await asyncio.wait_for(settling, 5)
    (send,) = traced.by_name()["send orders"]
    assert dict(send.attributes or {})["acemq.publish.outcome"] == "confirmed"
    assert send.status.status_code is not StatusCode.ERROR


async def test_a_copy_the_frame_handler_could_not_send_has_one_send_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its task publishes it in the span the frame handler started: one copy, one span."""
    traced = Traced()
    channel = FakeChannel(
        FakeBroker(answers=[PublishOutcome.CONFIRMED, PublishOutcome.CONFIRMED]), 1
    )
    connection = channel.broker.connection(one_channel=channel)
    traced.settler.attach(connection, PublishLane(connection, stop=_event()))
    # A first copy through a task warms the connection's gate: the next may go at once.
    await settle_one(traced.settler, traced.orders.state, channel, delivery())
    traced.spans()  # exported: the first copy's spans
    traced.exporter.clear()
    tried: list[int] = []

    def not_now(*_args: Any, **_kwargs: Any) -> bool:
        tried.append(1)
        return False

    monkeypatch.setattr(FakeChannel, "publish_now", not_now)  # the fake: plain in both builds
    second = dataclasses.replace(delivery(), delivery_tag=8)
    await settle_one(traced.settler, traced.orders.state, channel, second)
    assert tried == [1]  # the frame handler tried, and left it to the task
    assert channel.acked == [7, 8]
    (send,) = traced.by_name()["send orders"]
    assert dict(send.attributes or {})["acemq.publish.outcome"] == "confirmed"


async def test_a_body_passed_through_has_its_size_on_the_span() -> None:
    """Not held, its size is the one the content header announced."""
    traced = Traced()
    message = dataclasses.replace(
        delivery(), body=b"", unread_body=UnreadBody(size=50_000_000, limit=1_000_000)
    )
    span = traced.tracing.for_route(traced.settler.route, quarantine_exchange=QUARANTINE)
    trace = span.start(message)
    assert trace is not None
    trace.end(None)
    (process,) = traced.by_name()["process staging.orders"]
    assert dict(process.attributes or {})["messaging.message.body.size"] == 50_000_000
