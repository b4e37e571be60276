"""One route's publish channels: the shared one, reopened on demand, and one-off ones.

A route consumes on one channel and publishes its copies on another, so that a publish
the broker refuses by closing the channel (403 ACCESS_REFUSED, 406 PRECONDITION_FAILED)
takes down only the publish channel: the consumed deliveries stay unacked on theirs, are
not requeued, and spend none of a quorum queue's delivery limit. The shared channel is
reopened by the next publish that needs it; a publish that must be told apart from the
others (whose refusal was it?) goes alone on a channel of its own, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sidecar.amqp import Publisher, RelayConnection

__all__ = ["PublishLane"]

PUBLISH_PREFETCH = 1  # the publish channel consumes nothing; its qos is never used


class PublishLane:
    """The publish channels of one route on one connection; see the module docstring."""

    def __init__(self, connection: RelayConnection) -> None:
        self._connection = connection
        self._shared: Publisher | None = None
        self._opening = asyncio.Lock()
        self._alone = asyncio.Lock()  # one publish alone at a time: no storm of channels
        self._closed = False

    @property
    def connection_open(self) -> bool:
        """Whether the connection the channels come from is still usable."""
        return self._connection.is_open and not self._closed

    async def open(self) -> None:
        """Open the shared channel now, so that a route that cannot publish does not start."""
        await self.publisher()

    async def publisher(self) -> Publisher:
        """Return the shared publish channel, opening a new one if the broker closed it."""
        shared = self._shared
        if shared is not None and shared.is_open:
            return shared
        async with self._opening:
            shared = self._shared
            if shared is None or not shared.is_open:
                self._shared = shared = await self._connection.channel(prefetch=PUBLISH_PREFETCH)
            if self._closed:  # closed while it opened: leave nothing behind
                await shared.close()
            return shared

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[Publisher]:
        """Yield a channel of its own for one publish; close it afterwards."""
        async with self._alone:
            channel = await self._connection.channel(prefetch=PUBLISH_PREFETCH)
            try:
                yield channel
            finally:
                await channel.close()

    async def close(self) -> None:
        """Close the shared channel (its unconfirmed publishes fail as lost)."""
        self._closed = True
        shared, self._shared = self._shared, None
        if shared is not None:
            await shared.close()
