"""The rounds of a body passed through whose quarantine copy the broker did not take.

Such a delivery goes back to its queue (its body is not held), so the next try is a new
delivery of the same message: this remembers, per message, when its first round began and
how many rounds it has had, so that its waits grow from round to round and its hold ends
at the same deadline as any held quarantine copy's (then it is dead-lettered), instead of
starting afresh at each redelivery. A message is known by its routing key, its body size
and its ``x-acemq-id`` (or ``message_id``); the table keeps the most recent ``KEEP``. Pure
bookkeeping: the delivery's ``Settling`` drops a body its publish did not take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sidecar.contract import ID

if TYPE_CHECKING:
    from sidecar.wire import Delivery

__all__ = ["FIRST_ROUND", "KEEP", "PassingRounds"]

KEEP: Final = 1024
# A round costs the body's transfer twice and, on a quorum queue, one delivery of its
# limit: the first wait is the backoff's fifth step (about 4 s), not its first.
FIRST_ROUND: Final = 4

_Key = tuple[str, int, str]


class PassingRounds:
    """Per message passed through: when its rounds began and how many it had."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[_Key, tuple[float, int]] = {}  # oldest first

    def timing(self, delivery: Delivery, *, started: float, now: float) -> tuple[float, int]:
        """Return how long the message has been held over all its rounds, and its step.

        ``started``: when this delivery came. The step is the backoff's, from
        ``FIRST_ROUND`` on.
        """
        first, rounds = self._seen.get(_key(delivery), (started, 0))
        return now - first, FIRST_ROUND + rounds

    def again(self, delivery: Delivery, *, started: float) -> None:
        """Count a round given back to the queue."""
        key = _key(delivery)
        first, rounds = self._seen.pop(key, (started, 0))
        self._seen[key] = (first, rounds + 1)
        if len(self._seen) > KEEP:
            del self._seen[next(iter(self._seen))]

    def forget(self, delivery: Delivery) -> None:
        """Forget a message settled (quarantined or dead-lettered)."""
        self._seen.pop(_key(delivery), None)


def _key(delivery: Delivery) -> _Key:
    unread = delivery.unread_body
    size = unread.size if unread is not None else len(delivery.body)
    name = delivery.headers.get(ID) or delivery.properties.get("message_id") or ""
    return (delivery.routing_key, size, str(name))
