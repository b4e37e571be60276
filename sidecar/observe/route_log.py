"""One route's log lines, each kind rate-limited so that a flood of bad messages is one line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sidecar.contract import Reject, Relay
from sidecar.observe.rate_limit import RateLimit
from sidecar.settle import bounded, log_origin, reason_kind

if TYPE_CHECKING:
    from sidecar.contract import Verdict
    from sidecar.wire import Delivery

__all__ = ["LOG_INTERVAL_S", "RouteLog"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them

LOG_INTERVAL_S = 60.0  # one line per violation kind, pause or quarantine reason per interval


class RouteLog:
    """One route's log lines, each kind rate-limited so a flood of bad messages is one line.

    Nothing is lost to the limits: every line says how many it stands for, and ``stopped``
    says what was held back since the last one.
    """

    def __init__(self, route: str, *, interval_s: float | None = None) -> None:
        self._route = route
        interval_s = LOG_INTERVAL_S if interval_s is None else interval_s
        self._violations = RateLimit[tuple[str, str]](interval_s)
        self._pauses = RateLimit[tuple[str, str]](interval_s)
        self._quarantines = RateLimit[tuple[str, str]](interval_s)
        self._told_timeout = False

    def violations(self, verdict: Verdict, delivery: Delivery, *, now: float) -> None:
        """Log each ``(kind, header)`` of a verdict at most once per interval.

        The line carries what a metric label must not: the real names of stripped
        reserved headers and a reject's reason (docs/contract.md section 6).
        """
        route = self._route
        origin = log_origin(verdict, delivery)
        for violation in verdict.violations:
            kind, header = str(violation.kind), violation.header
            suppressed = self._violations.admit((kind, header), now)
            if suppressed is None:
                continue
            extra: dict[str, object] = {
                "route": route,
                "kind": kind,
                "header": header,
                "message_id": delivery.properties.get("message_id"),
                "origin": origin,
                "suppressed": suppressed,
            }
            match verdict:
                case Relay(stripped=stripped) if stripped and kind == "unknown_reserved":
                    extra["names"] = ", ".join(stripped)
                case Reject(reason=reason):
                    extra["reason"] = bounded(reason)
            log.info("route %s: %s on %s", route, kind, header, extra=extra)

    def paused(self, reason: str, *, now: float, was_up: bool) -> None:
        """Log a pause: always when the route was up, else once per reason per interval.

        Held deliveries may alternate reasons at every retry.
        """
        if was_up or self._pauses.admit(("pause", reason), now) is not None:
            log.warning(
                "route %s paused: %s; retrying with backoff",
                self._route,
                reason,
                extra={"route": self._route},
            )

    def quarantined(self, reason: str, delivery: Delivery, *, now: float) -> None:
        """Log a quarantine once per kind of reason per interval: the queue keeps them all."""
        suppressed = self._quarantines.admit(("quarantine", reason_kind(reason)), now)
        if suppressed is not None:
            log.info(
                "route %s quarantined a message: %s",
                self._route,
                bounded(reason),
                extra={
                    "route": self._route,
                    "message_id": delivery.properties.get("message_id"),
                    "suppressed": suppressed,
                },
            )

    def took_back(self, *, held_s: float | None, timeout_s: float, hold_s: float) -> None:
        """Say once that the broker's consumer_timeout is shorter than the route map's."""
        if self._told_timeout:
            return
        self._told_timeout = True
        held = "a delivery" if held_s is None else f"a delivery held for {held_s:.1f}s"
        log.warning(
            "route %s: the broker took back %s (406 delivery acknowledgement timed out): its"
            " consumer_timeout is shorter than broker.consumer_timeout_s; a held delivery now"
            " goes to quarantine within %.1fs. Set broker.consumer_timeout_s to the broker's"
            " consumer_timeout (%gs or less)",
            self._route,
            held,
            hold_s,
            timeout_s,
            extra={"route": self._route, "consumer_timeout_s": timeout_s},
        )

    def stopped(self) -> None:
        """Say how many lines the rate limits held back, so a stop loses no count."""
        route = self._route
        for (kind, header), count in self._violations.take_quiet().items():
            log.info(
                "route %s: %d more %s on %s since the last line",
                route,
                count,
                kind,
                header,
                extra={"route": route, "kind": kind, "header": header, "suppressed": count},
            )
        for (_, reason), count in self._quarantines.take_quiet().items():
            log.info(
                "route %s quarantined %d more messages (%s...) since the last line",
                route,
                count,
                reason,
                extra={"route": route, "suppressed": count},
            )
