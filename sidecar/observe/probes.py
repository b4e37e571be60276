"""What /healthz and /readyz report, decided from a snapshot of the process.

This module owns the two decisions and their wording: alive while the event loop ticks,
ready while connected, not blocked, and every route of the map consumes. It reads
nothing itself: ``sidecar.service`` hands it plain values it read (from the HTTP thread,
so snapshots only), and ``sidecar.observe.health`` serves the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.observe.health import Probe

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sidecar.broker import BrokerAddress

__all__ = ["liveness", "readiness"]


def liveness(*, stopping: bool, stale_s: float, limit_s: float) -> Probe:
    """Report alive unless the event loop has not ticked for more than ``limit_s``.

    ``stale_s`` is the time since the last tick. A process that is stopping has no ticks
    while its routes drain, and exits by itself within its grace: it is not reported dead.
    """
    if stopping:
        return Probe(ok=True, detail="stopping")
    if stale_s > limit_s:
        return Probe(ok=False, detail=f"event loop has not run for {stale_s:.0f}s")
    return Probe(ok=True, detail="ok")


def readiness(
    *,
    connected: bool,
    routes: Iterable[str],
    pause_reasons: Mapping[str, str | None],
    blocked: str | None,
    node: BrokerAddress | None,
) -> Probe:
    """Report ready when connected, not blocked, and every route in ``routes`` consumes.

    ``pause_reasons`` has the running workers' reasons (None: it consumes); a route
    without a worker is starting, or waiting for the broker. ``detail`` has one
    ``route NAME: reason`` line per route that does not consume (or ``broker: not
    connected``, or ``broker: blocked: REASON``); ``report`` is the /readyz JSON body,
    every route with "consuming" or its reason, and the node while connected.
    """
    report_routes: dict[str, str] = {}
    down: list[str] = []
    for name in routes:
        if name in pause_reasons:
            reason = pause_reasons[name]
        else:
            reason = "starting" if connected else "waiting for the broker"
        if reason is None:
            report_routes[name] = "consuming"
        else:
            report_routes[name] = reason
            down.append(f"route {name}: {reason}")
    if blocked is not None:
        down.insert(0, f"broker: blocked: {blocked}")
    ready = connected and not down
    broker = "connected" if connected else "not connected"
    report: dict[str, object] = {
        "ready": ready,
        "broker": broker if blocked is None else f"blocked: {blocked}",
        "routes": report_routes,
    }
    if connected and node is not None:  # which node of the cluster, the password masked
        report["node"] = node.masked()
    if not connected:
        return Probe(ok=False, detail="broker: not connected", report=report)
    return Probe(ok=ready, detail="\n".join(down) or "ok", report=report)
