"""The names of the envelope contract (docs/contract.md section 2): headers, labels, bounds.

This module owns every header and property name the contract reads or writes, the legacy
spellings (section 5), the metric labels that stand for names (section 6) and the numeric
bounds the rules use. It holds constants only: no rule, no reading of a value.
"""

from __future__ import annotations

from sidecar.wire import INT_BOUNDS, Int32, Int64

__all__ = [
    "APP_LABEL",
    "ATTEMPT",
    "CAUSATION",
    "CLAIM",
    "CONTRACT_HEADERS",
    "CONTRACT_VERSION",
    "CORRELATION",
    "DEFAULT_TYPE",
    "ERROR",
    "FIRST_SEEN",
    "ID",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "LEGACY_NAMES",
    "LEGACY_REPLAY_COUNT",
    "ORIGIN",
    "ORIGINAL_USER_ID",
    "REPLAYED_AT",
    "REPLAYED_FROM",
    "REPLAY_COUNT",
    "REPLY_TO",
    "RESERVED_PREFIX",
    "ROUTE",
    "ROUTE_ID",
    "ROUTE_POSITION",
    "SHORT_STRING_MAX",
    "TYPE",
    "UNKNOWN_RESERVED_LABEL",
    "VERSION",
    "WHITESPACE",
]

CONTRACT_VERSION = "1.2"

RESERVED_PREFIX = "x-acemq-"
ID = "x-acemq-id"
TYPE = "x-acemq-type"
VERSION = "x-acemq-version"
CORRELATION = "x-acemq-correlation"
ATTEMPT = "x-acemq-attempt"
FIRST_SEEN = "x-acemq-first-seen"
CAUSATION = "x-acemq-causation"
ORIGIN = "x-acemq-origin"
ERROR = "x-acemq-error"
CLAIM = "x-acemq-claim"
ROUTE = "x-acemq-route"
ROUTE_POSITION = "x-acemq-route-position"
ROUTE_ID = "x-acemq-route-id"
REPLAYED_FROM = "acemq-replayed-from"
REPLAYED_AT = "acemq-replayed-at"
REPLAY_COUNT = "acemq-replay-count"
REPLY_TO = "acemq-reply-to"
ORIGINAL_USER_ID = "acemq-original-user-id"
LEGACY_REPLAY_COUNT = "x-acemq-replay-count"
LEGACY_NAMES = {
    "x-acemq-replayed-from": REPLAYED_FROM,
    "x-acemq-replayed-at": REPLAYED_AT,
    LEGACY_REPLAY_COUNT: REPLAY_COUNT,
}
# Every header section 2 normalises plus the legacy spellings: the contract's headers.
CONTRACT_HEADERS = frozenset(
    {
        ID,
        TYPE,
        VERSION,
        CORRELATION,
        ATTEMPT,
        FIRST_SEEN,
        CAUSATION,
        ORIGIN,
        ERROR,
        CLAIM,
        ROUTE,
        ROUTE_POSITION,
        ROUTE_ID,
        REPLAYED_FROM,
        REPLAYED_AT,
        REPLAY_COUNT,
        REPLY_TO,
        *LEGACY_NAMES,
    }
)
UNKNOWN_RESERVED_LABEL = "x-acemq-*"
APP_LABEL = "app"
DEFAULT_TYPE = "message"

# An AMQP short string (message_id, reply_to) holds at most this many bytes (section 2).
SHORT_STRING_MAX = 255

INT32_MIN, INT32_MAX = INT_BOUNDS[Int32]
INT64_MIN, INT64_MAX = INT_BOUNDS[Int64]
# docs/contract.md section 9: whitespace is ASCII space, TAB, CR, LF, VT, FF.
WHITESPACE = " \t\r\n\x0b\x0c"
