"""pydantic's validation errors turned into the route map's messages, at the right line.

This module owns what a schema error says (``FILE:LINE: key.path: what is wrong and what
is allowed``, with "did you mean" for a misspelt key) and which line it points at: the
key's own line for an unknown key, else the value's, else the nearest ancestor's that is
in the file. Pure: no I/O.
"""

from __future__ import annotations

from difflib import get_close_matches
from enum import StrEnum
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sidecar.errors import ConfigError
from sidecar.routemap.schema import BoundReason, RouteMapFile
from sidecar.routemap.text import show
from sidecar.routemap.yaml_source import format_path

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails

    from sidecar.routemap.yaml_source import KeyPath, TreeReader

__all__ = ["line_for", "translate"]


def _strip(annotation: object) -> tuple[object, list[object]]:
    """Unwrap ``Annotated`` and ``X | None``, collecting the constraints met on the way."""
    constraints: list[object] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *metadata = get_args(annotation)
            for item in metadata:
                constraints.extend(item.metadata if isinstance(item, FieldInfo) else [item])
        elif origin in (Union, UnionType):
            args = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(args) != 1:
                return annotation, constraints
            annotation = args[0]
        else:
            return annotation, constraints


def _schema_at(loc: KeyPath) -> tuple[object, list[object]]:
    """Return the declared type at a validation path, and its constraints."""
    annotation: object = RouteMapFile
    constraints: list[object] = []
    for part in loc:
        annotation, _ = _strip(annotation)
        if isinstance(part, int):
            annotation, constraints = (get_args(annotation) or (None,))[0], []
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = _fields_by_key(annotation).get(part)
            if info is None:
                return None, []
            annotation, constraints = info.annotation, list(info.metadata)
        else:
            return None, []
    annotation, more = _strip(annotation)
    return annotation, constraints + more


def _fields_by_key(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _describe_error(error: ErrorDetails) -> str:  # noqa: C901, PLR0911, PLR0912 - a case per pydantic error type
    kind, loc, value = error["type"], tuple(error["loc"]), error["input"]
    got = show(value)
    match kind:
        case "missing":
            return "this key is required"
        case "extra_forbidden":
            parent, _ = _schema_at(loc[:-1])
            allowed = (
                list(_fields_by_key(parent))
                if isinstance(parent, type) and issubclass(parent, BaseModel)
                else []
            )
            hint = get_close_matches(str(loc[-1]), allowed, n=1)
            did_you_mean = f'did you mean "{hint[0]}"? ' if hint else ""
            if not allowed:
                return "unknown key"
            return f"unknown key; {did_you_mean}allowed keys are: {', '.join(allowed)}"
        case "enum":
            annotation, _ = _schema_at(loc)
            if isinstance(annotation, type) and issubclass(annotation, StrEnum):
                expected = " or ".join(f'"{member.value}"' for member in annotation)
                return f"expected {expected}, got {got}"
        case "string_type":
            quote = "; quote it to make it a string" if isinstance(value, int | float) else ""
            return f"expected a string, got {got}{quote}"
        case "int_type" | "int_parsing" | "int_from_float":
            return f"expected an integer, got {got}"
        case "float_type" | "float_parsing":
            return f"expected a number, got {got}"
        case "finite_number":
            return f"expected a finite number, got {got}"
        case "model_type" | "model_attributes_type" | "dict_type":
            return f"expected a mapping, got {got}"
        case "tuple_type" | "list_type":
            return f"expected a list, got {got}"
        case "greater_than" | "greater_than_equal" | "less_than" | "less_than_equal":
            annotation, constraints = _schema_at(loc)
            number = "an integer" if annotation is int else "a number"
            why = "".join(f" ({c.text})" for c in constraints if isinstance(c, BoundReason))
            return f"expected {number} {_describe_bounds(constraints)}{why}, got {got}"
        case _ if kind.startswith("config_"):
            return error["msg"]
    return f"{error['msg']}, got {got}"


def _describe_bounds(constraints: list[object]) -> str:
    bounds: dict[str, object] = {}
    for item in constraints:
        if isinstance(item, annotated_types.Ge):
            bounds["ge"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            bounds["gt"] = item.gt
        elif isinstance(item, annotated_types.Le):
            bounds["le"] = item.le
    if "ge" in bounds and "le" in bounds:
        return f"from {bounds['ge']} to {bounds['le']}"
    if "gt" in bounds:
        return f"greater than {bounds['gt']}"
    return f"of at least {bounds.get('ge')}"


def line_for(loc: KeyPath, reader: TreeReader, *, kind: str) -> int:
    """Return the line of a path, or of its nearest ancestor that is in the file."""
    if kind == "extra_forbidden" and loc in reader.key_lines:
        return reader.key_lines[loc]
    for end in range(len(loc), 0, -1):
        if loc[:end] in reader.value_lines:
            return reader.value_lines[loc[:end]]
    return reader.value_lines.get((), 1)


def translate(e: ValidationError, reader: TreeReader) -> ConfigError:
    """Report the error that comes first in the file, a missing key only when nothing else.

    A missing key is often the other half of a misspelt one, and "unknown key "rout";
    did you mean "routes"?" is the message that helps.
    """
    located = [
        (
            error["type"] == "missing",
            line_for(tuple(error["loc"]), reader, kind=error["type"]),
            index,
            error,
        )
        for index, error in enumerate(e.errors())
    ]
    _, line, _, error = min(located, key=lambda item: item[:3])
    return ConfigError(
        _describe_error(error),
        source=reader.source,
        line=line,
        key=format_path(tuple(error["loc"])),
    )
