"""The names of the envelope contract (docs/contract.md section 2): headers, labels, bounds.

This module owns every header and property name the contract reads or writes, the legacy
spellings (section 5), the metric labels that stand for names (section 6) and the numeric
bounds the rules use. It holds constants only: no rule, no reading of a value. Each is
``Final``: the compiled build folds them into the code that reads them, instead of looking
them up in this module per use.
"""

from __future__ import annotations

from typing import Final

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

CONTRACT_VERSION: Final = "1.2"

RESERVED_PREFIX: Final = "x-acemq-"
ID: Final = "x-acemq-id"
TYPE: Final = "x-acemq-type"
VERSION: Final = "x-acemq-version"
CORRELATION: Final = "x-acemq-correlation"
ATTEMPT: Final = "x-acemq-attempt"
FIRST_SEEN: Final = "x-acemq-first-seen"
CAUSATION: Final = "x-acemq-causation"
ORIGIN: Final = "x-acemq-origin"
ERROR: Final = "x-acemq-error"
CLAIM: Final = "x-acemq-claim"
ROUTE: Final = "x-acemq-route"
ROUTE_POSITION: Final = "x-acemq-route-position"
ROUTE_ID: Final = "x-acemq-route-id"
REPLAYED_FROM: Final = "acemq-replayed-from"
REPLAYED_AT: Final = "acemq-replayed-at"
REPLAY_COUNT: Final = "acemq-replay-count"
REPLY_TO: Final = "acemq-reply-to"
ORIGINAL_USER_ID: Final = "acemq-original-user-id"
LEGACY_REPLAY_COUNT: Final = "x-acemq-replay-count"
LEGACY_NAMES: Final = {
    "x-acemq-replayed-from": REPLAYED_FROM,
    "x-acemq-replayed-at": REPLAYED_AT,
    LEGACY_REPLAY_COUNT: REPLAY_COUNT,
}
# Every header section 2 normalises plus the legacy spellings: the contract's headers.
CONTRACT_HEADERS: Final = frozenset(
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
UNKNOWN_RESERVED_LABEL: Final = "x-acemq-*"
APP_LABEL: Final = "app"
DEFAULT_TYPE: Final = "message"

# An AMQP short string (message_id, reply_to) holds at most this many bytes (section 2).
SHORT_STRING_MAX: Final = 255

INT32_MIN: Final = INT_BOUNDS[Int32][0]
INT32_MAX: Final = INT_BOUNDS[Int32][1]
INT64_MIN: Final = INT_BOUNDS[Int64][0]
INT64_MAX: Final = INT_BOUNDS[Int64][1]
# docs/contract.md section 9: whitespace is ASCII space, TAB, CR, LF, VT, FF.
WHITESPACE: Final = " \t\r\n\x0b\x0c"
