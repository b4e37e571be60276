"""A model of one route's deliveries and publish channels, checked by stateful testing.

Hypothesis plays the broker (``tests.fakes.model_broker.ModelBroker``) against the real
relay: the route's ``RouteWorker`` (its consumer, settler, settle step, publish lane and
gate) on the sidecar's own AMQP client (link, channels, ``Confirms``), a consuming and a
publishing connection as in production. Each rule is one thing the broker does; between
rules the event loop runs until it is idle, on a clock that moves only by ``time_passes``.

The rules: a message arrives in staging (bodies and x-acemq-id alike or not, with the
model's marker header or not, some with a header the contract rejects, some given back
before: redelivered with an x-delivery-count), and the queue delivers it as soon as a
consumer has credit (again after a requeue); the broker returns a copy it could not route
(a binding gone), with or without a header added on its way (RabbitMQ's
``timestamp_in_ms``); it confirms or nacks a copy, singly or ``multiple``; it closes a
publish channel (403, 404, 406, 541); an alarm blocks the publishing connection, and
clears; the broker cancels the consumer, or takes its deliveries back (its
consumer_timeout: a 406 on the consuming channel); time passes; SIGTERM
(``request_stop``) or a reload (the worker replaced by a new one, as the fleet does).

The invariants, after every step: a delivery is acked only once a copy of its message is
stored in the target or quarantine queue and confirmed to the client (never on a copy
that was returned, nacked or lost), and never twice (an unknown tag is the broker's 406);
the client breaks no protocol rule and the relay logs no bug. At the end, with the broker
answering everything and the route stopped and its connections closed: every delivery
was acked (relayed or quarantined), dead-lettered or given back, as the route's metrics
count them too; nothing is in flight; and on a single-active-consumer route (or any route
with one worker) the copies that went straight through reached the target in the staging
queue's order.

``ACEMQ_MODEL_EXAMPLES`` raises the number of examples (``./dev fuzz``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from typing import TYPE_CHECKING, Any, Final

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from prometheus_client import CollectorRegistry

from sidecar.clock import Clock
from sidecar.observe.metrics import Metrics
from sidecar.relay.context import RouteContext
from sidecar.relay.worker import RouteWorker
from sidecar.routemap import Mode, Publishers, Route, RouteLimits
from tests.fakes.model_broker import (
    ACKED,
    DEAD,
    DROPPED,
    READY,
    ModelBroker,
    VirtualTimeLoop,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.amqp import Connection
    from tests.fakes.model_broker import BrokerChannel, Copy, Side

QUEUE: Final = "staging.orders"
TARGET: Final = "orders"
QUARANTINE: Final = "acemq.quarantine"
MAX_MESSAGES: Final = 4  # messages in the model's staging queue, each delivered any number of times
PREFETCH: Final = 4
DELIVERY_LIMIT: Final = 4  # the staging queue's x-delivery-limit, and the route's
GRACE_S: Final = 10.0
EXAMPLES: Final = int(os.environ.get("ACEMQ_MODEL_EXAMPLES", "200"))

CLOSES: Final = {
    403: f"ACCESS_REFUSED - access to exchange '{TARGET}' in vhost '/' refused for user 'sidecar'",
    404: f"NOT_FOUND - no exchange '{TARGET}' in vhost '/'",
    406: "PRECONDITION_FAILED - message size 300 is larger than configured max size 200",
    541: "INTERNAL_ERROR",
}


def timed_out(channel: int, used_ms: int) -> str:
    """RabbitMQ's words when it takes a channel's deliveries back (its consumer_timeout)."""
    return (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out."
        f" Timeout value used: {used_ms} ms. This timeout value can be configured, see"
        " consumers doc guide to learn more"
    )


class Bugs(logging.Handler):
    """Keeps the relay's log records that carry a traceback: a bug, never a broker's doing."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep an error logged with an exception."""
        if record.exc_info is not None and record.exc_info[1] is not None:
            self.records.append(f"{record.getMessage()}: {record.exc_info[1]!r}")


class RouteModel(RuleBasedStateMachine):
    """The broker's events as rules, the relay's promises as invariants."""

    broker: ModelBroker
    consuming: Connection
    publishing: Connection
    context: RouteContext
    registry: CollectorRegistry

    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.loop_errors: list[str] = []
        self.loop.set_exception_handler(self._loop_error)
        self.bugs = Bugs()
        logging.getLogger("sidecar").addHandler(self.bugs)
        self.workers: list[tuple[RouteWorker, asyncio.Task[None]]] = []
        self.stopped = False
        self.reloads = 0
        self.started = False

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        del loop
        self.loop_errors.append(f"{context.get('message')}: {context.get('exception')!r}")

    # --- the route and its broker ---

    @initialize(
        single_active=st.booleans(),
        return_retries=st.sampled_from([0, 2]),
        nack_is_free=st.booleans(),
    )
    def start(self, *, single_active: bool, return_retries: int, nack_is_free: bool) -> None:
        """Start one route's worker against a fresh broker."""
        self.broker = ModelBroker(
            self.loop,
            queue=QUEUE,
            target=TARGET,
            quarantine=QUARANTINE,
            single_active=single_active,
            delivery_limit=DELIVERY_LIMIT,
            nack_is_free=nack_is_free,
        )
        self.consuming = self.broker.connect("consuming")
        self.publishing = self.broker.connect("publishing")
        route = Route(
            name="orders",
            queue=QUEUE,
            exchange=TARGET,
            routing_key=None,
            publishers=Publishers.APPS,
            origin=None,
            mode=Mode.ENFORCE,
            prefetch=PREFETCH,
            limits=RouteLimits(
                consumer_timeout_s=60.0,
                nack_max_attempts=3,
                nack_max_s=20.0,
                return_max_attempts=return_retries,
                return_delay_s=0.2,
            ),
            single_active_consumer=single_active,
            delivery_limit=DELIVERY_LIMIT,
        )
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry, version="test", contract="1.1")
        metrics.add_route(route.name)
        ids = itertools.count(1)
        self.context = RouteContext(
            route=route,
            quarantine_exchange=QUARANTINE,
            login="sidecar",
            metrics=metrics,
            clock=Clock(now_ms=lambda: 1_790_000_000_000, monotonic=self.loop.time),
            new_id=lambda: f"00000000-0000-4000-8000-{next(ids):012d}",
            rng=random.Random(1),
        )
        self.started = True
        self.loop.do(self._start_worker)

    def _start_worker(self) -> None:
        worker = RouteWorker(self.context)
        run = worker.run(self.consuming, grace_s=GRACE_S, publishing=self.publishing)
        task = self.loop.create_task(run, name=f"route:{len(self.workers)}")
        self.workers.append((worker, task))

    def _event(self, action: Callable[[], None]) -> None:
        """Carry out a broker's event in the loop, then run the loop until it is idle."""
        self.loop.do(lambda: self.broker.event(action))

    @property
    def _publishing_side(self) -> Side:
        return self.broker.sides[1]

    def _channels(self, side: Side) -> list[BrokerChannel]:
        return [channel for channel in side.channels.values() if not channel.closing]

    def _in_flight(self) -> bool:
        """Whether the route holds a delivery: what a broker's fault may catch in flight."""
        return any(channel.unacked for channel in self._channels(self.broker.sides[0]))

    def _ackable(self, *, multiple: bool) -> list[Copy]:
        broker = self.broker
        return [c for c in broker.unanswered() if broker.may_ack(c, multiple=multiple)]

    def _nackable(self, *, multiple: bool) -> list[Copy]:
        broker = self.broker
        return [c for c in broker.unanswered() if broker.may_nack(c, multiple=multiple)]

    # --- staging ---

    @precondition(lambda self: len(self.broker.messages) < MAX_MESSAGES)
    @rule(
        body=st.sampled_from([b"a", b"b"]),
        acemq_id=st.sampled_from([None, "m-1", "m-2"]),
        poison=st.sampled_from([False, False, False, True]),
        marked=st.booleans(),
        stamped=st.booleans(),
        returns=st.sampled_from([0, 0, DELIVERY_LIMIT - 1]),
    )
    def enqueue(
        self,
        *,
        body: bytes,
        acemq_id: str | None,
        poison: bool,
        marked: bool,
        stamped: bool,
        returns: int,
    ) -> None:
        """A message arrives in staging (``returns``: the broker gave it back that often).

        ``marked``: it carries a header of the model's own, which its copies keep (so the
        model tells which message a copy is of, and so does the client's match of a return).
        ``stamped``: it carries ``timestamp_in_ms``, as an interceptor stamped it into
        staging (a return may then come back with another value).
        """
        self._event(
            lambda: self.broker.enqueue(
                body,
                acemq_id,
                poison=poison,
                marked=marked,
                stamped=stamped,
                returns=returns,
            )
        )

    # --- the publishes' answers ---

    @precondition(lambda self: 0 < len(self.broker.messages) < MAX_MESSAGES)
    @rule(pick=st.integers(0, 3), stamped=st.booleans())
    def enqueue_alike(self, pick: int, *, stamped: bool) -> None:
        """A duplicate of a message before it arrives (a producer's retry, say).

        Its body, x-acemq-id and marker or none, alike: two unmarked duplicates have alike
        copies, which a return can be mistaken between; ``stamped``: an interceptor
        stamped it ``timestamp_in_ms``, whether or not it stamped the first.
        """
        messages = self.broker.messages
        twin = messages[pick % len(messages)]
        self._event(
            lambda: self.broker.enqueue(
                twin.body,
                twin.acemq_id,
                poison=twin.poison,
                marked=twin.marked,
                stamped=stamped,
                returns=0,
            )
        )

    @precondition(lambda self: self.broker.returnable())
    @rule(pick=st.integers(0, 7), stamp=st.booleans())
    def return_copy(self, pick: int, *, stamp: bool) -> None:
        """The broker returns an unroutable copy, maybe with ``timestamp_in_ms`` set on its way.

        ``stamp``: its interceptor adds the header, or overwrites the one the copy has.

        No queue was bound for it (a binding gone, a Khepri node behind): those before it
        on its channel were routed.
        """
        due = self.broker.returnable()
        copy = due[pick % len(due)]
        self._event(lambda: self.broker.send_return(copy, stamp=stamp))

    @precondition(lambda self: self.broker.unanswered())
    @rule(
        pick=st.integers(0, 7), multiple=st.booleans(), nack=st.sampled_from([False, False, True])
    )
    def confirm(self, pick: int, *, multiple: bool, nack: bool) -> None:
        """The broker confirms a copy, or nacks it (with ``multiple``: those before it too).

        An undecided copy was routed, and so were those before it on its channel; a nacked
        one is not stored after all (a queue that rejects publishes, say).
        """
        nack = nack and bool(self._nackable(multiple=False))
        allowed = self._nackable if nack else self._ackable
        candidates = allowed(multiple=multiple)
        if not candidates:
            multiple, candidates = False, allowed(multiple=False)
        copy = candidates[pick % len(candidates)]
        self._event(lambda: self.broker.confirm(copy, ack=not nack, multiple=multiple))

    def _publishing_channels(self) -> list[BrokerChannel]:
        """The open publish channels with a copy in flight (closing another changes little)."""
        return [c for c in self._channels(self._publishing_side) if c.copies]

    @precondition(lambda self: self._publishing_channels())
    @rule(pick=st.integers(0, 3), code=st.sampled_from(sorted(CLOSES)))
    def close_publish_channel(self, pick: int, code: int) -> None:
        """The broker closes a publish channel with an error."""
        channels = self._publishing_channels()
        channel = channels[pick % len(channels)]
        self._event(lambda: self.broker.close_channel(channel, code, CLOSES[code]))

    @precondition(lambda self: self._publishing_side.blocked or self._in_flight())
    @rule()
    def alarm(self) -> None:
        """A resource alarm blocks the publishing connection (``connection.blocked``), or clears."""
        side = self._publishing_side
        self._event(lambda: side.block(blocked=not side.blocked))

    # --- the consumer ---

    @precondition(lambda self: self._in_flight())
    @rule(pick=st.integers(0, 3), timeout=st.booleans())
    def take_back(self, pick: int, *, timeout: bool) -> None:
        """The broker takes the route's deliveries back.

        ``timeout``: its consumer_timeout closes a consuming channel with a 406 (the
        deliveries go back to the queue); else it cancels a consumer (``basic.cancel``, its
        queue deleted, say), whose deliveries stay on the channel.
        """
        broker = self.broker
        if not timeout and broker.consumers:
            consumer = broker.consumers[pick % len(broker.consumers)]
            self._event(lambda: broker.cancel(consumer))
            return
        channels = [c for c in self._channels(broker.sides[0]) if c.unacked]
        channel = channels[pick % len(channels)]
        oldest = min(record.at for record in channel.unacked.values())
        used_ms = max(1000, int((self.loop.time() - oldest) * 1000))
        text = timed_out(channel.number, used_ms)
        self._event(lambda: broker.close_channel(channel, 406, text))

    # --- time, and the process ---

    @precondition(lambda self: not self.broker.lag)
    @rule()
    def lag(self) -> None:
        """The network holds the broker's frames: the next two events' arrive together.

        One read then carries both (an unblock and a delivery, say), handled in one turn of
        the client's loop, before any task that the first one woke.
        """
        self.broker.lag = 2

    @rule(seconds=st.sampled_from([0.5, 2.0, 10.0, 60.0]))
    def time_passes(self, seconds: float) -> None:
        """Time passes: holds, backoffs, the publish gate's quiet spell, slow confirms."""
        self.loop.do(self.broker.flush)  # the network delivers what it held, first
        self.loop.advance(seconds)

    @precondition(lambda self: not self.stopped and len(self.broker.deliveries) > 1)
    @rule(reload=st.booleans())
    def stop(self, *, reload: bool) -> None:
        """SIGTERM: every worker drains and stops; or a reload (once), its successor starts."""
        if reload and not self.reloads:
            self.reloads += 1
            worker, _ = self.workers[-1]
            self.loop.do(lambda: worker.request_stop(replaced=True))
            self.loop.do(self._start_worker)
            return
        self.stopped = True
        for worker, _ in self.workers:
            self.loop.do(worker.request_stop)

    # --- the promises ---

    @invariant()
    def nothing_broken(self) -> None:
        """No ack without a confirmed, stored copy; no protocol error; no bug logged."""
        assert not self.broker.violations, self.broker.violations
        assert not self.loop_errors, self.loop_errors
        assert not self.bugs.records, self.bugs.records

    def teardown(self) -> None:
        """Let everything settle, stop the route, close its connections, check the end."""
        try:
            if self.started and not self.broker.violations:
                self._finish()
                self._check_end()
        finally:
            logging.getLogger("sidecar").removeHandler(self.bugs)
            self._close_loop()

    def _finish(self) -> None:
        loop, broker = self.loop, self.broker
        broker.auto = True  # from now on every publish is answered as it is read
        loop.do(broker.flush)
        loop.do(lambda: self._publishing_side.block(blocked=False))
        loop.do(broker.answer_all)
        for _ in range(60):  # holds, retries and backoffs run out
            if all(worker.state.in_flight == 0 for worker, _ in self.workers):
                break
            loop.advance(10.0)
        for worker, _ in self.workers:
            loop.do(worker.request_stop)
        for _ in range(60):
            if all(task.done() for _, task in self.workers):
                break
            loop.advance(5.0)
        for worker, task in self.workers:
            assert task.done(), f"the route did not stop; pause reason {worker.pause_reason!r}"
            task.result()
            assert worker.state.in_flight == 0
        for connection in (self.consuming, self.publishing):
            closing = loop.create_task(connection.close())
            loop.advance(10.0)
            assert closing.done()
            closing.result()

    def _check_end(self) -> None:
        broker = self.broker
        self.nothing_broken()  # one place for each failure: Hypothesis reports it once
        for message in broker.messages:
            assert message.state in {READY, ACKED, DEAD, DROPPED}, (message.number, message.state)
        acked = [d for d in broker.deliveries if d.outcome == ACKED]
        dead = [d for d in broker.deliveries if d.outcome == DEAD]
        assert all(d.outcome is not None for d in broker.deliveries)
        counted = sum(
            self._sample("acemq_sidecar_messages_total", outcome=outcome) or 0.0
            for outcome in ("relayed", "quarantined", "audited")
        )
        assert counted == len(acked), (counted, len(acked))
        dead_lettered = self._sample("acemq_sidecar_dead_lettered_total") or 0.0
        assert dead_lettered == len(dead), (dead_lettered, len(dead))
        if broker.single_active or len(self.workers) == 1:
            self._check_order()

    def _check_order(self) -> None:
        """The copies that went straight through reached the target in staging's order.

        Straight through: every copy of the message the broker read went to the target,
        was routed and confirmed (a held or quarantined one leaves the order). A message
        copied more than once (given back, redelivered) counts at its first copy.
        """
        broker = self.broker
        straight = {
            m.number
            for m in broker.messages
            if m.marked
            and (copies := broker.copies_of(m))
            and all(c.exchange == TARGET and c.confirmed for c in copies)
        }
        firsts: list[int] = []
        for copy in broker.stored_in(TARGET):
            if copy.message in straight and copy.message not in firsts:
                firsts.append(copy.message)
        assert firsts == sorted(firsts), f"the target got M{firsts}, out of staging's order"

    def _sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {"route": "orders", **labels})

    def _close_loop(self) -> None:
        loop = self.loop
        tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in tasks:
            task.cancel()
        for _ in range(20):
            if all(task.done() for task in tasks):
                break
            loop.advance(1.0)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


RouteModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A long run (``ACEMQ_MODEL_EXAMPLES``) takes longer than pytest's default timeout.
TestRouteModel = pytest.mark.timeout(max(120, EXAMPLES))(RouteModel.TestCase)


# The sequences the model found, shrunk, kept as examples that run every time: the default
# number of examples finds each only sometimes (hundreds to thousands of them).


def _run(*steps: Callable[[RouteModel], None]) -> None:
    """Run ``steps`` on a fresh model as hypothesis would: the invariant after each."""
    model = RouteModel()
    try:
        for step in steps:
            step(model)
            model.nothing_broken()
    finally:
        model.teardown()


def test_a_return_stamped_on_its_way_is_never_taken_for_an_alike_routed_copy() -> None:
    """Two alike copies, the second returned with timestamp_in_ms added on its way.

    Matched to the first (routed, unconfirmed), the second's ack would ack its message
    with no copy stored anywhere.
    """
    _run(
        lambda m: m.start(single_active=True, return_retries=0, nack_is_free=False),
        lambda m: m.enqueue(
            body=b"a", acemq_id="m-1", poison=False, marked=True, stamped=False, returns=0
        ),
        lambda m: m.enqueue_alike(pick=0, stamped=False),
        lambda m: m.return_copy(pick=1, stamp=True),
    )


def test_a_return_whose_stamp_was_overwritten_is_never_taken_for_another_copy() -> None:
    """Quarantine copies, one stamped into staging, returned with its stamp overwritten.

    Matched by "contained" alone, with the broker's stamp compared, the unstamped copy
    would be taken for it, and the stamped message acked on a returned quarantine copy.
    """
    _run(
        lambda m: m.start(single_active=True, return_retries=0, nack_is_free=False),
        lambda m: m.enqueue(
            body=b"b", acemq_id=None, poison=False, marked=True, stamped=True, returns=3
        ),
        lambda m: m.enqueue(
            body=b"b", acemq_id=None, poison=False, marked=False, stamped=False, returns=3
        ),
        lambda m: m.return_copy(pick=0, stamp=True),
    )
