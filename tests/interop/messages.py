"""The interop message set: what the five AceMQ libraries write, and every AMQP field type.

Each message is published to the staging queue with the tests' own client (tests/support.py,
the project's codec installed), so every value goes out with exactly the wire tag its class
names (sidecar.wire): ``UInt16(40000)`` is a ``u``, ``Float32(1.5)`` an ``f``, plain
``bytes`` a long string that is not UTF-8, ``ByteArray`` an ``x``.

The drift rows follow the table of docs/contract.md section 8 (one message per row, named after
the library that writes the shape); the rest cover application headers: every scalar type,
nested tables and arrays, RabbitMQ's ``x-death``, and the unsigned tags of section 7 at the
top level and inside tables and arrays. A message marked ``raw`` is also put straight into
each client's queue, without the sidecar, to show what the clients make of it unrepaired.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from sidecar.wire import (
    ByteArray,
    FieldArray,
    FieldTable,
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
)

FIRST_SEEN_MS: Final = 1_767_323_045_678  # 2026-01-02T03:04:05.678Z
SENT_AT: Final = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
LONG_ID: Final = "ord-" + "x" * 296  # 300 bytes: too long for the message_id short string
LONG_REPLY: Final = "replies." + "r" * 292

CONTRACT_HEADERS: Final = frozenset(
    {
        "x-acemq-id",
        "x-acemq-type",
        "x-acemq-version",
        "x-acemq-correlation",
        "x-acemq-attempt",
        "x-acemq-first-seen",
        "x-acemq-causation",
        "x-acemq-origin",
        "x-acemq-error",
        "x-acemq-claim",
        "x-acemq-route",
        "x-acemq-route-position",
        "x-acemq-route-id",
        "acemq-replayed-from",
        "acemq-replayed-at",
        "acemq-replay-count",
        "acemq-reply-to",
    }
)
"""docs/contract.md section 2: the headers the sidecar writes."""


def is_application_header(name: str) -> bool:
    """Whether a header is the application's (section 7), not the contract's or reserved."""
    return name not in CONTRACT_HEADERS and not name.startswith("x-acemq-")


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the set; its body is its name, and so is its routing key by default."""

    name: str
    shape: str
    headers: FieldTable
    properties: Mapping[str, Any] = field(default_factory=dict)
    routing_key: str | None = None
    raw: bool = False

    @property
    def key(self) -> str:
        """The routing key it is published with (and the binding key of its queues)."""
        return self.name if self.routing_key is None else self.routing_key

    def application_headers(self) -> FieldTable:
        """The application headers as sent, without top-level voids (section 5 removes them)."""
        return {
            name: value
            for name, value in self.headers.items()
            if is_application_header(name) and value is not None
        }


def _canonical_envelope(id_: str) -> FieldTable:
    return {
        "x-acemq-id": id_,
        "x-acemq-type": "order.placed",
        "x-acemq-version": Int32(2),
        "x-acemq-correlation": f"corr-{id_}",
        "x-acemq-attempt": Int32(1),
        "x-acemq-first-seen": Int64(FIRST_SEEN_MS),
    }


_X_DEATH_ENTRIES: Final[list[FieldTable]] = [
    {
        "count": Int64(3),
        "reason": "rejected",
        "queue": "orders.work",
        "time": Timestamp(1_767_323_000),
        "exchange": "orders",
        "routing-keys": ["order.placed"],
    },
    {
        "count": Int64(1),
        "reason": "expired",
        "queue": "orders.delay",
        "time": Timestamp(1_767_322_000),
        "exchange": "",
        "routing-keys": ["orders.delay", "order.placed"],
        "original-expiration": "60000",
    },
]
X_DEATH: Final[FieldArray] = list(_X_DEATH_ENTRIES)
"""RabbitMQ's dead-letter history, as the broker writes it (an array of tables)."""

DRIFT: Final = (
    Message(
        "java-canonical",
        "Java: the canonical envelope, every contract header, a route",
        {
            **_canonical_envelope("ord-1"),
            "x-acemq-causation": "cause-1",
            "x-acemq-origin": "checkout@app-7",
            "x-acemq-claim": "claim-1",
            "x-acemq-error": "none",
            "x-acemq-route": "validate,charge,ship",
            "x-acemq-route-position": Int32(1),
            "x-acemq-route-id": "0b7c2b8e-3b4f-4e0a-9a57-1f2f3a4b5c6d",
            "x-app-tenant": "acme",
        },
        {"message_id": "ord-1"},
    ),
    Message(
        "id-from-message-id",
        "Python and Ruby: no x-acemq-id, the id only in message_id",
        {"x-acemq-type": "order.paid", "x-app-tenant": "acme"},
        {"message_id": "ord-2"},
    ),
    Message(
        "first-seen-zero",
        "Go and .NET: a missing first-seen written back as 0",
        {**_canonical_envelope("ord-3"), "x-acemq-first-seen": Int64(0)},
        {"message_id": "ord-3"},
    ),
    Message(
        "first-seen-rfc3339",
        "first-seen as RFC 3339 text",
        {**_canonical_envelope("ord-4"), "x-acemq-first-seen": "2026-01-02T03:04:05.678Z"},
    ),
    Message(
        "dotnet-empty-strings",
        ".NET: empty causation, origin, claim and id kept and re-written",
        {
            **_canonical_envelope(""),
            "x-acemq-causation": "",
            "x-acemq-origin": "",
            "x-acemq-claim": "",
        },
        {"message_id": "ord-5"},
    ),
    Message(
        "go-negative-numbers",
        "Go: negative version and attempt kept",
        {
            **_canonical_envelope("ord-6"),
            "x-acemq-version": Int32(-3),
            "x-acemq-attempt": Int32(-1),
        },
    ),
    Message(
        "dotnet-zero-numbers",
        ".NET: version and attempt 0",
        {**_canonical_envelope("ord-7"), "x-acemq-version": Int32(0), "x-acemq-attempt": Int32(0)},
    ),
    Message(
        "dotnet-junk-numbers",
        ".NET throws on junk numbers",
        {**_canonical_envelope("ord-8"), "x-acemq-version": "v2", "x-acemq-attempt": "abc"},
    ),
    Message(
        "float-numbers",
        "Python and Ruby reset a float first-seen to now",
        {
            **_canonical_envelope("ord-9"),
            "x-acemq-first-seen": 1_767_323_045_678.9,
            "x-acemq-attempt": 2.7,
        },
    ),
    Message(
        "go-numeric-text",
        "Go refuses numeric text with spaces",
        {**_canonical_envelope("ord-10"), "x-acemq-attempt": " 4 ", "x-acemq-version": "\t2\n"},
    ),
    Message(
        "empty-routing-key",
        "only Java names the type 'message' for an empty routing key",
        {"x-acemq-id": "ord-11"},
        routing_key="",
    ),
    Message(
        "route-id-missing",
        "Go and Python omit the route-id",
        {**_canonical_envelope("ord-12"), "x-acemq-route": " validate, charge ,,ship "},
    ),
    Message(
        "dotnet-route-id-hex",
        ".NET writes the route-id as 32 hex digits",
        {
            **_canonical_envelope("ord-13"),
            "x-acemq-route": "validate,charge",
            "x-acemq-route-position": Int32(0),
            "x-acemq-route-id": "0b7c2b8e3b4f4e0a9a571f2f3a4b5c6d",
        },
    ),
    Message(
        "legacy-replay",
        "Java <= 0.4 and .NET <= 0.5.0: x-acemq-replayed-* spellings",
        {
            **_canonical_envelope("ord-14"),
            "x-acemq-replayed-from": "orders.dlq",
            "x-acemq-replayed-at": "2026-02-03T04:05:06.789Z",
            "x-acemq-replay-count": Int32(2),
        },
    ),
    Message(
        "replayed-at-epoch-ms",
        "one replayed-at format of five: epoch milliseconds",
        {**_canonical_envelope("ord-15"), "acemq-replayed-at": Int64(1_770_091_506_789)},
    ),
    Message(
        "replayed-at-timestamp",
        "one replayed-at format of five: an AMQP timestamp",
        {**_canonical_envelope("ord-16"), "acemq-replayed-at": Timestamp(1_770_091_506)},
    ),
    Message(
        "replayed-at-offset",
        "one replayed-at format of five: RFC 3339 with an offset and microseconds",
        {
            **_canonical_envelope("ord-17"),
            "acemq-replayed-at": "2026-02-03T05:05:06.789123+01:00",
            "acemq-replay-count": Int32(1),
        },
    ),
    Message(
        "replayed-at-bytes",
        "one replayed-at format of five: a byte array",
        {**_canonical_envelope("ord-18"), "acemq-replayed-at": ByteArray(b"2026-02-03T04:05:06Z")},
    ),
    Message(
        "reply-to-property-only",
        "Java and .NET before 0.5.0: the reply address only in reply_to",
        _canonical_envelope("ord-19"),
        {"reply_to": "replies.checkout"},
    ),
    Message(
        "reply-to-header-only",
        "Go, Python and Ruby before 0.5.0: the reply address only in acemq-reply-to",
        {**_canonical_envelope("ord-20"), "acemq-reply-to": "replies.checkout"},
    ),
    Message(
        "unknown-reserved",
        "a newer library's x-acemq-zone, lost at older consumers",
        {**_canonical_envelope("ord-21"), "x-acemq-zone": "eu-1"},
    ),
    Message(
        "long-id",
        "an id and a reply address over 255 bytes: carried by their headers alone",
        {**_canonical_envelope(LONG_ID), "acemq-reply-to": LONG_REPLY},
    ),
    Message(
        "every-property",
        "every AMQP property set; user_id is the sidecar's own login",
        _canonical_envelope("ord-23"),
        {
            "message_id": "ord-23",
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "priority": 5,
            "correlation_id": "corr-prop",
            "reply_to": "replies.checkout",
            "expiration": "3600000",
            "timestamp": SENT_AT,
            "message_type": "order.placed",
            "user_id": "guest",
            "app_id": "checkout",
            "cluster_id": "cluster-a",
        },
    ),
)

APPLICATION: Final = (
    Message(
        "every-scalar-type",
        "every AMQP scalar type as an application header",
        {
            **_canonical_envelope("app-1"),
            "x-app-text": "naïve ✓ text",
            "x-app-empty-text": "",
            "x-app-latin1": b"caf\xe9 \xff",
            "x-app-bytes": ByteArray(b"\x00\x01\xfe\xff"),
            "x-app-true": True,
            "x-app-false": False,
            "x-app-int8": Int8(-5),
            "x-app-int8-max": Int8(127),
            "x-app-int16": Int16(-300),
            "x-app-int32": Int32(-7),
            "x-app-int32-min": Int32(-(2**31)),
            "x-app-int64": Int64(-(2**40)),
            "x-app-int64-max": Int64(2**63 - 1),
            "x-app-float32": Float32(1.5),
            "x-app-float32-fraction": Float32(-0.1),
            "x-app-float64": 0.1,
            "x-app-float64-huge": -1e300,
            "x-app-float64-negative-zero": -0.0,
            "x-app-decimal": Decimal("1.50"),
            "x-app-decimal-negative": Decimal("-3.14"),
            "x-app-decimal-integer": Decimal(42),
            "x-app-timestamp": Timestamp(1_767_323_045),
            "x-app-timestamp-2128": Timestamp(5_000_000_000),
            "x-app-void": None,
        },
    ),
    Message(
        "nested",
        "nested tables and arrays, voids inside, empty containers",
        {
            **_canonical_envelope("app-2"),
            "x-app-table": {
                "name": "outer",
                "inner": {"depth": Int32(2), "deepest": {"leaf": ByteArray(b"\x01"), "k": None}},
                "list": [Int32(1), "two", [Float32(3.5), {"four": Int64(4)}]],
                "empty-table": {},
                "empty-array": [],
            },
            "x-app-array": [
                {"a": Int16(1)},
                [True, None, Decimal("0.5")],
                Timestamp(1_767_323_045),
                "tail",
            ],
            "x-app-short-tail": [Int32(7), True],
            "x-app-one-bool": [True],
            "x-app-table-void-tail": {"k": Int32(1), "z": None},
        },
    ),
    Message(
        "x-death",
        "RabbitMQ's x-death history on a dead-lettered message",
        {**_canonical_envelope("app-3"), "x-death": X_DEATH, "x-first-death-reason": "rejected"},
    ),
)

UNSIGNED: Final = (
    Message(
        "unsigned-B",
        ".NET byte: B",
        {**_canonical_envelope("uns-1"), "x-app-small": UInt8(200)},
        raw=True,
    ),
    Message(
        "unsigned-u",
        "pamqp for 32768-65535, .NET ushort: u",
        {**_canonical_envelope("uns-2"), "x-app-port": UInt16(40_000)},
        raw=True,
    ),
    Message(
        "unsigned-i",
        "pamqp for 2^31-2^32-1, .NET uint: i",
        {**_canonical_envelope("uns-3"), "x-app-size": UInt32(3_000_000_000)},
        raw=True,
    ),
    Message(
        "unsigned-bounds",
        "the three unsigned tags at both ends of their range",
        {
            **_canonical_envelope("uns-4"),
            "x-app-u8": [UInt8(0), UInt8(255)],
            "x-app-u16": [UInt16(0), UInt16(32_768), UInt16(65_535)],
            "x-app-u32": [UInt32(0), UInt32(2**31), UInt32(2**32 - 1)],
        },
        raw=True,
    ),
    Message(
        "unsigned-nested",
        "unsigned tags deep inside tables and arrays, and in an x-death entry",
        {
            **_canonical_envelope("uns-5"),
            "x-app-limits": {"port": UInt16(50_000), "deep": {"size": UInt32(4_000_000_000)}},
            "x-app-list": [UInt8(7), [UInt16(60_000), {"n": UInt32(2**31 + 1)}]],
            "x-death": [{**_X_DEATH_ENTRIES[0], "count": UInt32(3_000_000_000)}],
        },
        raw=True,
    ),
    Message(
        "unsigned-trailing",
        "each unsigned tag as the last element of an array and of a nested array",
        {
            **_canonical_envelope("uns-7"),
            "x-app-u8-last": [Int32(7), UInt8(255)],
            "x-app-u16-last": [Int32(7), UInt16(65_535)],
            "x-app-u32-last": [Int32(7), UInt32(2**32 - 1)],
            "x-app-u8-alone": [UInt8(9)],
            "x-app-u8-nested-last": [Int32(1), [Int32(7), UInt8(0)]],
            "x-app-u16-nested-last": ["a", [Int32(7), UInt16(40_000)]],
            "x-app-table-u8-last": {"k": Int32(1), "z": UInt8(200)},
        },
        raw=True,
    ),
    Message(
        "short-trailing",
        "a boolean, a b and an s as the last element of an array and of a nested array",
        {
            **_canonical_envelope("uns-8"),
            "x-app-bool-last": [Int32(7), True],
            "x-app-int8-last": [Int32(7), Int8(-1)],
            "x-app-int16-last": [Int32(7), Int16(300)],
            "x-app-bool-nested-last": [Int32(1), [Int32(7), False]],
            "x-app-int8-nested-last": [Int32(1), [Int32(7), Int8(5)]],
            "x-app-int16-nested-last": [Int32(1), [Int32(7), Int16(-2)]],
        },
        raw=True,
    ),
    Message(
        "plain",
        "no unsigned tag: the control for the raw run",
        {**_canonical_envelope("uns-6"), "x-app-small": Int16(200), "x-app-port": Int32(40_000)},
        raw=True,
    ),
)

MESSAGES: Final = DRIFT + APPLICATION + UNSIGNED
RAW: Final = tuple(message for message in MESSAGES if message.raw)

assert len({m.name for m in MESSAGES}) == len(MESSAGES), "message names must be unique"
assert len({m.key for m in MESSAGES}) == len(MESSAGES), "routing keys must be unique"
