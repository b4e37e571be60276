"""When a publish may go out on a connection the broker may block: pure decisions.

RabbitMQ (3.10, ``rabbit_reader``) tells a client of a memory or disk alarm only when
the alarm meets a publish: an alarm puts the connection in ``blocking``, and the first
content header the reader takes from it then makes it ``blocked``: it sends
``connection.blocked`` and reads nothing more from the socket, not even that publish's
body, until the alarm clears (a publish with an empty body is whole at its header: it
is handed on, routed and confirmed, and only then does the connection block).
Whatever the client wrote after that header stays in the broker's socket buffer and is
read, in order, once the alarm clears. A copy written while the broker is
``blocking`` is therefore routed after the alarm; if a SIGTERM meanwhile gave its
delivery back to the staging queue, it is relayed twice.

So a connection cannot know whether the broker will read its next publish; after
:data:`QUIET_S` without an answer from the broker (a quiet spell) it assumes nothing.
The gate makes sure a real copy is never the first publish the broker meets after a
quiet spell: a probe goes first (a one-byte publish to the default exchange under a
routing key no queue can have: ``amq.`` names are the broker's own; not empty, so that
an alarm holds it as it would a copy), and the copies wait for its answer. An answer
(confirm, return, nack, a refusal that closes its channel) without
``connection.blocked`` means the broker read it unblocked: the copies waiting go at
once, together. No answer, ``connection.blocked`` instead: they wait on,
and a stop lets them go with nothing written.

A connection that keeps publishing pays nothing: while the broker's last answer on it
(to any publish) came less than :data:`QUIET_S` ago, the next goes at once (a probe at
every gap between two bursts would cost a round trip each; measured on bench/ab.py). The
quiet spell counts from that answer, not from the last write, and whatever is still
unanswered: a publish stuck for minutes (a quorum queue without its quorum) says nothing
of whether the broker reads now, and the probe, routed to no queue, is answered at once.
An alarm that begins within :data:`QUIET_S` of the last answer still catches what is on
its way when it begins: copies (routed once it clears) and acks written behind them
(read once it clears, or never if the broker first finds the connection gone), at most
the connection's deliveries in flight. Publishing and consuming on
separate connections (RabbitMQ's advice) would keep acks and a drain's cancel flowing;
copies on their way would still be caught.

Only the broker's answer to the probe (or the lead) proves it read it, or the connection
closing (the copies waiting then fail as any publish on it does). A probe or lead that
was never written, or whose channel the sidecar closed before its answer, proves
nothing: the copies waiting decide again, and one of them probes on its own channel.

Where the user may not write to the default exchange (a 403), the probe is given up for
the connection and the first copy after a quiet spell goes alone instead (a lead): the
others wait for its answer, so an alarm catches one copy, not a window of them.

Pure: no I/O, no asyncio; ``sidecar.relay.connection_gate`` carries these decisions out.
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
