"""Channel 0: the AMQP handshake, and the connection's own methods once it is open.

The handshake is start / start-ok (a SASL mechanism chosen from the broker's list, our
client properties and capabilities), tune / tune-ok (the least of what the broker, the URL
and the client allow; the broker's frame size is taken) and open / open-ok (the vhost).
Afterwards channel 0 carries the broker's close (answered with close-ok), the close-ok to
ours, and ``connection.blocked`` / ``unblocked``, which it keeps as the broker's reason
while blocked. pamqp encodes and decodes these methods; this module and
:mod:`sidecar.amqp.codec` are the only ones that import it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from pamqp import commands as spec
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp.exceptions import PAMQPException

from sidecar import __version__
from sidecar.amqp.link import CHANNEL_MAX, FRAME_MAX_CEILING
from sidecar.amqp.violations import FrameError
from sidecar.errors import BrokerConnectionError
from sidecar.wire import FRAME_END, FRAME_METHOD, HEADER

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp.link import Link
    from sidecar.broker import BrokerAddress

__all__ = [
    "CAPABILITIES",
    "Control",
    "Tuned",
    "choose_mechanism",
    "connection_close",
    "handshake",
    "sasl_response",
]

log = logging.getLogger(__name__)

CAPABILITIES: Final = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,  # a deleted queue cancels our consumer, not silence
    "connection.blocked": True,
    "authentication_failure_close": True,  # a wrong password is a reason, not a reset
}
_SHORTSTR_MAX: Final = 255
# RabbitMQ 4.1 and later refuse a frame_max under 8 KiB (AMQP 0-9-1 allows 4 KiB).
BROKER_FRAME_MIN: Final = 8192


class Control:
    """Channel 0 of one link: handshake frames for :func:`handshake`, then close and blocked."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self.frames: asyncio.Queue[object] = asyncio.Queue()
        self.close_ok: asyncio.Future[None] = link.loop.create_future()
        self.blocked_reason: str | None = None
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self.mechanism: str | None = None  # the SASL mechanism that logged in, once it did

    def on_control(self, frame: bytes) -> None:
        """Handle a connection method from the broker."""
        try:
            method = pamqp_frame.unmarshal(frame)[2]
        except (PAMQPException, ValueError, struct.error) as e:
            raise FrameError(f"a connection method that does not decode: {e}") from e
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
            self.blocked_reason = str(method.reason or "no reason given")
            self._link.blocked = True
            self.unblocked.clear()
            log.warning("the broker blocks publishing: %s", self.blocked_reason)
        elif isinstance(method, spec.Connection.Unblocked):
            self.blocked_reason = None
            self._link.blocked = False
            self.unblocked.set()
            log.info("the broker unblocked publishing")
        else:
            self.frames.put_nowait(method)

    def lose(self, reason: BaseException) -> None:
        """End channel 0: a handshake waiting learns why, a close or unblock waits no more."""
        self.frames.put_nowait(reason)
        if not self.close_ok.done():
            self.close_ok.set_result(None)
        self.blocked_reason = None
        self._link.blocked = False
        self.unblocked.set()

    def close_frame(self, reply_code: int, reply_text: str) -> bytes:
        """Return our ``connection.close`` frame with this code and text (cut to fit)."""
        text = reply_text.encode()[:_SHORTSTR_MAX].decode(errors="ignore")
        close = spec.Connection.Close(
            reply_code=reply_code, reply_text=text, class_id=0, method_id=0
        )
        return pamqp_frame.marshal(close, 0)

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


def _offered(mechanisms: object) -> list[str]:
    if isinstance(mechanisms, bytes):
        mechanisms = mechanisms.decode("utf-8", "replace")
    return str(mechanisms or "").upper().split()


def choose_mechanism(address: BrokerAddress, offered: list[str]) -> str:
    """Return the first mechanism of ours the broker offers; raise saying both lists if none.

    Ours are ``address.mechanisms()``, in their order.
    """
    ours = address.mechanisms()
    if address.auth_mechanisms:
        why = "the URL's auth_mechanism asks for"
    elif ours[0] == "EXTERNAL":
        why = "with no user in the URL over amqps:// the client logs in with"
    else:
        why = "the client logs in with"
    chosen = next((mechanism for mechanism in ours if mechanism in offered), None)
    if chosen is None:
        raise BrokerConnectionError(
            f"no SASL mechanism in common: the broker offers {' '.join(offered) or 'none'},"
            f" {why} {' or '.join(ours)}; set the URL's auth_mechanism to one the broker"
            " offers, or enable one of ours on the broker (RabbitMQ's auth_mechanisms)"
        )
    return chosen


def sasl_response(mechanism: str, address: BrokerAddress) -> bytes:
    """Return the start-ok response of a mechanism: the login, as that mechanism writes it."""
    login = address.login.encode()
    password = address.password.reveal().encode()
    match mechanism:
        case "PLAIN":
            return b"\0" + login + b"\0" + password
        case "AMQPLAIN":  # a field table's content, without its length (RabbitMQ reads it so)
            return (
                b"\x05LOGINS"
                + struct.pack(">I", len(login))
                + login
                + b"\x08PASSWORDS"
                + struct.pack(">I", len(password))
                + password
            )
        case "EXTERNAL":  # the broker reads the login from the client certificate
            return b""
    raise BrokerConnectionError(f"the client does not speak the SASL mechanism {mechanism}")


def _start_ok(properties: dict[str, object], mechanism: str, response: bytes) -> bytes:
    # Built here, not by pamqp: its start-ok takes the response as text, and AMQPLAIN's
    # is binary (lengths in four bytes each).
    payload = b"".join(
        (
            struct.pack(">HH", 10, 11),
            pamqp_encode.field_table(cast("Any", properties)),
            pamqp_encode.short_string(mechanism),
            struct.pack(">I", len(response)),
            response,
            pamqp_encode.short_string("en_US"),
        )
    )
    return HEADER.pack(FRAME_METHOD, 0, len(payload)) + payload + bytes((FRAME_END,))


def _refused(mechanism: str, address: BrokerAddress, error: BaseException) -> Exception:
    who = (
        "the client certificate's subject" if mechanism == "EXTERNAL" else f"user {address.login!r}"
    )
    hint = (
        "; EXTERNAL needs a client certificate the broker trusts (broker.tls.cert_file and"
        " key_file) and a user named as its subject"
        if mechanism == "EXTERNAL"
        else ""
    )
    return BrokerConnectionError(
        f"the broker refused the login with SASL mechanism {mechanism} as {who}: {error}{hint}"
    )


async def handshake(
    link: Link,
    control: Control,
    address: BrokerAddress,
    *,
    heartbeat_s: int,
    name: str,
    nack_is_free: Callable[[object], bool],
) -> Tuned:
    """Log in, tune and open the vhost; return what was agreed (the link is tuned by then).

    ``heartbeat_s`` is the interval asked for when the URL sets none. As in RabbitMQ's
    Java client, the least non-zero of the broker's and ours wins, so 0 on one side
    takes the other's. The broker's frame size is taken (up to ``FRAME_MAX_CEILING``, which
    is also ours when it sets none), unless the URL's ``frame_max`` is lower.
    ``nack_is_free`` reads the broker's ``version`` property into the link's.
    """
    start = await control.next(spec.Connection.Start)
    mechanism = choose_mechanism(address, _offered(start.mechanisms))
    properties: dict[str, object] = {
        "connection_name": name,
        "product": "acemq-sidecar",
        "version": __version__,
        "capabilities": CAPABILITIES,
    }
    link.write(_start_ok(properties, mechanism, sasl_response(mechanism, address)))
    try:
        tune = await control.next(spec.Connection.Tune)
    except BrokerConnectionError as e:  # RabbitMQ closes with 403 on a refused login
        raise _refused(mechanism, address, e) from e
    tuned = Tuned(
        frame_max=_least(tune.frame_max, address.frame_max or 0, FRAME_MAX_CEILING),
        channel_max=_least(tune.channel_max, address.channel_max or 0, CHANNEL_MAX),
        heartbeat_s=_least(
            tune.heartbeat, heartbeat_s if address.heartbeat_s is None else address.heartbeat_s
        ),
    )
    link.frame_max, link.channel_max = tuned.frame_max, tuned.channel_max
    link.nack_is_free = nack_is_free((start.server_properties or {}).get("version"))
    tune_ok = spec.Connection.TuneOk(
        channel_max=tuned.channel_max, frame_max=tuned.frame_max, heartbeat=tuned.heartbeat_s
    )
    link.write(pamqp_frame.marshal(tune_ok, 0))
    link.write(pamqp_frame.marshal(spec.Connection.Open(virtual_host=address.vhost), 0))
    try:
        await control.next(spec.Connection.OpenOk)
    except (BrokerConnectionError, ConnectionError) as e:
        if tuned.frame_max < BROKER_FRAME_MIN:
            raise _frames_too_small(tuned.frame_max, e) from e
        raise
    control.mechanism = mechanism
    return tuned


def _frames_too_small(frame_max: int, error: BaseException) -> BrokerConnectionError:
    """Return the connect error of a handshake ended after asking for frames under 8 KiB."""
    return BrokerConnectionError(
        f"the broker ended the connection after tune-ok ({error}); the URL asks for"
        f" frame_max={frame_max}, and RabbitMQ 4.1 and later end a connection that asks for"
        f" less than {BROKER_FRAME_MIN}: raise the URL's frame_max to {BROKER_FRAME_MIN} or"
        " more, or leave it out"
    )


def connection_close() -> bytes:
    """Return our ``connection.close`` frame (200, a normal close)."""
    close = spec.Connection.Close(reply_code=200, reply_text="closing", class_id=0, method_id=0)
    return pamqp_frame.marshal(close, 0)
