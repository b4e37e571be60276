"""The shape of the package: layers as packages, faces, and modules of a readable size.

docs/architecture.md draws the packages; these checks keep the tree that way: a newcomer
finds a module from its job, each package says what it offers in ``__all__``, and the
import-linter contract and the coverage floor name the same pure core.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sidecar"
MAX_TOP_LEVEL = 12
MAX_MODULE_LINES = 450
# Functions are capped, classes are not: a cohesive class is never split to fit a number.
MAX_FUNCTION_LINES = 80
MAX_DOCSTRING_LINES = 20
MAX_README_LINES = 300  # the rest is docs/'s

MODULES = sorted(PACKAGE.rglob("*.py"))
SUBPACKAGES = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_few_modules_at_the_top_and_no_package_left_unmade() -> None:
    """The top level is the process; a shared prefix of three is a package never made."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules: {top}"
    prefixes = Counter(name.split("_")[0] for name in top if "_" in name.strip("_"))
    crowded = {prefix: n for prefix, n in prefixes.items() if n >= 3}
    assert crowded == {}, f"modules sharing a prefix, a package to make: {crowded}"


@pytest.mark.parametrize("package", SUBPACKAGES, ids=lambda p: p.name)
def test_every_package_has_a_face(package: Path) -> None:
    """Each subpackage's __init__ names what the rest of the sidecar may import from it."""
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    names = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and any(getattr(t, "id", None) == "__all__" for t in _targets(node))
    ]
    assert names, f"{_rel(package)}/__init__.py has no __all__"
    assert ast.get_docstring(tree), f"{_rel(package)}/__init__.py says nothing of its package"


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


@pytest.mark.parametrize("module", MODULES, ids=_rel)
def test_modules_and_functions_stay_readable(module: Path) -> None:
    """No module over 450 lines, no function over 80, no module docstring over 20."""
    text = module.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_MODULE_LINES, f"{_rel(module)}: {text.count(chr(10))} lines"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_FUNCTION_LINES, f"{_rel(module)}: {node.name} is {size} lines"
    doc = ast.get_docstring(tree, clean=False) or ""
    assert doc.count("\n") + 1 <= MAX_DOCSTRING_LINES, (
        f"{_rel(module)}: a docstring of {doc.count(chr(10)) + 1} lines; "
        "the reasoning goes in docs/decisions/"
    )


# What the AMQP client may import of the sidecar, type-only imports included: the wire, the
# broker's address and release facts, the errors, itself (pyproject's import-linter
# contract says the same, for imports at run time).
CLIENT_IMPORTS = ("sidecar.amqp", "sidecar.wire", "sidecar.broker", "sidecar.errors")


@pytest.mark.parametrize("module", sorted((PACKAGE / "amqp").glob("*.py")), ids=_rel)
def test_the_amqp_client_imports_no_domain_not_even_for_types(module: Path) -> None:
    """The client is told the domain's facts (ClientOptions); it imports none of them."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sidecar")
    ]
    imported += [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("sidecar")
    ]
    foreign = [
        name for name in imported if name != "sidecar" and not name.startswith(CLIENT_IMPORTS)
    ]
    assert foreign == [], f"{_rel(module)} imports {foreign}"


def test_coverage_floor_and_pure_contract_name_the_same_core() -> None:
    """The import-linter's pure core and the coverage floor's include cannot drift apart."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    pure = next(c for c in contracts if c["name"] == "The pure core does no I/O")
    include = config["tool"]["coverage"]["report"]["include"]
    as_paths = {
        m.replace(".", "/") + (".py" if (REPO / (m.replace(".", "/") + ".py")).is_file() else "/*")
        for m in pure["source_modules"]
    }
    assert set(include) == as_paths


def test_nothing_names_a_path_outside_the_repository() -> None:
    """A user's clone has no ../shared: the code, the docs and the config never need it."""
    places = [*PACKAGE.rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md"]
    places.append(REPO / "pyproject.toml")
    found = [
        f"{_rel(p)}:{n}"
        for p in places
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\.\./shared\b", line) and p.name != "contract.md"
    ]
    assert found == []


def test_the_readme_stays_a_front_door() -> None:
    """Two commands, what the sidecar does and where to read on: lab notes go to docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md: {lines} lines"
