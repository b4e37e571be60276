"""A link's liveness: heartbeats both ways, and the kernel's bound on what goes unacknowledged.

Every half interval the link writes a heartbeat if it wrote nothing else, and gives the
broker up after two intervals in which it read nothing. It cannot judge the broker's
silence while it reads nothing itself (its write buffer is over the mark, or a channel has
no room): the broker's frames wait unread then. So the kernel is given the same bound
(``TCP_USER_TIMEOUT``, Linux): what was written and not acknowledged for two intervals ends
the socket, which a half-open connection would otherwise keep for the kernel's
retransmissions, some fifteen minutes. While the broker blocks the connection (a resource
alarm) it reads nothing by design and its window may stay closed: the bound is lifted until
it unblocks (docs/decisions/0067-silent-network-faults.md).
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

from sidecar.errors import BrokerConnectionError
from sidecar.wire import HEARTBEAT

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

__all__ = ["Heartbeats"]

_USER_TIMEOUT: int | None = getattr(socket, "TCP_USER_TIMEOUT", None)


class Heartbeats:
    """The heartbeat half of the link (a mixin: the link has the socket and its clocks)."""

    loop: asyncio.AbstractEventLoop
    reading_off: bool
    reading_held: bool
    _transport: asyncio.Transport | None
    _last_read: float
    _last_write: float
    _heartbeat: asyncio.TimerHandle | None = None
    _interval_s = 0
    _blocked = False

    def write(self, data: bytes | list[bytes | memoryview]) -> None:
        """Write to the socket (the link's)."""
        raise NotImplementedError

    def abort(self, reason: BaseException, *, graceful: bool = False) -> None:
        """End the connection (the link's)."""
        raise NotImplementedError

    @property
    def blocked(self) -> bool:
        """The broker said connection.blocked: it reads nothing from this link until unblocked.

        No answer to what is written meanwhile will come, and the kernel's bound is lifted.
        """
        return self._blocked

    @blocked.setter
    def blocked(self, blocked: bool) -> None:
        if blocked != self._blocked:
            self._blocked = blocked
            self._bound_unacknowledged(0 if blocked else 2 * self._interval_s)

    def start_heartbeat(self, interval_s: int) -> None:
        """Send a heartbeat when idle; drop the connection after two silent intervals."""
        if interval_s <= 0:
            return
        self._interval_s = interval_s
        if not self._blocked:
            self._bound_unacknowledged(2 * interval_s)
        self._heartbeat = self.loop.call_later(interval_s / 2, self._beat(interval_s))

    def stop_heartbeat(self) -> None:
        """Send and expect no more heartbeats (the link ended)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()

    def _beat(self, interval_s: int) -> Callable[[], None]:
        def beat() -> None:
            now = self.loop.time()
            if self.reading_off or self.reading_held:
                # We stopped reading: what the broker sent waits unread, so its silence
                # tells nothing. The kernel ends a socket whose writes go unacknowledged.
                self._last_read = now
            if now - self._last_read > 2 * interval_s:
                self.abort(
                    BrokerConnectionError(f"no heartbeat from the broker in {2 * interval_s}s")
                )
                return
            if now - self._last_write >= interval_s / 2:
                self.write(HEARTBEAT)
            self._heartbeat = self.loop.call_later(interval_s / 2, beat)

        return beat

    def _bound_unacknowledged(self, seconds: int) -> None:
        """End the socket when what it wrote is not acknowledged within ``seconds`` (0: never)."""
        transport = self._transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if _USER_TIMEOUT is None or sock is None:
            return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _USER_TIMEOUT, seconds * 1000)
