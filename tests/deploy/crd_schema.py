"""Validating custom objects against the CRD schemas kept in tests/deploy/crds (data).

kubernetes-validate knows the built-in kinds only. A CRD's openAPIV3Schema is applied here
as the API server applies it with strict field validation: a field the schema does not
name is refused, except under x-kubernetes-preserve-unknown-fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the test extra
import yaml

CRDS = Path(__file__).resolve().parent / "crds"


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        strict = {key: _strict(value) for key, value in node.items()}
        if (
            "properties" in strict
            and "additionalProperties" not in strict
            and not strict.get("x-kubernetes-preserve-unknown-fields")
        ):
            strict["additionalProperties"] = False
        return strict
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


def crd_schema(file: str, api_version: str) -> dict[str, Any]:
    """Return the strict schema of ``api_version`` (group/version) of the CRD in ``file``."""
    crd = yaml.safe_load((CRDS / file).read_text(encoding="utf-8"))
    group, _, version = api_version.partition("/")
    assert crd["spec"]["group"] == group, (file, api_version)
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema: dict[str, Any] = _strict(served["schema"]["openAPIV3Schema"])
    # metadata is the API server's (ObjectMeta), not the CRD's to describe.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate_custom(body: dict[str, Any], file: str) -> None:
    """Raise ``jsonschema.ValidationError`` if ``body`` does not match the CRD in ``file``."""
    jsonschema.validate(body, crd_schema(file, body["apiVersion"]))
