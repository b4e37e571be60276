"""``pip wheel .`` gives the compiled build where a compiler is, and plain Python on request.

The wheel's build hook (hatch_build.py) compiles pyproject.toml's modules with mypyc in
pip's isolated build environment (hatchling, mypy and setuptools from PyPI). The compiled
wheel, unpacked beside this venv's dependencies, imports its compiled modules and passes
the contract's vectors; ``ACEMQ_SIDECAR_PURE=1`` builds a wheel of plain Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.deploy.conftest import copy_sources
from tests.support import needs_tool

REPO = Path(__file__).resolve().parents[2]
MODULES: list[str] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "hatch"
]["build"]["targets"]["wheel"]["hooks"]["custom"]["modules"]

pytestmark = pytest.mark.timeout(900)


def build_wheel(tmp_path: Path, **env: str) -> Path:
    """Build the project's wheel from a copy of its sources; return the wheel."""
    source = tmp_path / "src"
    copy_sources(source)
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), source],
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = wheels.glob("acemq_sidecar-*.whl")
    return wheel


@pytest.fixture(scope="module")
def compiled_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs_tool("cc", "gcc", why="no C compiler here: the compiled build cannot be made")
    return build_wheel(tmp_path_factory.mktemp("compiled"), ACEMQ_SIDECAR_PURE="0")


def test_the_wheel_holds_every_configured_module_compiled(compiled_wheel: Path) -> None:
    assert not compiled_wheel.name.endswith("-py3-none-any.whl"), compiled_wheel.name
    names = zipfile.ZipFile(compiled_wheel).namelist()
    for module in MODULES:
        stem = module.removesuffix(".py")
        assert any(n.startswith(f"{stem}.") and n.endswith(".so") for n in names), module
        assert module in names  # the source stays beside it
    assert any(n.startswith("acemq_sidecar__mypyc.") for n in names)


def test_the_compiled_wheel_imports_its_compiled_modules_and_conforms(
    compiled_wheel: Path, tmp_path: Path
) -> None:
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(compiled_wheel).extractall(unpacked)
    check = (
        "import sys, runpy; from importlib import import_module as load;"
        "mods = [load(n) for n in ('sidecar.contract.normaliser', 'sidecar.wire.frames')];"
        "assert all(m.__file__.endswith('.so') for m in mods), [m.__file__ for m in mods];"
        "assert mods[0].__file__.startswith(sys.argv[2]), mods[0].__file__;"
        "sys.argv = ['acemq-sidecar', 'conform', sys.argv[1]];"
        "runpy.run_module('sidecar', run_name='__main__')"
    )
    vectors = REPO / "tests" / "contract" / "vectors.json"
    done = subprocess.run(
        [sys.executable, "-c", check, str(vectors), str(unpacked)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(unpacked)},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_acemq_sidecar_pure_builds_a_wheel_of_plain_python(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, ACEMQ_SIDECAR_PURE="1")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
