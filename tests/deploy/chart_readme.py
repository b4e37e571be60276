"""The chart's README.md, generated from values.schema.json and values.yaml (helm-docs style).

One row per value: its key, type, default (values.yaml) and description (the schema's).
``test_chart_readme.py`` fails when the file and the chart drift apart; to regenerate:

    .venv/bin/python -m tests.deploy.chart_readme
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "acemq-sidecar"
README = CHART / "README.md"

_UNSET = object()

_HEADER = """\
# {name}

{description}

Version {version}, app version {app_version}, Kubernetes {kube_version}.

```sh
kubectl create secret generic acemq-broker --from-literal=url='amqps://user:pass@rabbitmq:5671/'
helm install orders-relay helm/acemq-sidecar \\
  --set broker.urlSecret.name=acemq-broker -f my-routes.yaml   # routeMap: {{routes: [...]}}
```

The shapes (a standalone Deployment, a classic or a native sidecar in your pods), the
RabbitMQ operators' Secrets, TLS, autoscaling, the alerts and what to do when one fires:
[docs/kubernetes.md](../../docs/kubernetes.md).

<!-- Generated from values.schema.json and values.yaml by
     `.venv/bin/python -m tests.deploy.chart_readme`; edit those, not this file. -->

## Values

| Key | Type | Default | Description |
|-----|------|---------|-------------|
"""


def _resolve(root: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Follow a local $ref ("#/properties/routeMap/$defs/...")."""
    while "$ref" in schema:
        node: Any = root
        for part in str(schema["$ref"]).removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _type(root: dict[str, Any], schema: dict[str, Any]) -> str:
    schema = _resolve(root, schema)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(item) for item in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_type(root, option) for option in schema["anyOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(str(item) for item in kind)
    return str(kind or "any")


def _default(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _rows(root: dict[str, Any], schema: dict[str, Any], values: Any, prefix: str) -> list[str]:
    rows: list[str] = []
    for name, node in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        value = values.get(name, _UNSET) if isinstance(values, dict) else _UNSET
        description = _cell(str(node.get("description", "")))
        if "properties" in node and key != "global":
            rows.append(f"| `{key}` | object | | {description} |")
            rows.extend(_rows(root, node, {} if value is _UNSET else value, f"{key}."))
        else:
            rows.append(f"| `{key}` | {_type(root, node)} | {_default(value)} | {description} |")
    return rows


def chart_readme() -> str:
    """Return the README the chart's schema and values make."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    header = _HEADER.format(
        name=chart["name"],
        description=" ".join(chart["description"].split()),
        version=chart["version"],
        app_version=chart["appVersion"],
        kube_version=chart["kubeVersion"],
    )
    return header + "\n".join(_rows(schema, schema, values, "")) + "\n"


def main() -> None:
    """Write helm/acemq-sidecar/README.md."""
    README.write_text(chart_readme(), encoding="utf-8")


if __name__ == "__main__":
    main()
