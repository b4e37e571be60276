"""Channel 0: the AMQP handshake, and the connection's own methods once it is open.

The handshake is start / start-ok (PLAIN login, our client properties and capabilities),
tune / tune-ok (the least of what the broker, the URL and the client allow) and open /
open-ok (the vhost). Afterwards channel 0 carries the broker's close (answered with
close-ok), the close-ok to ours, and ``connection.blocked`` / ``unblocked``, which are
logged. pamqp encodes and decodes these methods; this module and :mod:`sidecar.amqp.codec`
are the only ones that import it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from sidecar import __version__
from sidecar.amqp.link import CHANNEL_MAX, FRAME_MAX
from sidecar.errors import BrokerConnectionError

if TYPE_CHECKING:
    from sidecar.address import BrokerAddress
    from sidecar.amqp.link import Link

__all__ = ["CAPABILITIES", "Control", "Tuned", "connection_close", "handshake"]

log = logging.getLogger(__name__)

CAPABILITIES: Final = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,  # a deleted queue cancels our consumer, not silence
    "connection.blocked": True,
    "authentication_failure_close": True,  # a wrong password is a reason, not a reset
}


class Control:
    """Channel 0 of one link: handshake frames for :func:`handshake`, then close and blocked."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self.frames: asyncio.Queue[object] = asyncio.Queue()
        self.close_ok: asyncio.Future[None] = link.loop.create_future()

    def on_control(self, frame: bytes) -> None:
        """Handle a connection method from the broker."""
        method = pamqp_frame.unmarshal(frame)[2]
        if isinstance(method, spec.Connection.Close):
            self._link.write(pamqp_frame.marshal(spec.Connection.CloseOk(), 0))
            self._link.flush()
            reason = BrokerConnectionError(
                f"the broker closed the connection: {method.reply_code} {method.reply_text}"
            )
            self._link.abort(reason, graceful=True)
        elif isinstance(method, spec.Connection.CloseOk):
            if not self.close_ok.done():
                self.close_ok.set_result(None)
        elif isinstance(method, spec.Connection.Blocked):
            log.warning("the broker blocks publishing: %s", method.reason)
        elif isinstance(method, spec.Connection.Unblocked):
            log.info("the broker unblocked publishing")
        else:
            self.frames.put_nowait(method)

    def lose(self, reason: BaseException) -> None:
        """End channel 0: a handshake waiting learns why, a close waits no more."""
        self.frames.put_nowait(reason)
        if not self.close_ok.done():
            self.close_ok.set_result(None)

    async def next(self, expected: type) -> Any:  # noqa: ANN401 - the pamqp method asked for
        """Return the next handshake method, which must be of the expected type."""
        frame = await self.frames.get()
        if isinstance(frame, BaseException):
            raise frame
        if not isinstance(frame, expected):
            raise BrokerConnectionError(
                f"the broker sent {type(frame).__name__} during the handshake"
            )
        return frame


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuned:
    """What the handshake agreed with the broker."""

    frame_max: int
    channel_max: int
    heartbeat_s: int


def _least(*limits: int) -> int:
    """Return the least of the limits that are set (0 is no limit), or 0 when none is."""
    return min((limit for limit in limits if limit), default=0)


async def handshake(
    link: Link, control: Control, address: BrokerAddress, *, heartbeat_s: int, name: str
) -> Tuned:
    """Log in, tune and open the vhost; return what was agreed (the link is tuned by then).

    ``heartbeat_s`` is the interval asked for when the URL sets none. As in RabbitMQ's
    Java client, the least non-zero of the broker's and ours wins, so 0 on one side
    takes the other's.
    """
    await control.next(spec.Connection.Start)
    properties: dict[str, object] = {
        "connection_name": name,
        "product": "acemq-sidecar",
        "version": __version__,
        "capabilities": CAPABILITIES,
    }
    login = f"\0{address.login}\0{address.password.reveal()}"
    start_ok = spec.Connection.StartOk(
        client_properties=cast("Any", properties), mechanism="PLAIN", response=login
    )
    link.write(pamqp_frame.marshal(start_ok, 0))
    tune = await control.next(spec.Connection.Tune)
    tuned = Tuned(
        frame_max=_least(tune.frame_max, address.frame_max or 0, FRAME_MAX),
        channel_max=_least(tune.channel_max, address.channel_max or 0, CHANNEL_MAX),
        heartbeat_s=_least(
            tune.heartbeat, heartbeat_s if address.heartbeat_s is None else address.heartbeat_s
        ),
    )
    link.frame_max, link.channel_max = tuned.frame_max, tuned.channel_max
    tune_ok = spec.Connection.TuneOk(
        channel_max=tuned.channel_max, frame_max=tuned.frame_max, heartbeat=tuned.heartbeat_s
    )
    link.write(pamqp_frame.marshal(tune_ok, 0))
    link.write(pamqp_frame.marshal(spec.Connection.Open(virtual_host=address.vhost), 0))
    await control.next(spec.Connection.OpenOk)
    return tuned


def connection_close() -> bytes:
    """Return our ``connection.close`` frame (200, a normal close)."""
    close = spec.Connection.Close(reply_code=200, reply_text="closing", class_id=0, method_id=0)
    return pamqp_frame.marshal(close, 0)
