"""One route's publish channels: the shared one, reopened on demand, and one-off ones.

A route consumes on one channel and publishes its copies on another, so that a publish
the broker refuses by closing the channel (403 ACCESS_REFUSED, 406 PRECONDITION_FAILED)
takes down only the publish channel: the consumed deliveries stay unacked on theirs, are
not requeued, and spend none of a quorum queue's delivery limit. The shared channel is
reopened by the next publish that needs it; a publish that must be told apart from the
others (whose refusal was it?) goes alone on a channel of its own, one at a time.

A shared channel that nacked a publish is retired: the next publish opens a new one, and
the retired channel closes once the publishes in flight on it have their answers. RabbitMQ
3.10 can keep nacking every publish on a channel whose first publish to a quorum queue came
while that queue elected a new leader, while a new channel is acked at once
(docs/scaling.md); a full queue with overflow reject-publish costs one new channel per
round of retries, not one per message.

Every publish passes the connection's gate (``sidecar.relay.connection_gate``) before it is
written: after a quiet spell a probe goes first, so that a broker alarm never catches a
copy in the broker's socket buffer (``sidecar.flow.publish_gate`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from sidecar.amqp import ChannelLostError
from sidecar.relay.connection_gate import ConnectionGate, answered
from sidecar.relay.waits import first_of
from sidecar.wire import PublishOutcome

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sidecar.amqp import Publisher, RelayConnection

__all__ = ["PublishLane", "Shared"]

PUBLISH_PREFETCH = 1  # the publish channel consumes nothing; its qos is never used
# A publish channel the broker has not opened in this long is given up (ChannelLostError):
# a broker that blocks the connection reads no channel.open, and one that is merely slow
# answers in milliseconds.
OPEN_TIMEOUT_S = 30.0


class Shared:
    """A shared publish channel, how many publishes are on it, and whether it is retired."""

    __slots__ = ("publisher", "retired", "users")

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.users = 0
        self.retired = False


class PublishLane:
    """The publish channels of one route on one connection; see the module docstring."""

    def __init__(self, connection: RelayConnection, *, stop: asyncio.Event) -> None:
        self._connection = connection
        self._gate = ConnectionGate.of(connection)
        self._stop = stop  # lets a publish waiting at the gate go, with nothing written
        self._shared: Shared | None = None
        self._retired: list[Shared] = []  # closed by their last user, or by close()
        self._opening = asyncio.Lock()
        self._alone = asyncio.Lock()  # one publish alone at a time: no storm of channels
        self._closing: set[asyncio.Task[None]] = set()  # retired channels being closed
        self._closed = False

    @property
    def connection_open(self) -> bool:
        """Whether the connection the channels come from is still usable."""
        return self._connection.is_open and not self._closed

    async def open(self) -> None:
        """Open the shared channel now, so that a route that cannot publish does not start."""
        await self._current()

    def shared(self) -> SharedUse:
        """Enter the shared publish channel: a new one if the broker closed it or it retired.

        ``async with lane.shared() as publisher``. The channel is counted as in use until the
        block ends, so that a retired one is closed only once no publish waits on it. A
        class, not a generator: every publish enters it. Entering passes the connection's
        gate; a stop while it waits there raises ``ChannelLostError``.
        """
        return SharedUse(self)

    def shared_now(self) -> Shared | None:
        """Take the shared channel for a publish now, if it is open and the gate lets it go.

        For ``Settling.publish_now``, in a frame handler: None when a publish would have to
        wait (a channel to open, a probe at the gate); ``release_now`` gives it back once
        answered.
        """
        shared = self._shared
        if shared is None or not shared.publisher.is_open or not self._gate.try_enter():
            return None
        shared.users += 1
        return shared

    def release_now(self, shared: Shared, result: PublishOutcome | BaseException | None) -> None:
        """Give back what ``shared_now`` took: the publish has its ``result``, or went unsent.

        A retired channel's last use closes it, in a task of the lane's.
        """
        if isinstance(result, PublishOutcome):
            self.answered(shared.publisher, result)
            self._gate.leave(lead=0, answered=True)
        else:
            self._gate.leave(lead=0, answered=result is not None and answered(result))
        if self._last_use(shared):
            task = asyncio.get_running_loop().create_task(
                shared.publisher.close(), name="publish-channel-close"
            )
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def answered(self, publisher: Publisher, published: PublishOutcome) -> None:
        """Hear the broker's answer to a publish on the shared channel: a nack retires it.

        The retry goes on a new channel (the module docstring says why).
        """
        if published is PublishOutcome.NACKED:
            self.retire(publisher)

    async def _release(self, shared: Shared) -> None:
        if self._last_use(shared):
            await shared.publisher.close()

    def _last_use(self, shared: Shared) -> bool:
        """Count a use of ``shared`` out; True when it ended a retired channel's last one."""
        shared.users -= 1
        if shared.retired and shared.users == 0 and shared in self._retired:
            self._retired.remove(shared)
            return True
        return False

    def retire(self, publisher: Publisher) -> None:
        """Publish nothing new on this shared channel; the next publish opens another."""
        shared = self._shared
        if shared is None or shared.publisher is not publisher:
            return  # retired already, or not the shared one
        self._shared = None
        shared.retired = True
        self._retired.append(shared)

    async def _current(self) -> Shared:
        shared = self._shared
        if shared is not None and shared.publisher.is_open:
            return shared
        async with self._opening:
            shared = self._shared
            if shared is None or not shared.publisher.is_open:
                channel = await self._new_channel()
                self._shared = shared = Shared(channel)
            if self._closed:  # closed while it opened: leave nothing behind
                await shared.publisher.close()
            return shared

    @contextlib.asynccontextmanager
    async def alone(self, *, in_turn: bool = True) -> AsyncIterator[Publisher]:
        """Yield a channel of its own for one publish; close it afterwards.

        The publish passes the connection's gate first, as a shared one does. When the
        probe went on this channel and the broker refused it (closing the channel), the
        publish goes on a new one: nothing of it was written. ``in_turn``: after the other
        publishes alone of the route; not for a body passing through, whose frames hold
        the consuming connection's reading while it waits.
        """
        async with self._alone if in_turn else contextlib.nullcontext():
            channel: Publisher = await self._new_channel()
            try:
                while True:
                    try:
                        lead = await self._enter_gate(channel)
                        break
                    except ChannelLostError:
                        if not self._may_take_another(channel):
                            raise
                    channel = await self._another_alone(channel)
            except BaseException:
                await channel.close()
                raise
            error: BaseException | None = None
            try:
                if not channel.is_open:  # the probe's refusal closed it
                    channel = await self._another_alone(channel)
                yield channel
            except BaseException as e:
                error = e
                raise
            finally:
                self._gate.leave(lead=lead, answered=answered(error))
                await channel.close()

    async def _another_alone(self, closed: Publisher) -> Publisher:
        await closed.close()
        return await self._new_channel()

    async def _new_channel(self) -> Publisher:
        """Open a publish channel; ``ChannelLostError`` at a stop or after ``OPEN_TIMEOUT_S``.

        Whatever the opening made by then is closed (the client's ``channel`` does that
        when cancelled, and one that opened as the stop came is closed here).
        """
        opening = asyncio.get_running_loop().create_task(
            self._connection.channel(prefetch=PUBLISH_PREFETCH), name="publish-channel-open"
        )
        which, _ = await first_of(opening, self._stop.wait(), asyncio.sleep(OPEN_TIMEOUT_S))
        if which == 0:
            return opening.result()
        await asyncio.wait((opening,))  # cancelled: it closes what it opened
        if not opening.cancelled() and opening.exception() is None:
            await opening.result().close()  # it had opened as the stop came
        if which == 1:
            raise ChannelLostError("stopping while a publish channel opened")
        raise ChannelLostError(
            f"the broker did not open a publish channel within {OPEN_TIMEOUT_S:.0f}s"
        )

    def _may_take_another(self, channel: Publisher) -> bool:
        """Whether a publish the gate turned away (its channel closed) takes a new one."""
        return not channel.is_open and not self._stop.is_set() and self.connection_open

    async def _enter_gate(self, channel: Publisher) -> int:
        """Pass the connection's gate; the lead number ``leave`` takes back (0: not a lead)."""
        gate = self._gate
        if gate.try_enter():
            return 0
        return await gate.enter(self._stop, channel=channel)

    async def close(self) -> None:
        """Close the shared and retired channels (their unconfirmed publishes fail as lost)."""
        self._closed = True
        shared, self._shared = self._shared, None
        retired, self._retired = self._retired, []
        for each in [*retired, *([shared] if shared is not None else [])]:
            await each.publisher.close()


class SharedUse:
    """One publish's use of the shared channel: ``async with lane.shared() as publisher``."""

    __slots__ = ("_lane", "_lead", "_shared")

    def __init__(self, lane: PublishLane) -> None:
        self._lane = lane
        self._shared: Shared | None = None
        self._lead = 0

    async def __aenter__(self) -> Publisher:
        lane = self._lane
        shared = await lane._current()  # noqa: SLF001 - the lane's own helper
        shared.users += 1
        if not lane._gate.try_enter():  # noqa: SLF001 - the common case costs no coroutine
            shared = await self._through_gate(shared)
        self._shared = shared
        return shared.publisher

    async def _through_gate(self, shared: Shared) -> Shared:
        """Wait at the connection's gate; the channel to publish on once through it.

        A channel closed before it could carry a probe (nothing of this publish was
        written) is replaced and the gate entered again; one the probe's refusal closed
        is replaced after it. Once through, every way out of here leaves the gate.
        """
        lane = self._lane
        while True:
            try:
                self._lead = await lane._enter_gate(shared.publisher)  # noqa: SLF001
                break
            except ChannelLostError:
                await lane._release(shared)  # noqa: SLF001
                if not lane._may_take_another(shared.publisher):  # noqa: SLF001
                    raise
            except BaseException:
                await lane._release(shared)  # noqa: SLF001
                raise
            shared = await lane._current()  # noqa: SLF001
            shared.users += 1
        if shared.publisher.is_open and not shared.retired:
            return shared
        # A refusal of the probe closed it, or a nack retired it while this publish waited
        # (nothing of this publish was on it): a new one.
        try:
            await lane._release(shared)  # noqa: SLF001
            shared = await lane._current()  # noqa: SLF001
        except BaseException:
            lane._gate.leave(lead=self._lead, answered=False)  # noqa: SLF001
            raise
        shared.users += 1
        return shared

    async def __aexit__(
        self, _type: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> None:
        shared = self._shared
        if shared is not None:
            self._shared = None
            self._lane._gate.leave(lead=self._lead, answered=answered(error))  # noqa: SLF001
            await self._lane._release(shared)  # noqa: SLF001
