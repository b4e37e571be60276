"""The AceMQ envelope contract (docs/contract.md): one message in, one verdict out.

This package owns every rule of docs/contract.md and nothing else, one module per part:
``names`` (section 2's headers and the labels), ``verdict`` (the policy, the violation
kinds, Relay and Reject), ``readers`` (section 3), ``envelope`` and ``normaliser`` (the
function and its steps), ``properties``, ``replay``, ``widen`` (section 7); ``producers``
(the producer label of x-acemq-origin) and ``vectors`` (the conformance-vector format).
It is pure: no I/O, no clock, and normalise never raises. Values are the typed field
values of ``sidecar.wire``; the adapter turns them into bytes. Import from this face.
"""

from __future__ import annotations

# The header names are importable from here as they always were (``X as X`` re-exports
# them), but the face's __all__ stays the contract's functions and values.
from sidecar.contract.names import APP_LABEL as APP_LABEL
from sidecar.contract.names import ATTEMPT as ATTEMPT
from sidecar.contract.names import CAUSATION as CAUSATION
from sidecar.contract.names import CLAIM as CLAIM
from sidecar.contract.names import CONTRACT_HEADERS as CONTRACT_HEADERS
from sidecar.contract.names import CONTRACT_VERSION
from sidecar.contract.names import CORRELATION as CORRELATION
from sidecar.contract.names import ERROR as ERROR
from sidecar.contract.names import FIRST_SEEN as FIRST_SEEN
from sidecar.contract.names import ID as ID
from sidecar.contract.names import LEGACY_NAMES as LEGACY_NAMES
from sidecar.contract.names import LEGACY_REPLAY_COUNT as LEGACY_REPLAY_COUNT
from sidecar.contract.names import ORIGIN as ORIGIN
from sidecar.contract.names import ORIGINAL_USER_ID as ORIGINAL_USER_ID
from sidecar.contract.names import REPLAY_COUNT as REPLAY_COUNT
from sidecar.contract.names import REPLAYED_AT as REPLAYED_AT
from sidecar.contract.names import REPLAYED_FROM as REPLAYED_FROM
from sidecar.contract.names import REPLY_TO as REPLY_TO
from sidecar.contract.names import RESERVED_PREFIX as RESERVED_PREFIX
from sidecar.contract.names import ROUTE as ROUTE
from sidecar.contract.names import ROUTE_ID as ROUTE_ID
from sidecar.contract.names import ROUTE_POSITION as ROUTE_POSITION
from sidecar.contract.names import TYPE as TYPE
from sidecar.contract.names import UNKNOWN_RESERVED_LABEL as UNKNOWN_RESERVED_LABEL
from sidecar.contract.names import VERSION as VERSION
from sidecar.contract.normaliser import normalise
from sidecar.contract.producers import (
    DEFAULT_PRODUCERS_PER_ROUTE,
    UNKNOWN,
    ProducerLabels,
    producer_of,
)
from sidecar.contract.properties import move_user_id
from sidecar.contract.replay import stamp_replay
from sidecar.contract.vectors import VectorError, message_from_json, run_vector, verdict_to_json
from sidecar.contract.verdict import Kind, Policy, Publishers, Reject, Relay, Verdict, Violation
from sidecar.wire import PropertyValue

__all__ = [
    "CONTRACT_VERSION",
    "DEFAULT_PRODUCERS_PER_ROUTE",
    "UNKNOWN",
    "Kind",
    "Policy",
    "ProducerLabels",
    "PropertyValue",
    "Publishers",
    "Reject",
    "Relay",
    "VectorError",
    "Verdict",
    "Violation",
    "message_from_json",
    "move_user_id",
    "normalise",
    "producer_of",
    "run_vector",
    "stamp_replay",
    "verdict_to_json",
]
