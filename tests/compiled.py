"""Whether a module of the sidecar runs compiled (``scripts/compile``) or as plain Python.

A few tests replace what compiled code binds early, or read what it does not show (a
signature); they run on the plain build only, and the compiled build's run skips them.
"""

from __future__ import annotations

from types import ModuleType


def is_compiled(module: ModuleType) -> bool:
    """True when ``module`` was imported from a built extension, not from its source."""
    return (module.__file__ or "").endswith(".so")
