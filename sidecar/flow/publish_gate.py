"""When a publish may go out on a connection the broker may block: pure decisions.

Owns the gate's rules: while the broker answered a publish on the connection less than
:data:`QUIET_S` ago, a publish goes at once; after a quiet spell a probe (one byte to the
default exchange, routing key :data:`PROBE_ROUTING_KEY`) goes before any copy, and the
copies wait for its answer; a 403 on the probe makes the first copy after a quiet spell
go alone (a lead), the others waiting for its answer.

Must not do I/O, read a clock or import asyncio: ``relay.connection_gate`` measures the
quiet spell, sends the probe and waits for its answer.
Why: docs/decisions/0002-publish-gate.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "PROBE_BODY",
    "PROBE_ROUTING_KEY",
    "QUIET_S",
    "Admit",
    "GateState",
    "admit",
    "probe_again",
]

# The default exchange routes by queue name, and no client can declare a queue named
# "amq.*" (403): the probe reaches no queue, whatever the vhost holds.
PROBE_ROUTING_KEY: Final = "amq.acemq-sidecar.publish-gate"
# A body, so that the broker blocks at the probe's header rather than route it first.
PROBE_BODY: Final = b"?"
ACCESS_REFUSED: Final = 403
# How long after the last answer the connection still counts as publishing: at most one
# probe a second, whatever the flow.
QUIET_S: Final = 1.0


class Admit(StrEnum):
    """What a publish that wants to go out does now."""

    GO = "go"  # publish now
    WAIT = "wait"  # wait: for the probe's or the lead's answer, or for the broker to unblock
    PROBE = "probe"  # send the probe, then wait for its answer with the others
    LEAD = "lead"  # publish now, alone: the others wait for its answer


@dataclass(frozen=True, slots=True, kw_only=True)
class GateState:
    """One connection's publishes as the gate sees them."""

    blocked: bool  # connection.blocked came, and no connection.unblocked yet
    quiet_s: float  # since the broker's last answer on it (infinite before the first)
    proving: bool  # a probe or a lead is out, unanswered
    probe_refused: bool  # the broker refused the probe: the connection leads instead


def admit(state: GateState) -> Admit:
    """Return what a publish that wants to go out on this connection does now.

    Nothing goes while the broker blocks, or while a probe or a lead is unanswered;
    a publish goes at once while the broker answered one less than :data:`QUIET_S` ago
    (it is reading them), however many are still unanswered; after a quiet spell the
    probe goes first (or, refused, this publish leads).
    """
    if state.blocked or state.proving:
        return Admit.WAIT
    if state.quiet_s < QUIET_S:
        return Admit.GO
    return Admit.LEAD if state.probe_refused else Admit.PROBE


def probe_again(*, closed_with: int) -> bool:
    """Return whether to probe again after the broker closed the probe's channel.

    ``closed_with`` is the broker's reply code. A 403 (no write permission on the
    default exchange) would come back at every probe: lead instead. Any other close
    still proves the broker read the probe; the next probe opens a new channel.
    """
    return closed_with != ACCESS_REFUSED
