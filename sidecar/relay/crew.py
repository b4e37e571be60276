"""What a route's deliveries are settled with: the route's rules and collaborators.

A ``Crew`` is made by the route's ``Settler`` at each ``attach`` (a session's publishing
connection and lane) and again when the route's rules change; each
delivery's ``Settling`` keeps the crew it began with, and never reaches back into the
settler. ``Queued`` counts the route's copies waiting on a task, which no later copy may
overtake. Written out as plain classes, not dataclasses: the compiled build makes them
native (a dataclass's annotations would be loaded at import, the types a session's
collaborators are only named for the type checker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from sidecar.amqp import RelayConnection
    from sidecar.relay.lane import PublishLane
    from sidecar.relay.passing_rounds import PassingRounds
    from sidecar.relay.publisher import PlanPublisher
    from sidecar.relay.sink import RouteSink
    from sidecar.relay.slow_confirms import SlowConfirms
    from sidecar.relay.tasks import RouteTasks
    from sidecar.relay.unblock_line import UnblockLine
    from sidecar.settle import Rules

__all__ = ["Crew", "Queued"]


class Queued:
    """How many of a route's copies wait on a task unanswered: none later overtakes them."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class Crew:
    """What one route's deliveries are settled with; not changed once made."""

    __slots__ = (
        "backoff",
        "confirms",
        "connection",
        "lane",
        "line",
        "may_retry_return",
        "monotonic",
        "publisher",
        "queued",
        "rounds",
        "route",
        "rules",
        "sink",
        "stop",
        "tasks",
    )

    def __init__(
        self,
        *,
        route: str,
        rules: Rules,
        sink: RouteSink,
        publisher: PlanPublisher,
        lane: PublishLane,
        connection: RelayConnection,
        line: UnblockLine,
        rounds: PassingRounds,
        confirms: SlowConfirms,
        tasks: RouteTasks,
        queued: Queued,
        stop: asyncio.Event,
        backoff: Callable[[int], float],
        may_retry_return: Callable[[], bool],
        monotonic: Callable[[], float],
    ) -> None:
        self.route, self.rules, self.sink, self.publisher = route, rules, sink, publisher
        self.lane = lane
        self.connection = connection  # the publishing one: the broker blocks only that
        self.line = line  # copies waiting for the broker's unblock, in order
        self.rounds = rounds  # of the bodies passed through, given back
        self.confirms = confirms  # the frame handlers' copies awaiting a confirm
        self.tasks, self.queued, self.stop = tasks, queued, stop
        self.backoff = backoff  # a wait's delay at its backoff step (random)
        self.may_retry_return = may_retry_return  # the route's budget of returned copies
        self.monotonic = monotonic
