"""The acemq-sidecar.container template inside an application's own pod (tests/deploy/app-chart)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import (
    APP_CHART,
    CHART,
    KUBE_VERSIONS,
    RELEASE,
    Manifest,
    only,
    read_values,
    render,
    routes_yaml,
    sidecar_container,
)


@pytest.fixture
def app_chart(tmp_path: Path) -> Path:
    """The sample app chart with this chart packaged into charts/ (`helm dependency build`)."""
    app = tmp_path / "shop"
    shutil.copytree(APP_CHART, app)
    (app / "charts").mkdir()
    helm_python.package(CHART, destination=app / "charts")
    return app


def _render_app(app: Path, values: dict[str, Any] | None = None) -> list[Manifest]:
    return render(values, chart=app)


def _shop(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = only(manifests, "Deployment")
    assert deployment.name == f"{RELEASE}-shop"
    return deployment.body


def test_app_chart_sees_its_dependency(app_chart: Path) -> None:
    """The packaged chart satisfies the app chart's declared dependency."""
    [dependency] = helm_python.dependency_list(app_chart)
    assert dependency["name"] == "acemq-sidecar"
    assert dependency["status"] == "ok"


def test_sidecar_joins_the_application_pod(app_chart: Path) -> None:
    """The app's pod gets the sidecar container and its volume next to its own."""
    manifests = _render_app(app_chart)
    pod = _shop(manifests)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["shop", "acemq-sidecar"]
    assert [v["name"] for v in pod["volumes"]] == ["cache", "acemq-sidecar-config"]
    container = sidecar_container(pod)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert "readinessProbe" not in container  # the app chart turned it off
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {item["name"]: item for item in container["env"]}
    assert env["AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "shop-rabbitmq", "key": "url"}


def test_no_standalone_deployment_when_included(app_chart: Path) -> None:
    """The dependency adds its route map and metrics Service, not a second Deployment."""
    kinds = sorted(m.kind for m in _render_app(app_chart))
    assert kinds == ["ConfigMap", "Deployment", "Service"]


def test_pod_mounts_the_config_map_the_dependency_renders(app_chart: Path) -> None:
    """The names computed in the app chart's scope match the objects of the dependency."""
    manifests = _render_app(app_chart)
    pod = _shop(manifests)["spec"]["template"]["spec"]
    config_map = only(manifests, "ConfigMap")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["acemq-sidecar-config"]["configMap"]["name"] == config_map.name
    route_map = yaml.safe_load(routes_yaml(manifests))
    assert route_map["routes"][0]["origin"] == "shop"
    # The sidecar chart's defaults reach the app chart's scope (coalesced by Helm).
    assert route_map["broker"]["prefetch"] == 512


def test_app_pod_rolls_on_a_route_map_change(app_chart: Path) -> None:
    """The checksum annotation in the app's pod follows the sidecar's route map."""

    def checksum(values: dict[str, Any] | None) -> str:
        metadata = _shop(_render_app(app_chart, values))["spec"]["template"]["metadata"]
        return str(metadata["annotations"]["checksum/acemq-sidecar-config"])

    before = checksum(None)
    values = read_values(APP_CHART / "values.yaml")
    values["acemq-sidecar"]["routeMap"]["routes"][0]["publishers"] = "acemq"
    assert checksum(values) != before


def test_app_pod_waits_for_the_sidecar_drain(app_chart: Path) -> None:
    """terminationGracePeriodSeconds derived from the sidecar's shutdown_grace_s."""
    pod = _shop(_render_app(app_chart))["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 20 + 10


def test_metrics_service_selects_the_app_pods(app_chart: Path) -> None:
    """service.selector points the sidecar's metrics Service at the app's pods."""
    manifests = _render_app(app_chart)
    service = only(manifests, "Service").body
    labels = _shop(manifests)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_app_manifests_validate_strictly(app_chart: Path, kube_version: str) -> None:
    """The combined pod is still a valid Deployment (unique names, known fields)."""
    for manifest in _render_app(app_chart):
        kubernetes_validate.validate(manifest.body, kube_version, strict=True)
    pod = _shop(_render_app(app_chart))["spec"]["template"]["spec"]
    ports = [p["name"] for c in pod["containers"] for p in c.get("ports", [])]
    assert len(ports) == len(set(ports))


def test_sidecar_values_are_checked_by_its_schema_from_the_app(app_chart: Path) -> None:
    """A wrong sidecar value in the app chart's values fails the app's install."""
    values = read_values(APP_CHART / "values.yaml")
    values["acemq-sidecar"]["routeMap"]["mode"] = "enforcing"
    with pytest.raises(helm_python.HelmValuesError, match="/routeMap/mode"):
        _render_app(app_chart, values)


def test_app_chart_lints(app_chart: Path) -> None:
    """`helm lint --strict --with-subcharts` on the app chart finds nothing."""
    report = helm_python.lint(app_chart, strict=True, with_subcharts=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
