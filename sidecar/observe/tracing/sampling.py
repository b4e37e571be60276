"""Which deliveries get a span: decided from the ``traceparent`` header, before any span.

A route's ``SampledTracer`` is what the relay holds while tracing is on. It reads the
header (W3C trace context: version, trace id, parent id, flags), counts one that is not
trace context, decides with ``Sampling``, and only for a delivery it keeps calls into the
OpenTelemetry SDK (``spans``). Imports nothing of OpenTelemetry, and is compiled with the
relay: a delivery sampled out costs this module's work and no more.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.observe.tracing.hooks import DeliveryTrace
    from sidecar.wire import Delivery

__all__ = ["SAMPLERS", "TRACEPARENT", "Parent", "SampledTracer", "Sampling", "traceparent"]

# The samplers OTEL_TRACES_SAMPLER may name that the sidecar honours (the specification's
# built-in ones); another is said at start and the specification's default is used.
SAMPLERS: Final = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)

TRACEPARENT: Final = "traceparent"
# W3C trace context's traceparent: version, trace id, parent id and flags, exactly 2, 32,
# 16 and 2 lower-case hex digits joined by "-" (55 characters); a version other than 00 may
# add "-" and more after them. Version ff and all-zero ids are invalid.
_LENGTH: Final = 55
_SAMPLED: Final = "13579bdf"  # the flags' last hex digit when the sampled bit is set
_HEX_OR_DASH: Final = "0123456789abcdef-"
_BLANK: Final = " \t"
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
_RATIO_SCALE: Final = 1 << 64

# A valid traceparent's sampled flag, and its trace id's last 16 hex digits (its low 64
# bits, which a ratio sampler reads: converted only when one does).
Parent = tuple[bool, str]


def traceparent(value: object) -> Parent | None:
    """Return a traceparent's sampled flag and its trace id's low 64 bits (hex); None: not one.

    Valid as the SDK's W3C propagator reads it (blanks around it allowed).
    """
    text = _well_formed(value)
    if text is None:
        return None
    if text[:2] == "ff" or text[3:35] == _ZERO_TRACE or text[36:52] == _ZERO_SPAN:
        return None
    return text[54] in _SAMPLED, text[19:35]


def _well_formed(value: object) -> str | None:
    """Return the header as text if it has a traceparent's form, else None."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    head = value
    if len(value) != _LENGTH:
        value = value.strip(_BLANK)
        size = len(value)
        if size < _LENGTH or (size > _LENGTH and (value[_LENGTH] != "-" or value[:2] == "00")):
            return None
        head = value[:_LENGTH]
    if value[2] != "-" or value[35] != "-" or value[52] != "-" or head.strip(_HEX_OR_DASH):
        return None  # a dash missing, or a character that is neither hex nor a dash
    if head.count("-") != 3:
        return None  # a dash inside a field: its three dashes are the only ones
    return value


class Sampling:
    """Which deliveries get a span.

    ``parent_based``: a delivery whose traceparent is valid follows its sampled flag (when
    its span is the producer's child); the others (no or an invalid traceparent, or
    ``links`` mode) are sampled at ``ratio``, by the producer's trace id when there is one
    (as the SDK's ``TraceIdRatioBased`` reads it), else by a draw.
    """

    def __init__(
        self, *, parent_based: bool, ratio: float, draw: Callable[[], float] = random.random
    ) -> None:
        self.parent_based = parent_based
        self.ratio = ratio
        self._bound = round(ratio * _RATIO_SCALE)
        self._draw = draw

    def sampled(self, parent: Parent | None, *, follows: bool) -> bool:
        """Decide for a delivery with ``parent`` (flag, trace id) that it ``follows`` or not."""
        if parent is not None:
            if follows and self.parent_based:
                return parent[0]
            return int(parent[1], 16) < self._bound
        return self._draw() < self.ratio


class SampledTracer:
    """One route's tracer as the relay holds it: the decision here, the span in ``begin``."""

    def __init__(
        self,
        route: str,
        *,
        sampling: Sampling,
        follows: bool,
        invalid: Callable[[str], None],
        begin: Callable[[Delivery, Parent | None], DeliveryTrace | None],
    ) -> None:
        self._route = route
        self._sampling = sampling
        self._follows = follows  # the span is the producer's child (not linked to it)
        self._invalid = invalid
        self._begin = begin

    def start(self, delivery: Delivery) -> DeliveryTrace | None:
        """Start the delivery's span; None when sampled out (nothing else made) or it failed."""
        raw = delivery.headers.get(TRACEPARENT)
        parent = None
        if raw is not None:
            parent = traceparent(raw)
            if parent is None:
                self._invalid(self._route)  # ignored: the delivery starts a trace
        if not self._sampling.sampled(parent, follows=self._follows):
            return None
        return self._begin(delivery, parent)
