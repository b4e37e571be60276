"""Coverage-guided fuzz targets (atheris): the parsers of what comes from outside.

A module per target, each with a ``check(data: bytes) -> None`` that raises on a defect:
``frames`` (the frame reader), ``tables`` (the field-table decoder), ``content`` (the
content header and the content reader), ``normalise`` (the contract over decoded
headers), ``routemap`` (the route map parser) and ``http_request`` (the HTTP side).
``python -m fuzz TARGET [libFuzzer flags] [corpus dirs]`` fuzzes one (``fuzz.engine``);
``python -m fuzz.campaign`` runs them all with seeds (``fuzz.seeds``) for ``./dev fuzz``
and CI. Crashes found become tests/unit/fuzz's regression inputs.
"""

from __future__ import annotations

__all__ = ["TARGETS"]

TARGETS = ("frames", "tables", "content", "normalise", "routemap", "http_request")
