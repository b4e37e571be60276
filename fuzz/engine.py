"""A target's check run under atheris: libFuzzer's loop, guided by Python's coverage.

Each target module has a ``check(data: bytes) -> None`` that raises on a defect (an
exception the code under test must never raise, or a broken property) and returns
otherwise. ``fuzz(target, argv)`` imports it with the sidecar and the libraries it parses
with instrumented, and hands ``argv`` (libFuzzer's flags and corpus directories) to
libFuzzer. atheris is imported only here, so the regression tests run the checks without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["INSTRUMENTED", "fuzz"]

# The packages whose Python code guides the search: ours, and the parsers we call (h11's
# HTTP, PyYAML's Python half). A compiled module (scripts/compile) has no coverage hooks:
# it is run, not guided, so the compiled build's fuzzing is led by the plain modules.
INSTRUMENTED = ["sidecar", "h11", "yaml", "fuzz"]


def fuzz(target: str, argv: list[str]) -> None:
    """Fuzz ``fuzz.<target>``'s check; ``argv[0]`` is the program name, as in ``sys.argv``."""
    import atheris  # noqa: PLC0415 - the fuzz extra: only a fuzzing run needs it

    with atheris.instrument_imports(include=INSTRUMENTED):
        module = importlib.import_module(f"fuzz.{target}")
    check: Callable[[bytes], None] = module.check
    atheris.Setup(argv, check)
    atheris.Fuzz()
