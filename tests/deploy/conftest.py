"""Rendering the Helm chart offline (helm-python-sdk) and validating what it renders."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "acemq-sidecar"
MINIMAL_VALUES = CHART / "ci" / "minimal-values.yaml"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
APP_CHART = Path(__file__).resolve().parent / "app-chart"

RELEASE = "acemq"
NAMESPACE = "messaging"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion; unhealthyPodEvictionPolicy
# is on by default from 1.27), the first with native sidecars, and the newest the installed
# kubernetes-validate knows; every manifest must pass each.
OLDEST_KUBE = "1.27.0"
NATIVE_SIDECAR_KUBE = "1.29.0"
LATEST_KUBE = kubernetes_validate.utils.latest_version()
KUBE_VERSIONS = (OLDEST_KUBE, NATIVE_SIDECAR_KUBE, LATEST_KUBE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """One rendered Kubernetes object and the template it came from."""

    template: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        """The object's kind."""
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        """The object's metadata.name."""
        return str(self.body["metadata"]["name"])


def copy_sources(into: Path) -> None:
    """Copy what the wheel is built from (the Dockerfile's COPY lines) into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md", "hatch_build.py"):
        shutil.copy(REPO / name, into / name)
    shutil.copytree(
        REPO / "sidecar", into / "sidecar", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )


def read_values(path: Path) -> dict[str, Any]:
    """Return a values file as a dict (a deep copy each time, so tests may change it)."""
    values: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return copy.deepcopy(values)


def render_templates(
    values: dict[str, Any] | None,
    *,
    chart: Path = CHART,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
) -> dict[str, str]:
    """Render a chart as `helm install` would: each template's text, by its path.

    ``kube_version`` is the cluster's (``.Capabilities.KubeVersion``; Helm's own default
    otherwise), passed to the library's render call, which takes it although the Python
    wrapper does not name it.
    """
    with helm_python.Chart.load(chart) as loaded:
        if kube_version is None:
            return loaded.render(values=values, name=release, namespace=namespace, is_install=True)
        options = {
            "name": release,
            "namespace": namespace,
            "is_install": True,
            "kube_version": f"v{kube_version.removeprefix('v')}",
        }
        text = helm_python._native.call_string(
            "helm_render",
            loaded._raw(),
            None if values is None else json.dumps(values),
            json.dumps(options),
        )
    rendered: dict[str, str] = json.loads(text)
    return rendered


def render(
    values: dict[str, Any] | None,
    *,
    chart: Path = CHART,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
) -> list[Manifest]:
    """Render a chart as `helm install` would; return every object, NOTES.txt excluded."""
    rendered = render_templates(
        values, chart=chart, release=release, namespace=namespace, kube_version=kube_version
    )
    manifests: list[Manifest] = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        manifests.extend(
            Manifest(template=template, body=body)
            for body in yaml.safe_load_all(text)
            if body  # a template switched off by a toggle renders nothing
        )
    return manifests


def render_notes(values: dict[str, Any]) -> str:
    """Return the rendered NOTES.txt."""
    with helm_python.Chart.load(CHART) as loaded:
        rendered = loaded.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))


def only(manifests: list[Manifest], kind: str) -> Manifest:
    """Return the one object of ``kind``; fail if there is none or more than one."""
    found = [manifest for manifest in manifests if manifest.kind == kind]
    assert len(found) == 1, f"expected one {kind}, got {[m.name for m in found]}"
    return found[0]


def sidecar_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """Return the container named acemq-sidecar of a pod spec."""
    found = [c for c in pod_spec["containers"] if c["name"] == "acemq-sidecar"]
    assert len(found) == 1, [c["name"] for c in pod_spec["containers"]]
    return found[0]


def routes_yaml(manifests: list[Manifest]) -> str:
    """Return the route map the chart rendered into its ConfigMap."""
    config_maps = [
        m for m in manifests if m.kind == "ConfigMap" and "routes.yaml" in m.body["data"]
    ]
    assert len(config_maps) == 1, [m.name for m in config_maps]
    return str(config_maps[0].body["data"]["routes.yaml"])


@pytest.fixture(scope="session")
def minimal_manifests() -> list[Manifest]:
    """The chart's defaults plus the two values it requires (ci/minimal-values.yaml)."""
    return render(read_values(MINIMAL_VALUES))


@pytest.fixture(scope="session")
def full_manifests() -> list[Manifest]:
    """Every feature on (ci/full-values.yaml)."""
    return render(read_values(FULL_VALUES))
