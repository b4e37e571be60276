"""A model RabbitMQ under the client's real link, for the relay's stateful model test.

The sidecar's own AMQP client (``Link``, ``Connection``, ``Channel``, ``Confirms``) runs on an
in-memory transport whose other end is :class:`ModelBroker`: it reads the frames the client
writes (pamqp decodes them, independently of the client's codec) and answers as RabbitMQ
does: the channel and consumer methods at once, a message to a consumer as soon as it has
credit, and the rest only when the test says: a return, a confirm or a nack, a channel's
close, a consumer's cancel, a block, frames held up by the network (``lag``). What it says
is true to what it did: a copy it routed is stored in its queue, a return is sent only for
a copy it could not route and before that copy's confirm (and before anything it says of
a later publish on the channel), a nacked copy is not stored, a channel's unacked
deliveries go back to the queue when it ends (counted in ``x-delivery-count``, dropped
past the queue's delivery limit). An ack of a delivery is checked as it is read: the
message must have a copy stored and confirmed to the client; an ack of a tag not unacked
is a 406; what breaks a rule is kept in ``violations``.

Time is the loop's (:class:`VirtualTimeLoop`): it moves only when the test advances it,
each timer firing at its time, so a five-minute hold takes no time and every run of a
sequence of events is the same.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import Connection, install_codec
from sidecar.amqp.handshake import Control
from sidecar.amqp.link import Link
from sidecar.contract import ID
from sidecar.flow import PROBE_ROUTING_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

MARKER: Final = "model-msg"  # an application header: which staging message a copy is of
STAMP: Final = "timestamp_in_ms"  # what RabbitMQ's message interceptor adds on the way
DELIVERY_COUNT: Final = "x-delivery-count"
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_END: Final = b"\xce"
_FRAME: Final = struct.Struct(">BHI")
_HEADERS_FLAG: Final = 1 << 13  # the headers property's bit in a content header's flags


# --- the event loop on a clock the test moves ----------------------------------------------


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when told; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        """The virtual clock, in seconds."""
        return self.now

    def _next_timer(self) -> float | None:
        scheduled: list[asyncio.TimerHandle] = self.__dict__["_scheduled"]
        times = [handle.when() for handle in scheduled if not handle.cancelled()]
        return min(times) if times else None

    def busy(self) -> bool:
        """Whether a callback is ready or a timer is due now."""
        if self.__dict__["_ready"]:
            return True
        due = self._next_timer()
        return due is not None and due <= self.now

    def run_ready(self, limit: int = 5000) -> None:
        """Run what is ready (and the timers due) until nothing is, without moving the clock."""
        for _ in range(limit):
            if not self.busy():
                return
            self.call_soon(self.stop)
            self.run_forever()
        raise AssertionError(f"the event loop is still busy after {limit} turns")

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``, firing each timer at its time."""
        until = self.now + seconds
        self.run_ready()
        while (due := self._next_timer()) is not None and due <= until:
            self.now = max(self.now, due)
            self.run_ready()
        self.now = until
        self.run_ready()

    def do(self, action: Callable[[], None]) -> None:
        """Run ``action`` as a callback of the loop (as a socket's read is), then until idle."""
        self.call_soon(action)
        self.run_ready()


# --- the broker's side of one connection ----------------------------------------------------


class ModelTransport(asyncio.Transport):
    """The client link's transport: what it writes goes to the broker's side, and back."""

    def __init__(self, side: Side) -> None:
        super().__init__()
        self._side = side

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """The client writes: the broker reads it in a turn of its own."""
        self._side.received(bytes(data))

    def is_closing(self) -> bool:
        """Closing once either end closed it."""
        return self._side.closed

    def abort(self) -> None:
        """The client drops the connection."""
        self._side.lost()

    def close(self) -> None:
        """The client closes the socket (after what it wrote, which the broker has read)."""
        self._side.lost()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Nothing is buffered here."""
        del high, low

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """No socket."""
        del name
        return default

    def pause_reading(self) -> None:
        """The client reads nothing more for now (a channel's budget is full)."""
        self._side.client_reading = False

    def resume_reading(self) -> None:
        """The client reads again: what the broker sent meanwhile arrives."""
        self._side.client_reading = True
        self._side.broker.loop.call_soon(self._side.pump)


@dataclass(eq=False)
class Side:
    """The broker's end of one client connection: its socket both ways, and its channels."""

    broker: ModelBroker
    name: str
    link: Link | None = None
    inbox: bytearray = field(default_factory=bytearray)  # written by the client, unread
    outbox: bytearray = field(default_factory=bytearray)  # sent by the broker, unread
    client_reading: bool = True
    blocked: bool = False  # connection.blocked: the broker reads nothing from it
    closed: bool = False
    read_due: bool = False
    channels: dict[int, BrokerChannel] = field(default_factory=dict)

    def received(self, data: bytes) -> None:
        """Take what the client wrote; read it soon unless blocked."""
        if self.closed:
            return
        self.inbox += data
        self._read_soon()

    def _read_soon(self) -> None:
        if not self.read_due and not self.blocked and not self.closed:
            self.read_due = True
            self.broker.loop.call_soon(self.read)

    def read(self) -> None:
        """Read every whole frame the client wrote, unless the broker blocks the connection."""
        self.read_due = False
        inbox = self.inbox
        if inbox.startswith(PROTOCOL_HEADER):
            del inbox[: len(PROTOCOL_HEADER)]
        while not self.blocked and not self.closed and len(inbox) >= _FRAME.size:
            kind, channel, size = _FRAME.unpack_from(inbox)
            end = _FRAME.size + size + 1
            if len(inbox) < end:
                return
            data = bytes(inbox[:end])
            del inbox[:end]
            frame = pamqp_frame.unmarshal(data)[2]
            self.broker.on_frame(self, channel, frame, data[_FRAME.size : -1] if kind == 2 else b"")

    def send(self, data: bytes) -> None:
        """Send bytes to the client: they arrive now, or when it reads again."""
        if self.closed:
            return
        self.outbox += data
        self.pump()

    def pump(self) -> None:
        """Hand the client what was sent to it, while it reads (and the network does not lag)."""
        if self.closed or not self.client_reading or not self.outbox or self.link is None:
            return
        if self.broker.lag:
            return
        data, self.outbox = bytes(self.outbox), bytearray()
        self.link.data_received(data)

    def block(self, *, blocked: bool) -> None:
        """``connection.blocked`` (the broker then reads nothing more), or ``unblocked``."""
        if blocked == self.blocked:
            return
        self.blocked = blocked
        if blocked:
            self.send(pamqp_frame.marshal(spec.Connection.Blocked(reason="low on memory"), 0))
        else:
            self.send(pamqp_frame.marshal(spec.Connection.Unblocked(), 0))
            self._read_soon()

    def lost(self) -> None:
        """The socket closed: every channel ends, what they held goes back to the queue."""
        if self.closed:
            return
        self.closed = True
        for channel in list(self.channels.values()):
            self.broker.end_channel(channel)
        self.channels.clear()
        if self.link is not None:
            self.broker.loop.call_soon(self.link.connection_lost, None)


# --- what the broker keeps -------------------------------------------------------------------

READY: Final = "ready"
UNACKED: Final = "unacked"
ACKED: Final = "acked"
DEAD: Final = "dead-lettered"  # rejected with requeue=false
DROPPED: Final = "dropped"  # past the queue's delivery limit: the broker dead-letters it
ROUTED: Final = "routed"  # a copy's fate: stored in its exchange's queue
RETURNED: Final = "returned"  # unroutable: returned to the client
DISCARDED: Final = "discarded"  # its channel ended before the broker said either


@dataclass(eq=False)
class Message:
    """One message of the staging queue."""

    number: int  # its place in the queue, and its marker (when marked)
    body: bytes
    acemq_id: str | None
    poison: bool  # a header the contract rejects: it goes to quarantine
    marked: bool  # its copies say which message they are of (MARKER); else only ``key``
    stamped: bool = False  # an interceptor stamped it into staging: it has timestamp_in_ms
    returns: int = 0  # x-delivery-count: the returns that spent a delivery attempt
    state: str = READY
    deliveries: int = 0

    @property
    def key(self) -> tuple[bytes, str | None, bool]:
        """What tells an unmarked message's copies from another's: alike keys, alike copies."""
        return (self.body, self.acemq_id, self.poison)

    def headers(self) -> dict[str, Any]:
        """The headers it is delivered with."""
        headers: dict[str, Any] = {MARKER: f"M{self.number}"} if self.marked else {}
        if self.acemq_id is not None:
            headers["x-acemq-id"] = self.acemq_id
        if self.poison:
            headers["x-acemq-tenant"] = "acme"
        if self.stamped:
            headers[STAMP] = 1_790_000_000_000 + self.number
        if self.returns:
            headers[DELIVERY_COUNT] = self.returns
        return headers


@dataclass(eq=False)
class Copy:
    """One publish the broker read, and what became of it."""

    number: int  # in the order the broker read the publishes, on any channel
    message: int | None  # the staging message it is a copy of (its marker); None: unmarked
    key: tuple[bytes, str | None, bool]  # an unmarked copy's: Message.key
    exchange: str
    routing_key: str
    header: bytes  # its content header's payload, as written
    body: bytes
    channel: BrokerChannel
    tag: int
    probe: bool
    fate: str | None = None  # ROUTED, RETURNED or DISCARDED, once the broker says
    answer: str | None = None  # "ack", "nack", or "lost" (its channel ended first)

    @property
    def stored(self) -> bool:
        """In its exchange's queue: routed, and not nacked."""
        return self.fate == ROUTED and self.answer != "nack"

    @property
    def confirmed(self) -> bool:
        """Stored in its queue, and confirmed to the client."""
        return self.stored and self.answer == "ack"

    def __str__(self) -> str:
        of = f"M{self.message}" if self.message is not None else f"an unmarked {self.key}"
        return (
            f"copy #{self.number} of {of} to {self.exchange!r}"
            f" (ch {self.channel.number} tag {self.tag}, {self.fate or 'undecided'},"
            f" answer {self.answer})"
        )


@dataclass(eq=False)
class Consumer:
    """One ``basic.consume``."""

    channel: BrokerChannel
    tag: str
    prefetch: int

    def credit(self) -> int:
        """How many more deliveries it may take now (prefetch 0: any)."""
        if self.prefetch == 0:
            return 1
        held = sum(1 for d in self.channel.unacked.values() if d.consumer == self.tag)
        return self.prefetch - held


@dataclass(eq=False)
class DeliveryRecord:
    """One delivery of a message on a channel, and how it ended."""

    message: Message
    channel: BrokerChannel
    tag: int
    consumer: str
    at: float
    outcome: str | None = None  # ACKED, DEAD, or "requeued"


@dataclass(eq=False)
class BrokerChannel:
    """One channel as the broker sees it."""

    side: Side
    number: int
    closing: bool = False  # the broker sent channel.close, and waits for its close-ok
    prefetch: int = 0
    confirming: bool = False
    publish_seq: int = 0
    copies: dict[int, Copy] = field(default_factory=dict)  # unanswered, by tag
    sent: list[Copy] = field(default_factory=list)  # every publish on it, in order
    pending: list[Any] = field(default_factory=list)  # a publish's frames so far
    body: bytearray = field(default_factory=bytearray)
    unacked: dict[int, DeliveryRecord] = field(default_factory=dict)
    delivery_seq: int = 0

    def send(self, *frames: bytes) -> None:
        """Send frames to the client on this channel."""
        self.side.send(b"".join(frames))


def method(channel: int, frame: Any) -> bytes:
    """A method frame, encoded by pamqp."""
    return pamqp_frame.marshal(frame, channel)


def content(channel: int, frame: Any, header: bytes, body: bytes) -> bytes:
    """A method with content: the method, the content header's payload, the body."""
    data = [method(channel, frame), _FRAME.pack(2, channel, len(header)), header, FRAME_END]
    if body:
        data += [_FRAME.pack(3, channel, len(body)), body, FRAME_END]
    return b"".join(data)


_FIXED_SIZES: Final = {
    "t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "f": 4, "l": 8, "L": 8, "d": 8,
    "T": 8, "D": 5, "V": 0,
}  # fmt: skip


def _entries(table: bytes) -> list[tuple[bytes, bytes]]:
    """Split a field table's bytes into (name, type and value) pairs, as written."""
    entries, at = [], 0
    while at < len(table):
        name = table[at + 1 : at + 1 + table[at]]
        at += 1 + table[at]
        kind = chr(table[at])
        size = _FIXED_SIZES.get(kind)
        if size is None:  # S, A, F, x: a long size, then that many bytes
            size = 4 + struct.unpack_from(">I", table, at + 1)[0]
        entries.append((name, table[at : at + 1 + size]))
        at += 1 + size
    return entries


def stamped(header: bytes, value: int) -> bytes:
    """Return a content header's payload with its ``timestamp_in_ms`` header set to ``value``.

    As RabbitMQ's message interceptor sets it (added, or overwritten when there is one):
    every other byte is as it was.
    """
    flags = struct.unpack_from(">H", header, 12)[0]
    at = 14
    for bit in (15, 14):  # content_type, content_encoding: short strings before the table
        if flags & (1 << bit):
            at += 1 + header[at]
    stamp = b"l" + struct.pack(">q", value)
    if not flags & _HEADERS_FLAG:
        entries, end = [], at
        header = header[:12] + struct.pack(">H", flags | _HEADERS_FLAG) + header[14:]
    else:
        end = at + 4 + struct.unpack_from(">I", header, at)[0]
        entries = _entries(header[at + 4 : end])
    name = STAMP.encode()
    if any(n == name for n, _ in entries):
        entries = [(n, stamp if n == name else v) for n, v in entries]
    else:
        entries.append((name, stamp))
    table = b"".join(bytes([len(n)]) + n + v for n, v in entries)
    return header[:at] + struct.pack(">I", len(table)) + table + header[end:]


@dataclass(eq=False)
class ModelBroker:
    """One staging queue, and a target and a quarantine exchange that route to a queue, or not.

    A copy's fate (routed and stored, or returned) is decided when the broker first says
    something of it or of a later publish on its channel: the return is sent then, or the
    copy is stored. That is all a client can tell of the bindings' comings and goings:
    RabbitMQ routes a channel's publishes in order, returns an unroutable one at once, and
    confirms each after routing it (a routed one when its queue has it, in any order).

    ``delivery_limit``: the staging queue's x-delivery-limit (0: none). ``nack_is_free``: a
    requeueing ``basic.nack`` spends no delivery attempt (RabbitMQ 4.3).
    """

    loop: VirtualTimeLoop
    queue: str
    target: str
    quarantine: str
    routing_key: str = "order.placed"
    single_active: bool = False
    delivery_limit: int = 0
    nack_is_free: bool = False
    messages: list[Message] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)  # every publish read, in order
    deliveries: list[DeliveryRecord] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)  # in the order they came
    sides: list[Side] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    auto: bool = False  # route and confirm every publish as it is read
    generated_prefix: str = "00000000-0000-4000-8000-"  # of the ids the relay makes
    dispatch_due: bool = False
    # The network holds what the broker sends until this many more events have happened:
    # their frames then arrive together, in one turn of the client's loop.
    lag: int = 0
    next_consumer: int = -1  # round robin, among the consumers with credit

    def __post_init__(self) -> None:
        install_codec()

    def stored_in(self, exchange: str) -> list[Copy]:
        """The copies in the queue bound to ``exchange``, in the order the broker routed them."""
        return [c for c in self.copies if c.exchange == exchange and c.stored]

    # --- connections ---

    def connect(self, name: str) -> Connection:
        """A client connection to the broker: the real link and connection, no handshake."""
        side = Side(self, name)
        link = Link(self.loop, match_header=ID)
        link.control = control = Control(link)
        link.nack_is_free = self.nack_is_free
        side.link = link
        link.connection_made(ModelTransport(side))
        self.sides.append(side)
        return Connection(link, control)

    # --- the staging queue ---

    def enqueue(
        self,
        body: bytes,
        acemq_id: str | None,
        *,
        poison: bool,
        marked: bool,
        stamped: bool,
        returns: int,
    ) -> None:
        """A message arrives in staging (``returns``: given back that often before, elsewhere)."""
        number = len(self.messages) + 1
        message = Message(number, body, acemq_id, poison, marked, stamped, returns=returns)
        message.deliveries = 1 if returns else 0  # redelivered: the count is the broker's
        self.messages.append(message)
        self.dispatch_soon()

    def is_generated(self, acemq_id: str) -> bool:
        """Whether an x-acemq-id is one the relay made (the test's ``new_id``), not a producer's."""
        return acemq_id.startswith(self.generated_prefix)

    def ready(self) -> list[Message]:
        """The messages ready in staging, in the queue's order."""
        return [m for m in self.messages if m.state == READY]

    def eligible(self) -> list[Consumer]:
        """The consumers the queue may deliver to now (single active: the first one only)."""
        live = [c for c in self.consumers if not c.channel.closing and not c.channel.side.closed]
        if self.single_active:
            live = live[:1]
        return [c for c in live if c.credit() > 0]

    def dispatch_soon(self) -> None:
        """Deliver what is ready to the consumers with credit, in a turn of the loop's own.

        As RabbitMQ pushes a message as soon as a consumer has credit for it: when it
        arrives, when a consumer starts, when an ack or a reject makes room.
        """
        if not self.dispatch_due:
            self.dispatch_due = True
            self.loop.call_soon(self._dispatch)

    def event(self, action: Callable[[], None]) -> None:
        """Carry out one of the broker's events, with the deliveries it lets go at once.

        Under ``lag`` what it sends waits; the last lagging event sends it all together.
        """
        action()
        if self.dispatch_due:
            self._dispatch()
        if self.lag:
            self.lag -= 1
            if not self.lag:
                self.flush()

    def flush(self) -> None:
        """The network delivers what it held, every connection's, in one turn."""
        self.lag = 0
        for side in self.sides:
            side.pump()

    def _dispatch(self) -> None:
        if not self.dispatch_due:
            return
        self.dispatch_due = False
        while self.ready() and (consumers := self.eligible()):
            self.next_consumer = (self.next_consumer + 1) % len(consumers)
            self.dispatch(consumers[self.next_consumer])

    def dispatch(self, consumer: Consumer) -> None:
        """Deliver the queue's next ready message to ``consumer``."""
        message = self.ready()[0]
        channel = consumer.channel
        channel.delivery_seq += 1
        tag = channel.delivery_seq
        record = DeliveryRecord(message, channel, tag, consumer.tag, at=self.loop.time())
        channel.unacked[tag] = record
        self.deliveries.append(record)
        deliver = spec.Basic.Deliver(
            consumer_tag=consumer.tag,
            delivery_tag=tag,
            redelivered=message.deliveries > 0,
            exchange="",
            routing_key=self.routing_key,
        )
        message.deliveries += 1
        message.state = UNACKED
        properties = spec.Basic.Properties(headers=message.headers(), delivery_mode=2)
        header = pamqp_frame.marshal(
            pamqp_header.ContentHeader(0, len(message.body), properties), channel.number
        )[_FRAME.size : -1]
        channel.send(content(channel.number, deliver, header, message.body))

    def _requeue(self, record: DeliveryRecord, *, counted: bool) -> None:
        record.outcome = "requeued"
        message = record.message
        if counted:
            message.returns += 1
        limit = self.delivery_limit
        message.state = DROPPED if limit and message.returns > limit else READY
        self.dispatch_soon()

    # --- a publish's answers ---

    def unanswered(self) -> list[Copy]:
        """The copies not yet confirmed, nacked or lost, on the open channels."""
        return [
            copy
            for side in self.sides
            for channel in side.channels.values()
            if not channel.closing
            for copy in channel.copies.values()
        ]

    def returnable(self) -> list[Copy]:
        """The copies that may still be returned: undecided, and nothing said of a later one.

        RabbitMQ routes a channel's publishes in order and returns an unroutable one as it
        routes it: before it says anything of a later publish on the channel.
        """
        return [
            copy
            for copy in self.unanswered()
            if copy.fate is None
            and not any(later.fate is not None for later in copy.channel.sent[copy.tag :])
        ]

    def may_ack(self, copy: Copy, *, multiple: bool) -> bool:
        """Whether ``copy`` may be confirmed now (with ``multiple``: some before it too)."""
        return not multiple or any(t < copy.tag for t in copy.channel.copies)

    def may_nack(self, copy: Copy, *, multiple: bool) -> bool:
        """Whether ``copy`` may be nacked now (not returned; with ``multiple``, all before it)."""
        if multiple:
            earlier = [c for t, c in copy.channel.copies.items() if t <= copy.tag]
            return len(earlier) > 1 and all(c.fate != RETURNED for c in earlier)
        return copy.fate != RETURNED

    def _route_before(self, copy: Copy) -> None:
        """The undecided publishes before ``copy`` on its channel were routed: stored."""
        for earlier in copy.channel.sent[: copy.tag - 1]:
            if earlier.fate is None:
                earlier.fate = ROUTED

    def send_return(self, copy: Copy, *, stamp: bool) -> None:
        """Return an unroutable copy (``stamp``: with a header the broker added on its way)."""
        self._route_before(copy)
        copy.fate = RETURNED
        header = stamped(copy.header, int(self.loop.time() * 1000)) if stamp else copy.header
        returned = spec.Basic.Return(
            reply_code=312,
            reply_text="NO_ROUTE",
            exchange=copy.exchange,
            routing_key=copy.routing_key,
        )
        copy.channel.send(content(copy.channel.number, returned, header, copy.body))

    def confirm(self, copy: Copy, *, ack: bool, multiple: bool) -> None:
        """Send ``basic.ack`` (or ``basic.nack``) for the copy's tag, ``multiple`` or not."""
        channel = copy.channel
        self._route_before(copy)
        if copy.fate is None:
            copy.fate = ROUTED
        tags = [t for t in channel.copies if t <= copy.tag] if multiple else [copy.tag]
        for tag in tags:
            channel.copies.pop(tag).answer = "ack" if ack else "nack"
        if ack:
            frame: Any = spec.Basic.Ack(delivery_tag=copy.tag, multiple=multiple)
        else:
            frame = spec.Basic.Nack(delivery_tag=copy.tag, multiple=multiple, requeue=False)
        channel.send(method(channel.number, frame))

    def answer_all(self) -> None:
        """Confirm every copy in flight (an undecided one is routed)."""
        for copy in self.unanswered():
            self.confirm(copy, ack=True, multiple=False)

    def close_channel(self, channel: BrokerChannel, code: int, text: str) -> None:
        """The broker closes a channel (``channel.close``); it waits for the close-ok."""
        self.end_channel(channel)
        channel.closing = True
        close = spec.Channel.Close(reply_code=code, reply_text=text, class_id=60, method_id=40)
        channel.send(method(channel.number, close))

    def end_channel(self, channel: BrokerChannel) -> None:
        """A channel ends: its deliveries go back to the queue, its publishes get no answer."""
        for record in list(channel.unacked.values()):
            self._requeue(record, counted=True)
        channel.unacked.clear()
        self.consumers = [c for c in self.consumers if c.channel is not channel]
        for copy in channel.copies.values():
            copy.answer = "lost"
            if copy.fate is None:
                copy.fate = DISCARDED
        channel.copies.clear()

    def cancel(self, consumer: Consumer) -> None:
        """The broker cancels a consumer (its queue deleted, say): ``basic.cancel``."""
        self.consumers.remove(consumer)
        cancel = spec.Basic.Cancel(consumer_tag=consumer.tag, nowait=True)
        consumer.channel.send(method(consumer.channel.number, cancel))

    # --- what the client sends ---

    def on_frame(self, side: Side, number: int, frame: Any, raw: bytes) -> None:
        """Handle one frame the client wrote."""
        if number == 0:
            self._on_connection(side, frame)
            return
        if isinstance(frame, spec.Channel.Open):
            if number in side.channels:
                self.violations.append(f"{side.name}: channel {number} opened twice")
            side.channels[number] = BrokerChannel(side, number)
            side.send(method(number, spec.Channel.OpenOk()))
            return
        channel = side.channels.get(number)
        if channel is None:
            self.violations.append(f"{side.name}: {frame!r} on channel {number}, not open")
            return
        if channel.closing:  # the broker closed it: only its close-ok ends it
            if isinstance(frame, spec.Channel.CloseOk):
                del side.channels[number]
            elif isinstance(frame, spec.Channel.Close):  # both closed at once: each answers
                channel.send(method(number, spec.Channel.CloseOk()))
            return
        handler = self._handlers.get(type(frame))
        if handler is None:
            self.violations.append(f"{side.name}: unexpected frame {frame!r}")
            return
        handler(self, channel, frame, raw)
        if isinstance(frame, spec.Basic.Consume | spec.Basic.Ack | spec.Basic.Reject):
            self.dispatch_soon()

    def _on_connection(self, side: Side, frame: Any) -> None:
        if isinstance(frame, spec.Connection.Close):
            for channel in list(side.channels.values()):
                self.end_channel(channel)
            side.channels.clear()
            side.send(method(0, spec.Connection.CloseOk()))

    def _on_select(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del frame, raw
        channel.confirming = True
        channel.send(method(channel.number, spec.Confirm.SelectOk()))

    def _on_qos(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        channel.prefetch = frame.prefetch_count
        channel.send(method(channel.number, spec.Basic.QosOk()))

    def _on_consume(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        if any(c.tag == frame.consumer_tag and c.channel is channel for c in self.consumers):
            self.violations.append(f"consumer tag {frame.consumer_tag} reused on a channel")
        self.consumers.append(Consumer(channel, frame.consumer_tag, channel.prefetch))
        channel.send(method(channel.number, spec.Basic.ConsumeOk(consumer_tag=frame.consumer_tag)))

    def _on_cancel(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        self.consumers = [
            c for c in self.consumers if not (c.channel is channel and c.tag == frame.consumer_tag)
        ]
        if not frame.nowait:
            cancel_ok = spec.Basic.CancelOk(consumer_tag=frame.consumer_tag)
            channel.send(method(channel.number, cancel_ok))

    def _on_queue_declare(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        consumers = sum(1 for c in self.consumers if not c.channel.closing)
        ok = spec.Queue.DeclareOk(frame.queue, len(self.ready()), consumers)
        channel.send(method(channel.number, ok))

    def _on_exchange_declare(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del frame, raw
        channel.send(method(channel.number, spec.Exchange.DeclareOk()))

    def _on_close(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del frame, raw
        self.end_channel(channel)
        del channel.side.channels[channel.number]
        channel.send(method(channel.number, spec.Channel.CloseOk()))

    def _on_publish(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        channel.pending = [frame]
        channel.body = bytearray()

    def _on_header(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        channel.pending += [frame, raw]
        if frame.body_size == 0:
            self._published(channel)

    def _on_body(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        channel.body += frame.value
        if len(channel.body) >= channel.pending[1].body_size:
            self._published(channel)

    def _published(self, channel: BrokerChannel) -> None:
        """A whole publish was read: route it (store it, or owe its return), answer if auto."""
        publish, header, raw = channel.pending
        channel.pending = []
        if not channel.confirming:
            self.violations.append(f"a publish on channel {channel.number}, not in confirm mode")
            return
        channel.publish_seq += 1
        headers = header.properties.headers or {}
        marker = headers.get(MARKER)
        acemq_id = headers.get("x-acemq-id")
        if isinstance(acemq_id, bytes):
            acemq_id = acemq_id.decode()
        if acemq_id is not None and self.is_generated(str(acemq_id)):
            acemq_id = None
        key = (bytes(channel.body), acemq_id, "x-acemq-tenant" in headers)
        copy = Copy(
            number=len(self.copies) + 1,
            message=int(str(marker)[1:]) if marker is not None else None,
            key=key,
            exchange=publish.exchange,
            routing_key=publish.routing_key,
            header=raw,
            body=bytes(channel.body),
            channel=channel,
            tag=channel.publish_seq,
            probe=publish.exchange == "" and publish.routing_key == PROBE_ROUTING_KEY,
        )
        self.copies.append(copy)
        channel.copies[copy.tag] = copy
        channel.sent.append(copy)
        if copy.probe:  # to a queue that is never there: returned, then confirmed
            self.send_return(copy, stamp=False)
            self.confirm(copy, ack=True, multiple=False)
        elif self.auto:
            self.confirm(copy, ack=True, multiple=False)

    def _on_ack(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        for record in self._settled(channel, frame.delivery_tag, multiple=frame.multiple):
            self._check_ack(record)
            record.outcome = ACKED
            record.message.state = ACKED

    def _on_nack(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        for record in self._settled(channel, frame.delivery_tag, multiple=frame.multiple):
            self._reject(record, requeue=frame.requeue, counted=not self.nack_is_free)

    def _on_reject(self, channel: BrokerChannel, frame: Any, raw: bytes) -> None:
        del raw
        for record in self._settled(channel, frame.delivery_tag, multiple=False):
            self._reject(record, requeue=frame.requeue, counted=True)

    def _reject(self, record: DeliveryRecord, *, requeue: bool, counted: bool) -> None:
        if requeue:
            self._requeue(record, counted=counted)
        else:
            record.outcome = DEAD
            record.message.state = DEAD

    def _settled(self, channel: BrokerChannel, tag: int, *, multiple: bool) -> list[DeliveryRecord]:
        """Take the deliveries an ack, nack or reject settles; an unknown tag is a 406."""
        unacked = channel.unacked
        if multiple:
            tags = [t for t in unacked if tag == 0 or t <= tag]
        elif tag in unacked:
            tags = [tag]
        else:
            self.violations.append(
                f"{channel.side.name}: delivery tag {tag} settled on channel {channel.number}"
                " but not unacked there (settled twice?)"
            )
            self.close_channel(channel, 406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
            return []
        return [unacked.pop(t) for t in tags]

    def copies_of(self, message: Message) -> list[Copy]:
        """The copies of a message; of an unmarked one, every unmarked copy alike."""
        if message.marked:
            return [c for c in self.copies if c.message == message.number]
        return [c for c in self.copies if c.message is None and c.key == message.key]

    def _check_ack(self, record: DeliveryRecord) -> None:
        """An acked delivery's message must have a copy stored and confirmed to the client.

        Unmarked messages alike share their copies: as many must be confirmed as there
        are such messages acked, this one included.
        """
        message = record.message
        copies = self.copies_of(message)
        confirmed = sum(1 for c in copies if c.confirmed)
        needed = 1
        if not message.marked:
            alike = {
                m.number
                for m in self.messages
                if not m.marked and m.key == message.key and m.state == ACKED
            }
            needed = len(alike | {message.number})
        if confirmed < needed:
            seen = "; ".join(str(c) for c in copies) or "none"
            self.violations.append(
                f"M{message.number} acked (delivery tag {record.tag}) with {confirmed} confirmed"
                f" copies stored for {needed} such messages acked; its copies: {seen}"
            )

    _handlers: ClassVar[dict[type, Callable[[ModelBroker, BrokerChannel, Any, bytes], None]]] = {
        spec.Confirm.Select: _on_select,
        spec.Basic.Qos: _on_qos,
        spec.Basic.Consume: _on_consume,
        spec.Basic.Cancel: _on_cancel,
        spec.Queue.Declare: _on_queue_declare,
        spec.Exchange.Declare: _on_exchange_declare,
        spec.Channel.Close: _on_close,
        spec.Basic.Publish: _on_publish,
        pamqp_header.ContentHeader: _on_header,
        pamqp_body.ContentBody: _on_body,
        spec.Basic.Ack: _on_ack,
        spec.Basic.Nack: _on_nack,
        spec.Basic.Reject: _on_reject,
    }


__all__ = [
    "ACKED",
    "DEAD",
    "DROPPED",
    "MARKER",
    "READY",
    "RETURNED",
    "ROUTED",
    "UNACKED",
    "BrokerChannel",
    "Consumer",
    "Copy",
    "DeliveryRecord",
    "Message",
    "ModelBroker",
    "Side",
    "VirtualTimeLoop",
]
