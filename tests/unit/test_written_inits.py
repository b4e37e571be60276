"""Values made once per message write their ``__init__`` out: it does what a generated one does.

docs/decisions/0063-values-made-per-message.md: a written ``__init__`` is compiled, a
generated one runs as Python. The parameters are the fields, in order, with the fields'
defaults (by keyword only for the domain values); every field is set; the value stays
frozen and compares as a dataclass does.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any

import pytest

from sidecar.amqp.content import Content
from sidecar.amqp.stream import BodyStream
from sidecar.contract.verdict import Kind, Relay, Violation
from sidecar.settle.events import RetriedCopy
from sidecar.settle.settlement import Copy, Outcome
from sidecar.settle.step import Attempt, Publish, Step
from sidecar.wire import BasicDeliver, ContentHeader, UndecodableTable
from sidecar.wire.delivery import Delivery, UnreadBody, UnreadHeader
from tests.compiled import is_compiled

# By keyword only (the domain values), or also by position (the frames' and the step's
# values, which were NamedTuples).
KEYWORD_ONLY: list[type[Any]] = [Delivery, Copy, Relay]
BY_POSITION: list[type[Any]] = [Publish, Attempt, Step, BasicDeliver, ContentHeader, Content]
WRITTEN = KEYWORD_ONLY + BY_POSITION
DEFAULTS: dict[type[Any], dict[str, object]] = {
    Delivery: {
        "undecodable": None,
        "unread_header": None,
        "unread_body": None,
        "content_header": b"",
    },
    Copy: {"content_header": None},
    Relay: {"stripped": ()},
    Publish: {},
    Attempt: {"alone": False, "holds": 0, "returns": 0, "last": None},
    Step: {"events": ()},
    BasicDeliver: {},
    ContentHeader: {},
    Content: {"unread": None, "stream": None},
}


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda cls: cls.__name__)
def test_each_field_is_a_keyword_parameter_with_its_default(cls: type[Any]) -> None:
    if _compiled(cls):
        pytest.skip("a compiled __init__ shows no signature; the plain build checks it")
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [f.name for f in dataclasses.fields(cls)]
    kind = (
        inspect.Parameter.KEYWORD_ONLY
        if cls in KEYWORD_ONLY
        else inspect.Parameter.POSITIONAL_OR_KEYWORD
    )
    assert all(p.kind is kind for p in parameters)
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    assert defaults == DEFAULTS[cls]


# A value of its field's type for every field (compiled, a wrong type is refused), each one
# told apart from the others, and another value for the last field.
SAMPLES: dict[type[Any], dict[str, object]] = {
    Delivery: {
        "delivery_tag": 7,
        "exchange": "<exchange>",
        "routing_key": "<routing key>",
        "redelivered": True,
        "properties": {"message_id": "<id>"},
        "headers": {"x-acemq-id": "<id>"},
        "body": b"<body>",
        "undecodable": UndecodableTable(b"<raw>", "<reason>"),
        "unread_header": UnreadHeader(size=9, limit=8),
        "unread_body": UnreadBody(size=9, limit=8),
        "content_header": b"<header>",
    },
    Copy: {
        "properties": {"message_id": "<id>"},
        "headers": {"x-acemq-id": "<id>"},
        "routing_key": "<routing key>",
        "outcome": Outcome.AUDITED,
        "content_header": b"<header>",
    },
    Relay: {
        "properties": {"message_id": "<id>"},
        "headers": {"x-acemq-id": "<id>"},
        "violations": (Violation(Kind.COERCED, "x-acemq-attempt"),),
        "stripped": ("x-acemq-unknown",),
    },
}
_COPY: dict[str, Any] = SAMPLES[Copy]
_ATTEMPT: dict[str, Any] = {
    "plan": Copy(**_COPY),
    "alone": True,
    "holds": 2,
    "returns": 1,
    "last": "<delivery limit>",
}
_DELIVER: dict[str, Any] = {
    "consumer_tag": "<tag>",
    "delivery_tag": 7,
    "redelivered": True,
    "exchange": "<exchange>",
    "routing_key": "<routing key>",
}
_HEADER: dict[str, Any] = {
    "body_size": 6,
    "properties": {"message_id": "<id>"},
    "headers": {"x-acemq-id": "<id>"},
    "payload": b"<payload>",
}
SAMPLES |= {
    Publish: {"plan": Copy(**_COPY), "alone": True},
    Attempt: _ATTEMPT,
    Step: {
        "action": Publish(Copy(**_COPY), alone=True),
        "attempt": Attempt(**_ATTEMPT),
        "events": (RetriedCopy(),),
    },
    BasicDeliver: _DELIVER,
    ContentHeader: _HEADER,
    Content: {
        "method": BasicDeliver(**_DELIVER),
        "header": ContentHeader(**_HEADER),
        "body": b"<body>",
        "unread": UnreadHeader(size=9, limit=8),
        "stream": BodyStream(6, resume=lambda: None),
    },
}
OTHER_LAST: dict[type[Any], object] = {
    Delivery: b"",
    Copy: None,
    Relay: (),
    Publish: False,
    Attempt: "<other>",
    Step: (),
    BasicDeliver: "<other>",
    ContentHeader: b"",
    Content: None,
}


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda cls: cls.__name__)
def test_every_field_is_set_and_the_value_is_frozen(cls: type[Any]) -> None:
    sample = SAMPLES[cls]
    assert list(sample) == [f.name for f in dataclasses.fields(cls)]
    made = cls(**sample)
    assert {name: getattr(made, name) for name in sample} == sample
    assert made == cls(**sample)
    assert made != cls(**sample | {list(sample)[-1]: OTHER_LAST[cls]})
    if not _compiled(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.__setattr__(next(iter(sample)), "changed")


def _compiled(cls: type[Any]) -> bool:
    """Compiled code stores fields directly: frozen holds for type checks, not at run time."""
    return is_compiled(sys.modules[cls.__module__])
