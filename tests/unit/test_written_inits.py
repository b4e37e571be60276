"""Values made once per message write their ``__init__`` out: it does what a generated one does.

docs/decisions/0063-values-made-per-message.md: a written ``__init__`` is compiled, a
generated one runs as Python. Each parameter is a field, by keyword, with the field's
default; every field is set; the value stays frozen and compares as a dataclass does.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from sidecar.contract.verdict import Relay
from sidecar.settle.settlement import Copy
from sidecar.wire.delivery import Delivery

WRITTEN: list[type[Any]] = [Delivery, Copy, Relay]
DEFAULTS: dict[type[Any], dict[str, object]] = {
    Delivery: {
        "undecodable": None,
        "unread_header": None,
        "unread_body": None,
        "content_header": b"",
    },
    Copy: {"content_header": None},
    Relay: {"stripped": ()},
}


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda cls: cls.__name__)
def test_each_field_is_a_keyword_parameter_with_its_default(cls: type[Any]) -> None:
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [f.name for f in dataclasses.fields(cls)]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters)
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    assert defaults == DEFAULTS[cls]


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda cls: cls.__name__)
def test_every_field_is_set_and_the_value_is_frozen(cls: type[Any]) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    made = cls(**{name: f"<{name}>" for name in names})
    assert {name: getattr(made, name) for name in names} == {name: f"<{name}>" for name in names}
    assert made == cls(**{name: f"<{name}>" for name in names})
    assert made != cls(**{name: f"<{name}>" for name in names[:-1]} | {names[-1]: "other"})
    if not _compiled(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.__setattr__(names[0], "changed")


def _compiled(cls: type[Any]) -> bool:
    """Compiled code stores fields directly: frozen holds for type checks, not at run time."""
    module = inspect.getmodule(cls)
    return module is not None and (module.__file__ or "").endswith(".so")
