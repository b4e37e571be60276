"""Docs name only what exists: every module, class and function they name in code quotes.

Read: README.md, docs/*.md (the decision records are history, each as of its date, and are
not read), and every docstring of the package. Checked: a dotted name rooted in one of the
sidecar's packages (``settle.table.after``, ``sidecar.relay.settling.Settling``), a module
path (``relay/settling.py``), and ``Class.attribute`` for a class the package defines (its
methods, class attributes, and what its methods set on ``self``, its bases' too).
A ``broker.`` name that does not resolve is a route map or chart values key
(``broker.consumer_timeout_s``), unless it names what the broker package offers.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sidecar"
PACKAGES = "amqp|wire|contract|routemap|settle|relay|flow|observe|broker|quarantine"
DOTTED = re.compile(rf"`{{1,2}}((?:sidecar\.)?(?:{PACKAGES})(?:\.[A-Za-z_]\w*)+)(?:\(\))?`{{1,2}}")
MODULE_PATH = re.compile(rf"`((?:sidecar/)?(?:{PACKAGES})/[\w/]+\.py)`")
CLASS_ATTRIBUTE = re.compile(r"`{1,2}([A-Z]\w+)\.([a-z_]\w*)(?:\(\))?`{1,2}")
# What of ``broker.`` is read as code although it does not resolve: the package's face.
BROKER_CODE = tuple(
    f"broker.{name}" for name in ("BrokerAddress", "Failover", "Secret", "mask_url", "nack_is_free")
)


def _texts() -> list[tuple[str, str]]:
    """Each place read, with its text (a module: its docstrings only)."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    texts = [(str(path.relative_to(REPO)), path.read_text(encoding="utf-8")) for path in docs]
    for module in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        strings = [ast.get_docstring(n) or "" for n in ast.walk(tree) if isinstance(n, kinds)]
        texts.append((str(module.relative_to(REPO)), "\n".join(strings)))
    return texts


def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Every class the package defines: what it names (methods, attributes) and its bases."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for module in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            names: set[str] = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            names.update(
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            )
            bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
            found.setdefault(node.name, []).append((names, bases))
    return found


CLASSES = _classes()
TEXTS = _texts()


def _has(cls: str, attribute: str, seen: frozenset[str] = frozenset()) -> bool:
    for names, bases in CLASSES.get(cls, []):
        if attribute in names:
            return True
        if any(b not in seen and _has(b, attribute, seen | {cls}) for b in bases):
            return True
    return False


def _resolves(name: str) -> bool:
    """Whether a dotted name is a module, or a module's attribute (chain), of the package."""
    parts = name.split(".")
    if parts[0] != "sidecar":
        parts = ["sidecar", *parts]
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _missing(text: str) -> list[str]:
    missing = []
    for match in DOTTED.finditer(text):
        name = match.group(1)
        if _resolves(name):
            continue
        if name.startswith("broker.") and not name.startswith(BROKER_CODE):
            continue  # a route map or chart values key (broker.consumer_timeout_s)
        missing.append(name)
    for match in MODULE_PATH.finditer(text):
        path = match.group(1)
        if not (REPO / (path if path.startswith("sidecar/") else f"sidecar/{path}")).exists():
            missing.append(path)
    for match in CLASS_ATTRIBUTE.finditer(text):
        cls, attribute = match.groups()
        if cls in CLASSES and not _has(cls, attribute):
            missing.append(f"{cls}.{attribute}")
    return missing


@pytest.mark.parametrize(("place", "text"), TEXTS, ids=[place for place, _ in TEXTS])
def test_every_name_in_code_quotes_exists(place: str, text: str) -> None:
    assert _missing(text) == [], f"{place} names what does not exist"


def test_the_check_finds_a_name_that_does_not_exist() -> None:
    """Its positive control: a module, a path and a method gone are each found."""
    text = "`relay.settle_task.settle`, `relay/held_waits.py`, `Settler.settle`, `Settler.offer`"
    assert _missing(text) == ["relay.settle_task.settle", "relay/held_waits.py", "Settler.settle"]
