"""The wheel's build hook: the hot modules compiled with mypyc where a compiler is.

``pip install .`` (or ``pip wheel .``) then gives the compiled build, as the image ships,
so that a user's benchmark measures what ships. Without a C compiler, the Python headers
or mypyc, or with ``ACEMQ_SIDECAR_PURE=1``, the same modules go into the wheel as plain
Python, and the build says why. An editable install (``pip install -e``) is always plain
Python: the tests measure coverage on it, and ``scripts/compile`` compiles a checkout in
place. The modules are the hook's ``modules`` in pyproject.toml, which scripts/compile
reads too (docs/decisions/0061-compiled-wheel.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

GROUP = "acemq_sidecar"  # mypyc's group: one shared library for every compiled module


def why_plain() -> str | None:
    """Return why this machine builds plain Python; None: it can compile."""
    if os.environ.get("ACEMQ_SIDECAR_PURE") == "1":
        return "ACEMQ_SIDECAR_PURE=1"
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc (mypy) is not installed in the build environment"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        return f"no C compiler ({compiler.split()[0]})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h)"
    return None


class CompiledBuild(BuildHookInterface):  # type: ignore[type-arg]
    """Compile the configured modules into the wheel (see the module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile before the wheel is packed, and put the compiled modules into it."""
        if self.target_name != "wheel" or version == "editable":
            return
        reason = why_plain()
        if reason is not None:
            self.app.display_warning(f"acemq-sidecar: a plain Python build: {reason}")
            return
        self._work = Path(tempfile.mkdtemp(prefix="acemq-sidecar-mypyc-"))
        for built, inside in self._compile(list(self.config["modules"])):
            build_data["force_include"][built] = inside
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        self.app.display_info("acemq-sidecar: the compiled build (mypyc)")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the scratch folder of the compile."""
        del version, build_data, artifact_path
        work = getattr(self, "_work", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    def _compile(self, modules: list[str]) -> list[tuple[str, str]]:
        """Compile ``modules``; return each built file and its path inside the wheel."""
        from mypyc.build import mypycify  # noqa: PLC0415 - only where it can compile
        from setuptools import Distribution  # noqa: PLC0415

        lib = self._work / "lib"
        here = Path.cwd()
        os.chdir(self.root)  # mypyc names modules by their paths from the project root
        try:
            # The dependencies' types are the build environment's: the hook asks for the
            # runtime dependencies (pyproject.toml), and mypy's flags come from there too.
            flags = list(self.config["mypy-flags"])
            extensions = mypycify(
                [*flags, *modules],
                group_name=GROUP,
                target_dir=str(self._work / "c"),
                multi_file=True,  # a C file per module, compiled in parallel
            )
            dist = Distribution({"name": "acemq-sidecar-compiled", "ext_modules": extensions})
            dist.script_args = [
                "build_ext",
                "--build-lib",
                str(lib),
                "--build-temp",
                str(self._work / "tmp"),
                "--parallel",
                str(os.cpu_count() or 1),
            ]
            dist.parse_command_line()
            dist.run_commands()
        finally:
            os.chdir(here)
        return [(str(path), path.relative_to(lib).as_posix()) for path in lib.rglob("*.so")]
