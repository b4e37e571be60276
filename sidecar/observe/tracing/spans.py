"""The spans of one relay hop, per the OpenTelemetry messaging conventions for RabbitMQ.

A delivery's CONSUMER span, ``process {queue}``, whose parent (or, in ``links`` mode, link)
is the producer's context read from the message's ``traceparent`` and ``tracestate``
headers; a PRODUCER span, ``send {exchange}``, per copy published, the target's or the
quarantine's, ended with the broker's answer. What the contract did goes on the process
span: a ``acemq.violation`` event per violation (its kind and header; the header's value
only on a route with ``trace_header_values``), the verdict, the quarantine's reason and the
producer as the drift metrics name it. A header that is not trace context is ignored and
counted. Imported only when tracing is on (``setup``); the relay sees ``hooks``' Protocols.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Final, assert_never

from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import (
    Link,
    SpanKind,
    Status,
    StatusCode,
    format_span_id,
    format_trace_id,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.contract import CORRELATION, ID, Relay, producer_of
from sidecar.observe.tracing.sampling import TRACEPARENT
from sidecar.routemap import TraceLink, TraceParent
from sidecar.settle import (
    Ack,
    Blocked,
    Bug,
    Confirmed,
    Copy,
    DeadLetter,
    Failed,
    GiveBack,
    Held,
    Left,
    LetGo,
    Lost,
    Outcome,
    Quarantine,
    Quarantined,
    Refused,
    Requeue,
    RetriedCopy,
    ReturnRetried,
    RoutedOnRetry,
    Unwritable,
    Violations,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from sidecar.contract import Violation
    from sidecar.observe.tracing.sampling import Parent
    from sidecar.routemap import Route
    from sidecar.settle import Answer, Event, Plan
    from sidecar.wire import Delivery, FieldValue

__all__ = ["SpanRouteTracer", "destination"]

VALUE_MAX: Final = 256  # characters of a header's value on a span event, when a route opts in


class _Headers(Getter["Mapping[str, FieldValue]"]):
    """Reads trace context from an AMQP header table: a string, or bytes that are ASCII."""

    def get(self, carrier: Mapping[str, FieldValue], key: str) -> list[str] | None:
        value = carrier.get(key)
        if isinstance(value, str):
            return [value]
        if isinstance(value, bytes):
            try:
                return [value.decode("ascii")]
            except UnicodeDecodeError:
                return None
        return None

    def keys(self, carrier: Mapping[str, FieldValue]) -> list[str]:
        return list(carrier)


_GETTER: Final = _Headers()
_PROPAGATOR: Final = TraceContextTextMapPropagator()
_EMPTY: Final = otel_context.Context()
# The process span's fixed attributes.
_PROCESS: Final[Mapping[str, AttributeValue]] = MappingProxyType(
    {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
    }
)


def destination(exchange: str, routing_key: str, queue: str | None = None) -> str:
    """Return ``messaging.destination.name`` as the RabbitMQ conventions write it.

    A publish: ``{exchange}:{routing key}``, either alone when the other is empty,
    ``amq.default`` for the default exchange with no routing key. A delivery:
    ``{exchange}:{routing key}:{queue}``, empty parts left out, the routing key once when it
    is the queue's name.
    """
    parts = [part for part in (exchange, routing_key) if part]
    if queue is not None and queue and queue != routing_key:
        parts.append(queue)
    return ":".join(parts) if parts else "amq.default"


class SpanRouteTracer:
    """One route's spans; see the module docstring."""

    def __init__(
        self,
        route: Route,
        *,
        tracer: Tracer,
        quarantine_exchange: str,
        link: TraceLink,
        traceparent: TraceParent,
    ) -> None:
        self.route = route
        self.tracer = tracer
        self.quarantine_exchange = quarantine_exchange
        self.links = link is TraceLink.LINKS
        self.rewrite = traceparent is TraceParent.SEND_SPAN
        self.process_name = f"process {route.queue}"
        self.send_target_name = f"send {route.exchange or 'amq.default'}"
        self.send_quarantine_name = f"send {quarantine_exchange}"

    def begin(self, delivery: Delivery, parent: Parent | None) -> _DeliverySpan:
        """Start the process span of a delivery ``sampling`` kept; ``parent``: its traceparent's."""
        headers = delivery.headers
        context = _EMPTY
        links: list[Link] | None = None
        if parent is not None:
            extracted = _PROPAGATOR.extract(headers, getter=_GETTER)
            producer = get_current_span(extracted).get_span_context()
            if self.links:
                links = [Link(producer)]
            else:
                context = extracted
        span = self.tracer.start_span(
            self.process_name,
            context=context,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=self._process_attributes(delivery),
        )
        return _DeliverySpan(self, span, delivery)

    def _process_attributes(self, delivery: Delivery) -> dict[str, AttributeValue]:
        route, headers, properties = self.route, delivery.headers, delivery.properties
        attributes: dict[str, AttributeValue] = {
            **_PROCESS,
            "messaging.destination.name": destination(
                delivery.exchange, delivery.routing_key, route.queue
            ),
            "messaging.rabbitmq.message.delivery_tag": delivery.delivery_tag,
            "messaging.message.body.size": _body_size(delivery),
            "acemq.route": route.name,
            "acemq.producer": producer_of(headers, properties, publishers=route.publishers),
        }
        if delivery.routing_key:
            attributes["messaging.rabbitmq.destination.routing_key"] = delivery.routing_key
        message_id = headers.get(ID)
        if not isinstance(message_id, str) or not message_id:
            message_id = properties.get("message_id")
        if isinstance(message_id, str) and message_id:
            attributes["messaging.message.id"] = message_id
        conversation = headers.get(CORRELATION)
        if not isinstance(conversation, str) or not conversation:
            conversation = properties.get("correlation_id")
        if isinstance(conversation, str) and conversation:
            attributes["messaging.message.conversation_id"] = conversation
        if delivery.redelivered:
            attributes["acemq.redelivered"] = True
        return attributes


class _DeliverySpan:
    """One delivery's process span; see the module docstring."""

    __slots__ = ("_delivery", "_ended", "_quarantined", "_repaired", "_route", "span")

    def __init__(self, route: SpanRouteTracer, span: Span, delivery: Delivery) -> None:
        self._route = route
        self.span = span
        self._delivery = delivery
        self._repaired = False
        self._quarantined: str | None = None
        self._ended = False

    def saw(self, events: tuple[Event, ...]) -> None:
        span = self.span
        for event in events:
            match event:
                case Violations(verdict=verdict):
                    self._violations(verdict.violations)
                    self._repaired = isinstance(verdict, Relay) and bool(verdict.violations)
                case Quarantined(reason=reason):
                    self._quarantined = reason
                case Held(reason=reason):
                    span.add_event("acemq.held", {"acemq.reason": reason})
                case RetriedCopy():
                    span.add_event("acemq.retried_copy")
                case ReturnRetried():
                    span.add_event("acemq.return_retried")
                case RoutedOnRetry():
                    span.add_event("acemq.routed_on_retry")
                case Bug(while_=while_, error=error):
                    span.record_exception(error, {"acemq.while": while_})
                case Left(reason=reason):
                    span.add_event("acemq.left", {"acemq.reason": reason})
                case _:
                    assert_never(event)

    def _violations(self, violations: tuple[Violation, ...]) -> None:
        span, values = self.span, self._route.route.trace_header_values
        headers = self._delivery.headers
        span.set_attribute("acemq.violations", len(violations))
        for kind, header in violations:
            attributes: dict[str, AttributeValue] = {
                "acemq.violation.kind": str(kind),
                "acemq.violation.header": header,
            }
            if values and header in headers:
                attributes["acemq.violation.value"] = repr(headers[header])[:VALUE_MAX]
            span.add_event("acemq.violation", attributes)

    def send(self, plan: Plan) -> _SendSpan:
        route = self._route
        attributes: dict[str, AttributeValue] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "acemq.route": route.route.name,
        }
        match plan:
            case Copy():
                exchange, routing_key = route.route.exchange, plan.routing_key
                name, copy = route.send_target_name, "target"
                message_id = plan.headers.get(ID)
            case Quarantine():
                exchange, routing_key = route.quarantine_exchange, route.route.name
                name, copy = route.send_quarantine_name, "quarantine"
                message_id = self._delivery.headers.get(ID)
                attributes["acemq.quarantine.reason"] = plan.reason
            case _:
                assert_never(plan)
        attributes["messaging.destination.name"] = destination(exchange, routing_key)
        if routing_key:
            attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
        if isinstance(message_id, str) and message_id:
            attributes["messaging.message.id"] = message_id
        attributes["acemq.copy"] = copy
        span = route.tracer.start_span(
            name,
            context=set_span_in_context(self.span, _EMPTY),
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        if route.rewrite and isinstance(plan, Copy):
            plan = _with_traceparent(plan, span)
        return _SendSpan(span, plan)

    def end(self, action: Ack | DeadLetter | GiveBack | LetGo | Requeue | None) -> None:
        if self._ended:
            return
        self._ended = True
        span = self.span
        match action:
            case Ack(outcome=outcome):
                verdict = _verdict(outcome, repaired=self._repaired)
            case DeadLetter(reason=reason):
                verdict = "dead_lettered"
                span.set_attribute("acemq.dead_letter.reason", reason)
                span.set_attribute("error.type", "dead_lettered")
                span.set_status(Status(StatusCode.ERROR, reason))
            case GiveBack(reason=reason):
                verdict = "given_back"
                span.set_attribute("error.type", "given_back")
                span.set_status(Status(StatusCode.ERROR, reason))
            case Requeue(reason=reason):
                verdict = "requeued"
                span.set_attribute("acemq.requeue.reason", reason)
            case LetGo() | None:
                verdict = "left"
            case _:
                assert_never(action)
        span.set_attribute("acemq.verdict", verdict)
        if self._quarantined is not None and verdict == "quarantined":
            span.set_attribute("acemq.quarantine.reason", self._quarantined)
        span.end()


def _body_size(delivery: Delivery) -> int:
    """Return the body's size, a body passed through (not held: ``unread_body``) too."""
    unread = delivery.unread_body
    return unread.size if unread is not None else len(delivery.body)


def _verdict(outcome: Outcome, *, repaired: bool) -> str:
    match outcome:
        case Outcome.RELAYED:
            return "repaired" if repaired else "relayed"
        case Outcome.QUARANTINED:
            return "quarantined"
        case Outcome.AUDITED:
            return "audited"
        case _:
            assert_never(outcome)


def _with_traceparent(plan: Copy, span: Span) -> Copy:
    """Return the copy with the send span as its ``traceparent`` (its content header re-encoded).

    Written as the producer wrote theirs, a string or bytes: a header keeps its AMQP type.
    """
    context = span.get_span_context()
    if not context.is_valid:
        return plan
    headers = dict(plan.headers)
    value = (
        f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}"
        f"-{int(context.trace_flags):02x}"
    )
    headers[TRACEPARENT] = value.encode() if isinstance(headers.get(TRACEPARENT), bytes) else value
    return Copy(
        properties=plan.properties,
        headers=headers,
        routing_key=plan.routing_key,
        outcome=plan.outcome,
    )


class _SendSpan:
    """One publish's span, ended by the broker's answer."""

    __slots__ = ("plan", "span")

    def __init__(self, span: Span, plan: Plan) -> None:
        self.span = span
        self.plan = plan

    def answered(self, answer: Answer) -> None:
        span = self.span
        outcome, error = _read(answer)
        span.set_attribute("acemq.publish.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, _answer_text(answer)))
        span.end()


def _read(answer: Answer) -> tuple[str, str | None]:
    """Return the publish's outcome and, for one that failed, its ``error.type``."""
    match answer:
        case Confirmed():
            outcome, error = "confirmed", None
        case Refused(code=code):
            outcome, error = "refused", str(code)
        case Lost():
            outcome, error = "lost", "channel_lost"
        case Failed(error=failure):
            outcome, error = "failed", type(failure).__qualname__
        case Unwritable() | Blocked():
            outcome = error = "unwritable" if isinstance(answer, Unwritable) else "blocked"
        case _:  # Returned, Nacked: named by the outcome they carry
            outcome = error = str(answer.published.value)
    return outcome, error


def _answer_text(answer: Answer) -> str:
    """Return the broker's answer in its words, for the span's status."""
    match answer:
        case Refused(code=code, text=text):
            return f"{code} {text}"
        case Lost(error=error) | Unwritable(error=error):
            return error
        case Failed(error=error):
            return repr(error)
        case Blocked(reason=reason):
            return f"blocked: {reason}"
        case _:
            return str(answer.published.value)
