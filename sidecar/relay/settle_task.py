"""The task that carries a delivery's steps on when they cannot all be done at once.

``settle`` runs in a task the route owns (``relay.tasks``), from the step a ``Settling``
reached: each publish by the route's ``PlanPublisher`` (on the shared channel or alone,
in the unblock line's turn while the broker blocks), each wait (``relay.held_waits``),
then the last action on the channel the delivery came on. Every answer is read by the
``Settling`` (``answer``, then ``read``), as the confirm callback reads it: nothing of a
step is decided here. A missing exchange or queue pauses the route; a lost channel
leaves the delivery to the broker; a bug gives it back, logged with its traceback.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sidecar.errors import ChannelLostError, MissingEntityError
from sidecar.relay.held_waits import wait_out
from sidecar.settle import (
    BUG_REASON,
    Ack,
    Blocked,
    IfReturnBudget,
    Lost,
    Publish,
    Wait,
    WaitUnblocked,
)

if TYPE_CHECKING:
    from sidecar.relay.settling import Settling
    from sidecar.relay.unblock_line import Ticket
    from sidecar.settle import Answer, DeadLetter, GiveBack, LetGo, Requeue, Step

__all__ = ["settle"]

log = logging.getLogger("sidecar.relay")  # the relay's lines, whichever module writes them


async def settle(settling: Settling, step: Step | None, error: Exception | None = None) -> None:
    """Carry out a delivery's steps from ``step`` (its events seen) until it is settled.

    ``error``: what stopped it in a frame handler (a bug, a missing entity), dealt with
    here as the same error met in the task would be.
    """
    settler, consumer, delivery = settling.settler, settling.consumer, settling.delivery
    # A body over max_body_bytes: its frames wait on the connection for the publish that
    # takes them, or are dropped at the end if none did.
    if delivery.unread_body is not None:
        settling.stream = consumer.passing_body(delivery.delivery_tag)
    try:
        await _carry_out(settling, step, error)
    except MissingEntityError as e:
        # The passive checks of a reopen say when it exists again; till then the
        # deliveries wait in staging, not here.
        await settler.sink.give_back(consumer, None, str(e))
    except ChannelLostError as e:
        log.debug("route %s: delivery left to the broker: %s", settler.route.name, e)
    except Exception as e:  # noqa: BLE001 - logged with its traceback, the route paused
        await settler.sink.give_back(consumer, None, BUG_REASON, bug=e)
    finally:
        settling.uncount()
        settling.told(Lost(gone=True, error="its task ended"))  # a send span left open
        if (stream := settling.stream) is not None:
            stream.discard()
        if (trace := settling.trace) is not None:
            trace.end(None)  # left unsettled, unless its last action ended it
        settler.sink.finished(settling.held)


async def _carry_out(settling: Settling, step: Step | None, error: Exception | None) -> None:
    """Carry out each action of the settle step, from ``step`` to the last one.

    ``error`` (with no step): raised here, to end as the same error met in the task.
    """
    if error is not None:
        raise error
    settler = settling.settler
    ticket: Ticket | None = None  # its place in the unblock line, once its turn came
    try:
        while step is not None:
            settling.step = step
            action = step.action
            match action:
                case Publish():
                    answer, ticket = await publish_once(settling, action, ticket)
                    if not isinstance(answer, Blocked):
                        settling.uncount()  # answered: later copies may go from the handler
                    step = settling.read(answer)
                case Wait() | WaitUnblocked():
                    step, ticket = await wait_out(
                        action,
                        settling.consumer,
                        settler.stop,
                        settler.line,
                        settler.connection,
                        ticket,
                        settler.backoff,
                    )
                    if step is not None and step.events:  # None: the broker redelivers it
                        settling.observe(step)
                case IfReturnBudget(then=then, otherwise=otherwise):
                    step = then if settler.may_retry_return() else otherwise
                    if step.events:
                        settling.observe(step)
                case _:
                    await _last(settling, action)
                    return
    finally:
        if ticket is not None:  # it left without publishing
            settler.line.leave(ticket)


async def _last(settling: Settling, action: Ack | DeadLetter | GiveBack | LetGo | Requeue) -> None:
    """Carry out the delivery's last action; an ack is counted by the ``Settling``."""
    settler, consumer, delivery = settling.settler, settling.consumer, settling.delivery
    if isinstance(action, Ack):
        if settling.stream is not None:
            settler.rounds.forget(delivery)
        settling.acked(action, acked=await consumer.ack(delivery.delivery_tag))
        return
    await settler.last.run(consumer, delivery, action, started=settling.started)
    if (trace := settling.trace) is not None:
        trace.end(action)


async def publish_once(
    settling: Settling, publish: Publish, ticket: Ticket | None
) -> tuple[Answer, Ticket | None]:
    """Publish the step's plan once; return the broker's answer, and the line's ticket.

    Nothing is published for a delivery whose channel is closing (its ack would be refused
    and the broker redelivers it: the copy would be a certain duplicate), nor while the
    connection is blocked (a copy written then would sit in the socket and might reach the
    broker after a SIGTERM gave its delivery back). Copies waiting in the unblock line go
    first: one holding the line's ``ticket`` leaves the line as its publish starts.
    """
    settler = settling.settler
    plan = settling.sending(publish.plan)
    if (not_yet := settler.not_now(settling.consumer, ticket=ticket)) is not None:
        if ticket is not None and not isinstance(not_yet, Blocked):
            settler.line.leave(ticket)
            ticket = None
        settling.told(not_yet)
        return not_yet, ticket
    if ticket is not None:
        settler.line.leave(ticket)
    lane = settler.lane
    assert lane is not None  # noqa: S101 - attached before consuming starts
    settling.lane, settling.is_slow = lane, False  # a new publish: its own confirm may be late
    try:
        result = await settler.publisher.publish(
            lane,
            settling.delivery,
            plan,
            alone=publish.alone,
            on_slow=settling.slow,
            stream=settling.stream,
        )
    except Exception as e:  # noqa: BLE001 - every exception of a publish is read as an answer
        return settling.answer(e), None
    return settling.answer(result), None
