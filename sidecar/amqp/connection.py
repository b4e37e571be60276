"""One AMQP connection: opened by :func:`connect`, channels and passive checks from it.

It translates what can go wrong at this edge into our errors: :class:`ConnectFailedError`
(a ``ConnectionError`` too) to connect, :class:`ChannelLostError` and
:class:`MissingEntityError` afterwards. It never logs or raises a URL or a password.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.amqp import codec
from sidecar.amqp.channel import Channel
from sidecar.amqp.confirms import NOT_FOUND
from sidecar.amqp.handshake import Control, connection_close, handshake
from sidecar.amqp.lifecycle import CLOSE_TIMEOUT_S
from sidecar.amqp.link import Link
from sidecar.errors import (
    BrokerConnectionError,
    ChannelClosedError,
    ChannelLostError,
    ConnectFailedError,
    MissingEntityError,
)

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from sidecar.broker import BrokerAddress

__all__ = ["ClientOptions", "Connection", "QueueCounts", "connect"]

CLIENT_NAME: Final = "acemq-sidecar"


def _never(server_version: object) -> bool:  # noqa: ARG001 - the default: no release is
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientOptions:
    """What the client is told of the messages it carries and of the broker's releases.

    ``match_header``: a header whose value tells alike publishes apart when one comes back
    (``basic.return``), None for none. ``nack_is_free``: from the broker's ``version``
    property, whether a requeueing ``basic.nack`` spends no attempt of a quorum queue's
    delivery limit; where it is free, a consuming channel nacks what it holds before
    its close.
    """

    match_header: str | None = None
    nack_is_free: Callable[[object], bool] = _never


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueCounts:
    """A queue's counts at one moment, as a passive ``queue.declare`` reports them."""

    messages: int  # ready: not counting deliveries unacked on some channel
    consumers: int


class Connection:
    """One AMQP connection; channels come from here."""

    def __init__(self, link: Link, control: Control) -> None:
        self._link = link
        self._control = control
        self._next_channel = 0

    @property
    def is_open(self) -> bool:
        """Whether the connection is still usable."""
        return not self._link.closed.is_set()

    @property
    def mechanism(self) -> str | None:
        """The SASL mechanism the connection logged in with (None: made without a login)."""
        return self._control.mechanism

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason while it blocks publishing (``connection.blocked``), else None.

        While blocked the broker reads nothing more from a connection that publishes, so
        nothing new should be published; heartbeats go on meanwhile, both ways.
        """
        return self._control.blocked_reason

    async def wait_unblocked(self) -> None:
        """Return once the broker unblocks publishing (at once when it does not block).

        It returns too when the connection closes: check ``is_open`` after it.
        """
        await self._control.unblocked.wait()

    async def wait_closed(self) -> BaseException | None:
        """Return when the connection closes, with the reason when there is one."""
        await self._link.closed.wait()
        return self._link.close_reason

    async def channel(self, *, prefetch: int) -> Channel:
        """Open a confirm-mode channel with the given prefetch (the in-flight bound).

        Cancelled or failed half-way, it closes what it opened: no channel is left behind.
        """
        channel = await self._open()
        try:
            await channel.rpc(codec.confirm_select())
            await channel.qos(prefetch)
        except BaseException:
            await channel.close()
            raise
        return channel

    async def _open(self) -> Channel:
        if not self.is_open:
            raise ChannelLostError(f"the connection closed: {self._link.close_reason}")
        # Numbers go round 1..channel_max, so that a late frame for a channel just closed
        # never meets a new channel on the same number.
        limit, taken = self._link.channel_max, self._link.channels
        candidates = ((self._next_channel + step) % limit + 1 for step in range(limit))
        number = next((n for n in candidates if n not in taken), None)
        if number is None:
            raise ChannelLostError(f"all {limit} channel numbers the broker allows are in use")
        self._next_channel = number
        channel = Channel(self._link, number)
        taken[number] = channel
        try:
            await channel.open()
        except BaseException:
            await channel.close()
            raise
        return channel

    async def check_queue(self, name: str) -> None:
        """Passively check that a queue exists; raise MissingEntityError if not."""
        await self._check(codec.queue_declare_passive(name), "queue", name)

    async def check_exchange(self, name: str) -> None:
        """Passively check that an exchange exists (the default exchange always does)."""
        if name == "":
            return
        await self._check(codec.exchange_declare_passive(name), "exchange", name)

    async def _check(self, request: codec.Request, kind: str, name: str) -> None:
        # A failed passive declare closes its channel, so each check gets a scratch one.
        channel = await self._open()
        try:
            await channel.rpc(request)
        except ChannelClosedError as e:
            if e.code == NOT_FOUND:
                raise MissingEntityError(kind=kind, name=name) from e
            raise ChannelLostError(f"checking {kind} {name!r} failed: {e}") from e
        finally:
            await channel.close()

    async def close(self) -> None:
        """Close the connection, waiting at most a few seconds for the broker.

        Not at all while the broker blocks it: it reads nothing, the close included.
        """
        link = self._link
        if not link.closed.is_set():
            link.write(connection_close())
            wait_s = 0.0 if link.blocked else CLOSE_TIMEOUT_S
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel
                async with asyncio.timeout(wait_s):
                    await asyncio.shield(self._control.close_ok)
        link.abort(BrokerConnectionError("closed by the sidecar"))

    async def declare_passive(self, name: str) -> QueueCounts:
        """Return a queue's counts from a passive declare; raise MissingEntityError if none.

        ``messages`` is what is ready now: deliveries unacked on a channel are not in it.
        """
        channel = await self._open()  # a 404 closes the channel: a scratch one, as _check
        try:
            reply = await channel.rpc(codec.queue_declare_passive(name))
        except ChannelClosedError as e:
            if e.code == NOT_FOUND:
                raise MissingEntityError(kind="queue", name=name) from e
            raise ChannelLostError(f"checking queue {name!r} failed: {e}") from e
        finally:
            await channel.close()
        messages, consumers = reply.counts or (0, 0)
        return QueueCounts(messages=messages, consumers=consumers)


async def connect(
    address: BrokerAddress,
    *,
    heartbeat_s: int,
    connect_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    name: str = CLIENT_NAME,
    options: ClientOptions,
) -> Connection:
    """Open a connection; raise :class:`ConnectFailedError` with the reason when it fails.

    The URL's ``heartbeat`` and ``connection_timeout``, when it sets them, win over
    ``heartbeat_s`` and ``connect_timeout_s``; its ``frame_max`` and ``channel_max`` are
    ceilings on what the client asks for. The reason never holds the URL or the password.

    ``address.tls`` alone decides whether the connection uses TLS, whatever the case of
    the URL's scheme: ``ssl_context`` (the route map's CA and client certificate) is used
    when it does, and ignored when it does not; without one, the system's CAs verify the
    broker. ``options`` says what the client is told of its user's messages and of the
    broker's releases; every caller states them (``ClientOptions()``: none).
    """
    codec.install_codec()
    loop = asyncio.get_running_loop()
    link = Link(loop, match_header=options.match_header)
    link.control = control = Control(link)
    context: ssl.SSLContext | bool | None = (ssl_context or True) if address.tls else None
    timeout_s = (
        connect_timeout_s if address.connect_timeout_s is None else address.connect_timeout_s
    )
    try:
        async with asyncio.timeout(timeout_s):
            await loop.create_connection(
                lambda: link,
                address.host,
                address.port,
                ssl=context,
                server_hostname=address.host if context else None,
            )
            tuned = await handshake(
                link,
                control,
                address,
                heartbeat_s=heartbeat_s,
                name=name,
                nack_is_free=options.nack_is_free,
            )
    except (OSError, TimeoutError, ValueError) as e:  # ssl.SSLError is an OSError
        link.abort(BrokerConnectionError("connect failed"))
        raise ConnectFailedError(f"cannot connect to the broker: {e!r}") from e
    except BaseException:  # cancelled (a stop): leave no socket behind
        link.abort(BrokerConnectionError("connect cancelled"))
        raise
    link.start_heartbeat(tuned.heartbeat_s)
    return Connection(link, control)
