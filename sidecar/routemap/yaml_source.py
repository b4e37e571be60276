"""Route-map YAML read into plain data, with the line of every key and value.

This module owns steps 1 and 2 of parsing (see ``parse``): ``yaml.compose`` builds
the node tree, with syntax errors reported at pyyaml's mark; the tree then becomes plain
data, refusing duplicate keys (pyyaml keeps the last one silently), interpolating
``${VAR}`` references in string scalars, and guarding against YAML bombs (alias
expansion, nesting, self-reference). It is pure: ``env`` is passed in, nothing is read.
It knows nothing of the schema beyond the names of the top-level keys.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, TypeAlias

import yaml

from sidecar.errors import ConfigError
from sidecar.routemap.text import show

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "KeyPath",
    "ProblemError",
    "TreeReader",
    "format_path",
    "interpolate",
    "line_of",
    "read_yaml",
]

# --- interpolation -----------------------------------------------------------------------

# One pass, left to right: "$$", "${NAME}", "${NAME:-default}", or a "${" that is none of
# these (refused rather than kept, so a typo cannot leak a literal "${" into a queue name).
# A "$" before anything else is kept as it is.
_REFERENCE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<bad>\{))"
)


class ProblemError(Exception):
    """A problem found while reading the node tree; the caller adds file, line and path."""


def interpolate(text: str, *, env: Mapping[str, str]) -> str:
    """Replace each ``${VAR}``, ``${VAR:-default}`` and ``$$`` in one pass (no re-expansion)."""

    def replace(match: re.Match[str]) -> str:
        if match["dollar"] is not None:
            return "$"
        name = match["name"]
        if name is None:
            raise ProblemError(
                f"invalid reference in {json.dumps(text)}: write ${{VAR}} or"
                " ${VAR:-default} (VAR is letters, digits and _), or $$ for a literal $"
            )
        default = match["default"]
        if default is None:
            if name not in env:
                raise ProblemError(
                    f"environment variable {name} is not set; set it or write ${{{name}:-default}}"
                )
            return env[name]
        return env.get(name) or default

    return _REFERENCE.sub(replace, text)


# --- step 2: node tree -> plain data, with lines ----------------------------------------

KeyPath: TypeAlias = tuple[str | int, ...]

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


def line_of(node: yaml.Node) -> int:
    """Return the 1-based line a node starts on."""
    return node.start_mark.line + 1


def format_path(path: KeyPath) -> str | None:
    """Return a key path as messages write it, ``routes[0].to.exchange``; None for the root."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text or None


MAX_VALUES = 100_000  # values in a route map once aliases are expanded
MAX_DEPTH = 32  # levels of nesting in a route map


class TreeReader:
    """Turns a composed node tree into plain data, recording the line of every path."""

    def __init__(self, *, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.value_lines: dict[KeyPath, int] = {}
        self.key_lines: dict[KeyPath, int] = {}
        self._constructor = yaml.SafeLoader("")
        self._open: set[int] = set()
        self._values = 0

    def error(self, message: str, *, path: KeyPath, line: int) -> ConfigError:
        """Return the ``ConfigError`` for ``path`` at ``line`` of this file."""
        return ConfigError(message, source=self.source, line=line, key=format_path(path))

    def read(self, node: yaml.Node, path: KeyPath) -> object:
        """Return the node at ``path`` as plain data, recording its lines; raise ``ConfigError``."""
        self.value_lines[path] = line_of(node)
        self._values += 1
        if self._values > MAX_VALUES:
            # Aliases are references in the node tree; read out, each is a copy, and a few
            # nested ones (a "billion laughs") would fill memory.
            raise self.error(
                f"the file holds more than {MAX_VALUES:,} values once its YAML aliases are"
                " expanded; a route map needs far fewer",
                path=path,
                line=line_of(node),
            )
        if len(path) > MAX_DEPTH:
            raise self.error(
                f"nested deeper than {MAX_DEPTH} levels; a route map needs four",
                path=path[:3],
                line=line_of(node),
            )
        if id(node) in self._open:
            # An alias inside its own anchor: the data would be infinite.
            raise self.error(
                "an alias refers to a node that contains it", path=path, line=line_of(node)
            )
        if isinstance(node, yaml.ScalarNode):
            return self._read_scalar(node, path)
        if node.tag not in (_MAP_TAG, _SEQ_TAG):
            raise self.error(f"unsupported YAML tag {node.tag}", path=path, line=line_of(node))
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._read_mapping(node, path)
            return [self.read(item, (*path, index)) for index, item in enumerate(node.value)]
        finally:
            self._open.discard(id(node))

    def _read_scalar(self, node: yaml.ScalarNode, path: KeyPath) -> object:
        if node.tag == _STR_TAG:
            try:
                return interpolate(node.value, env=self.env)
            except ProblemError as e:
                raise self.error(str(e), path=path, line=line_of(node)) from None
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as e:
            raise self.error(f"invalid value: {e.problem}", path=path, line=line_of(node)) from None

    def _read_mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, object]:
        data: dict[str, object] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.error("expected a plain key", path=path, line=line_of(key_node))
            # Keys are taken as written: never interpolated, and `1:` or `on:` stay strings
            # so they are reported as unknown keys rather than as puzzling types.
            key = key_node.value
            key_path = (*path, key)
            if key in data:
                raise self.error(
                    f"duplicate key; first defined on line {self.key_lines[key_path]};"
                    " each key may appear once",
                    path=key_path,
                    line=line_of(key_node),
                )
            self.key_lines[key_path] = line_of(key_node)
            data[key] = self.read(value_node, key_path)
        return data


# --- step 1 and 2 together -------------------------------------------------------------


def read_yaml(
    text: str, *, source: str, env: Mapping[str, str]
) -> tuple[dict[str, object], TreeReader]:
    """Return the top-level mapping as plain data, and the reader that holds its lines.

    Raise ``ConfigError`` for invalid YAML, an empty file or a top level that is not a
    mapping.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ConfigError(
            f"the YAML nests deeper than {MAX_DEPTH} levels; a route map needs four",
            source=source,
            line=None,
            key=None,
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        context = (
            f"{e.context} (line {e.context_mark.line + 1}), "
            if e.context and e.context_mark
            else ""
        )
        raise ConfigError(
            f"invalid YAML: {context}{e.problem}",
            source=source,
            line=mark.line + 1 if mark else None,
            key=None,
        ) from None
    except yaml.reader.ReaderError as e:
        code = f"U+{e.character:04X}" if isinstance(e.character, int) else show(e.character)
        raise ConfigError(
            f"invalid YAML: character {code}: {e.reason}",
            source=source,
            line=text.count("\n", 0, e.position) + 1,
            key=None,
        ) from None
    if root is None:
        raise ConfigError(
            "the file is empty; expected a mapping with at least a routes list",
            source=source,
            line=1,
            key=None,
        )
    reader = TreeReader(source=source, env=env)
    data = reader.read(root, ())
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level (broker, http, mode, quarantine,"
            f" shutdown_grace_s, routes), got {show(data)}",
            source=source,
            line=line_of(root),
            key=None,
        )
    return data, reader
