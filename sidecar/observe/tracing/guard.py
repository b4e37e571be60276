"""Tracing that cannot raise into the relay: every hook it calls, guarded.

A tracer's fault (the SDK, the exporter, a span processor of the user's) must never reach
a delivery: raised after a publish's confirm, it would give back a confirmed delivery (a
duplicate, the route paused, a loop if it raised every time). ``guarded`` wraps what
starts a delivery's span so that the trace it makes, and each send trace that makes,
swallow what the spans raise: the span is lost, the failure counted as a span dropped
(``tracer_failed``) and logged at most once per hook per interval, and the delivery goes
on (untraced, when its span could not start). Imports nothing of OpenTelemetry.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

from sidecar.observe.rate_limit import RateLimit

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.observe.tracing.hooks import DeliveryTrace, SendTrace
    from sidecar.observe.tracing.sampling import Parent
    from sidecar.settle import Ack, Answer, DeadLetter, Event, GiveBack, LetGo, Plan, Requeue
    from sidecar.wire import Delivery

__all__ = ["FAILED", "TraceFaults", "guarded"]

log = logging.getLogger(__name__)

FAILED: Final = "tracer_failed"  # the reason label of trace_spans_dropped_total
_INTERVAL_S: Final = 60.0  # one line per hook per interval, with how many it stands for


class TraceFaults:
    """Counts and logs (rate-limited, per hook) what the tracing raised."""

    __slots__ = ("_dropped", "_limit", "_monotonic")

    def __init__(
        self,
        *,
        dropped: Callable[[str, int], None],
        monotonic: Callable[[], float] = time.monotonic,
        interval_s: float = _INTERVAL_S,
    ) -> None:
        self._dropped = dropped
        self._monotonic = monotonic
        self._limit = RateLimit[str](interval_s)

    def failed(self, hook: str, error: Exception) -> None:
        """Count a span lost to ``error``, raised by ``hook``; log it unless logged lately."""
        try:
            self._dropped(FAILED, 1)
            suppressed = self._limit.admit(hook, self._monotonic())
            if suppressed is not None:
                log.warning(
                    "tracing failed in %s (%s: %s): its span is lost, the delivery goes on",
                    hook,
                    type(error).__qualname__,
                    error,
                    exc_info=error,
                    extra={"hook": hook, "suppressed": suppressed},
                )
        except Exception:  # noqa: BLE001, S110 - not even the count or the line may raise
            pass


def guarded(
    begin: Callable[[Delivery, Parent | None], DeliveryTrace], faults: TraceFaults
) -> Callable[[Delivery, Parent | None], DeliveryTrace | None]:
    """Return ``begin`` made safe: its trace's hooks never raise; None when it raised."""

    def start(delivery: Delivery, parent: Parent | None) -> DeliveryTrace | None:
        try:
            trace = begin(delivery, parent)
        except Exception as e:  # noqa: BLE001 - the delivery goes on untraced
            faults.failed("start", e)
            return None
        return _Trace(trace, faults)

    return start


class _Trace:
    """A delivery's trace whose hooks never raise."""

    __slots__ = ("_faults", "_trace")

    def __init__(self, trace: DeliveryTrace, faults: TraceFaults) -> None:
        self._trace = trace
        self._faults = faults

    def saw(self, events: tuple[Event, ...]) -> None:
        try:
            self._trace.saw(events)
        except Exception as e:  # noqa: BLE001 - see the module docstring
            self._faults.failed("saw", e)

    def send(self, plan: Plan) -> SendTrace:
        try:
            send = self._trace.send(plan)
            published = send.plan
        except Exception as e:  # noqa: BLE001 - the copy goes as planned, untraced
            self._faults.failed("send", e)
            return _Send(None, plan, self._faults)
        return _Send(send, published, self._faults)

    def end(self, action: Ack | DeadLetter | GiveBack | LetGo | Requeue | None) -> None:
        try:
            self._trace.end(action)
        except Exception as e:  # noqa: BLE001 - see the module docstring
            self._faults.failed("end", e)


class _Send:
    """A copy's send trace whose hooks never raise (None: its span did not start)."""

    __slots__ = ("_faults", "_send", "plan")

    def __init__(self, send: SendTrace | None, plan: Plan, faults: TraceFaults) -> None:
        self._send = send
        self.plan = plan
        self._faults = faults

    def answered(self, answer: Answer) -> None:
        if (send := self._send) is None:
            return
        try:
            send.answered(answer)
        except Exception as e:  # noqa: BLE001 - see the module docstring
            self._faults.failed("answered", e)
