"""Every chart example in docs/kubernetes.md renders and is a valid Kubernetes object.

A YAML block whose first line is ``# <file>`` is an example: ``values-*.yaml`` is a values
file for the chart; ``<app>/...`` is a file of an application chart, assembled with the
chart packaged into its charts/ (what `helm dependency build` does) and rendered with its
values.yaml and, in turn, with each of its other values files.
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import (
    CHART,
    LATEST_KUBE,
    NATIVE_SIDECAR_KUBE,
    REPO,
    Manifest,
    render,
)
from tests.deploy.crd_schema import validate_custom

DOC = REPO / "docs" / "kubernetes.md"
_BLOCK = re.compile(r"^```yaml\n# (\S+\.yaml)\b[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _examples() -> dict[str, str]:
    """Each example's file name and text."""
    examples: dict[str, str] = {}
    for name, body in _BLOCK.findall(DOC.read_text(encoding="utf-8")):
        assert name not in examples, f"docs/kubernetes.md names {name} twice"
        examples[name] = body
    return examples


def _apps() -> dict[str, dict[str, str]]:
    apps: dict[str, dict[str, str]] = defaultdict(dict)
    for name, body in _examples().items():
        path = PurePosixPath(name)
        if len(path.parts) > 1:
            apps[path.parts[0]][str(PurePosixPath(*path.parts[1:]))] = body
    return dict(apps)


def _validate(manifests: list[Manifest]) -> None:
    assert manifests
    for manifest in manifests:
        if manifest.kind in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            continue  # no schema in kubernetes-validate; test_monitoring checks them
        if manifest.kind in {"ScaledObject", "TriggerAuthentication"}:
            validate_custom(manifest.body, f"keda.sh_{manifest.kind.lower()}s.yaml")
            continue
        for version in (NATIVE_SIDECAR_KUBE, LATEST_KUBE):
            try:
                kubernetes_validate.validate(manifest.body, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(part) for part in e.path)
                pytest.fail(f"{manifest.kind} {manifest.name} at {version}: {path}: {e.message}")


def test_the_doc_has_the_examples_it_promises() -> None:
    """The standalone values, the app chart in both shapes, and a Job."""
    examples = _examples()
    assert {
        "values-orders.yaml",
        "values-keda.yaml",
        "values-operator-user.yaml",
        "values-keda-http.yaml",
        "values-alert-routing.yaml",
    } <= set(examples)
    apps = _apps()
    assert {"Chart.yaml", "values.yaml", "values-native.yaml"} <= set(apps["shop"])
    assert "templates/job.yaml" in apps["nightly"]


STANDALONE = [name for name in _examples() if "/" not in name]


@pytest.mark.parametrize("name", STANDALONE)
def test_standalone_values_examples_render(name: str) -> None:
    """`helm install -f <example>` renders valid objects."""
    values: dict[str, Any] = yaml.safe_load(_examples()[name])
    _validate(render(values))


def _app_chart(tmp_path: Path, app: str) -> Path:
    directory = tmp_path / app
    for relative, body in _apps()[app].items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body, encoding="utf-8")
    (directory / "charts").mkdir()
    helm_python.package(CHART, destination=directory / "charts")
    return directory


APP_VARIANTS = [
    (app, values_file)
    for app, files in _apps().items()
    for values_file in [None, *sorted(f for f in files if re.fullmatch(r"values-.+\.yaml", f))]
]


@pytest.mark.parametrize(
    ("app", "values_file"),
    [pytest.param(a, v, id=f"{a}-{v or 'values.yaml'}") for a, v in APP_VARIANTS],
)
def test_application_chart_examples_render(
    tmp_path: Path, app: str, values_file: str | None
) -> None:
    """The application chart of the doc, with the sidecar in its pods, in each shape."""
    directory = _app_chart(tmp_path, app)
    values = yaml.safe_load(_apps()[app][values_file]) if values_file else None
    manifests = render(values, chart=directory)
    _validate(manifests)
    workloads = [m for m in manifests if m.kind in {"Deployment", "Job", "CronJob"}]
    assert workloads, [m.kind for m in manifests]
    for workload in workloads:
        spec = workload.body["spec"]
        pod = (spec.get("jobTemplate", {}).get("spec", spec))["template"]["spec"]
        init = pod.get("initContainers") or []
        found = [c for c in [*init, *pod["containers"]] if c["name"] == "acemq-sidecar"]
        assert len(found) == 1, f"{workload.kind} {workload.name}: {len(found)} sidecars"
        [sidecar] = found
        native = sidecar in init
        assert native == (sidecar.get("restartPolicy") == "Always")
        if workload.kind != "Deployment":
            assert native, f"{workload.kind} {workload.name}: a Job needs the native sidecar"


def test_helm_lints_the_application_examples(tmp_path: Path) -> None:
    """`helm lint --strict --with-subcharts` on each example application chart."""
    for app in _apps():
        report = helm_python.lint(
            _app_chart(tmp_path / "lint", app), strict=True, with_subcharts=True
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems, (app, problems)
        shutil.rmtree(tmp_path / "lint")


def test_every_alert_has_a_what_to_do_section() -> None:
    """Each alert's runbook_url fragment is the anchor of its section in the doc."""
    values = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text(encoding="utf-8"))
    [rule] = [m for m in render(values) if m.kind == "PrometheusRule"]
    headings = re.findall(r"^### (\w+)$", DOC.read_text(encoding="utf-8"), re.MULTILINE)
    anchors = {heading.lower() for heading in headings}
    for group in rule.body["spec"]["groups"]:
        for alert in group["rules"]:
            assert alert["alert"] in headings, f"no section for {alert['alert']}"
            fragment = alert["annotations"]["runbook_url"].rpartition("#")[2]
            assert fragment in anchors, (alert["alert"], fragment)
