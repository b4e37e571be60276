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
    LATEST_KUBE,
    NAMESPACE,
    NATIVE_SIDECAR_KUBE,
    OLDEST_KUBE,
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
    assert kinds == ["ConfigMap", "Deployment", "Pod", "Service"]  # Pod: the helm test hook


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


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def _defaults(app: Path, **sidecar: Any) -> dict[str, Any]:
    """Put the sidecar keys the app chart sets for itself back to the chart's defaults.

    The copied app chart's values.yaml is rewritten without readinessProbe and service
    (so the sidecar chart's defaults apply); the returned values merge ``sidecar`` in.
    """
    values = read_values(APP_CHART / "values.yaml")
    del values["acemq-sidecar"]["readinessProbe"]
    del values["acemq-sidecar"]["service"]
    (app / "values.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
    return {"acemq-sidecar": sidecar}


def _all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _sidecar_anywhere(pod: dict[str, Any]) -> dict[str, Any]:
    [found] = [c for c in _all_containers(pod) if c["name"] == "acemq-sidecar"]
    return found


@pytest.mark.parametrize("shape", ["classic", "native"])
def test_sidecar_shape_defaults_keep_the_application_ready(app_chart: Path, shape: str) -> None:
    """No readiness probe in the application's pod unless asked.

    A broker outage must not pull the application out of its own Service.
    """
    values = _defaults(app_chart, sidecar={"native": shape == "native"})
    pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
    container = _sidecar_anywhere(pod)
    assert "readinessProbe" not in container
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_readiness_can_be_asked_for_in_the_application_pod(app_chart: Path) -> None:
    """readinessProbe.enabled: true applies to every shape."""
    values = _defaults(app_chart, readinessProbe={"enabled": True})
    pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
    assert sidecar_container(pod)["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("shape", ["classic", "native"])
def test_monitoring_the_sidecar_shape_scrapes_the_application_pods(
    app_chart: Path, shape: str
) -> None:
    """The metrics Service and the PodMonitor select the pods that run the sidecar.

    Both find them by the acemq-sidecar.podLabels label, on a port the sidecar has.
    """
    values = _defaults(
        app_chart,
        sidecar={"native": shape == "native"},
        podMonitor={"enabled": True},
        prometheusRule={"enabled": True},
    )
    manifests = _render_app(app_chart, values)
    template = _shop(manifests)["spec"]["template"]
    labels = template["metadata"]["labels"]
    [port] = _sidecar_anywhere(template["spec"])["ports"]
    service = only(manifests, "Service").body
    assert _selects(service["spec"]["selector"], labels), (service["spec"]["selector"], labels)
    # By number: a Service resolves no named port of a native sidecar before 1.32.
    assert service["spec"]["ports"][0]["targetPort"] == port["containerPort"]
    monitor = only(manifests, "PodMonitor").body
    assert _selects(monitor["spec"]["selector"]["matchLabels"], labels)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == port["name"]
    assert endpoint["path"] == "/metrics"
    # The Deployment's selector is the app's own: the sidecar's label is not in it.
    selector = _shop(manifests)["spec"]["selector"]["matchLabels"]
    assert "acemq-sidecar/instance" not in selector


def test_pod_monitor_selector_can_be_replaced(app_chart: Path) -> None:
    """podMonitor.selector: pods found by the application's own labels instead."""
    values = _defaults(
        app_chart, podMonitor={"enabled": True, "selector": {"app.kubernetes.io/name": "shop"}}
    )
    monitor = only(_render_app(app_chart, values), "PodMonitor").body
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "shop"}


def test_native_sidecar_is_an_init_container_that_keeps_running(app_chart: Path) -> None:
    """restartPolicy: Always in initContainers, a startup probe, and no classic copy."""
    values = _defaults(app_chart, sidecar={"native": True})
    pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["shop"]
    [init] = pod["initContainers"]
    assert init["name"] == "acemq-sidecar"
    assert init["restartPolicy"] == "Always"
    assert init["startupProbe"]["httpGet"] == {"path": "/healthz", "port": init["ports"][0]["name"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["name"] for v in pod["volumes"]] == ["cache", "acemq-sidecar-config"]


def test_native_sidecar_has_its_startup_probe_even_when_switched_off(app_chart: Path) -> None:
    """Without it the kubelet would start the application before the sidecar serves."""
    values = _defaults(app_chart, sidecar={"native": True}, startupProbe={"enabled": False})
    pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["startupProbe"]["httpGet"]["path"] == "/healthz"
    values = _defaults(app_chart, startupProbe={"enabled": False})
    pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
    assert "startupProbe" not in sidecar_container(pod)


@pytest.mark.parametrize("shape", ["classic", "native"])
@pytest.mark.parametrize("kube_version", [NATIVE_SIDECAR_KUBE, LATEST_KUBE])
def test_both_shapes_validate_strictly(app_chart: Path, shape: str, kube_version: str) -> None:
    """Each shape is a valid Deployment at 1.29 and at the newest Kubernetes known."""
    values = _defaults(app_chart, sidecar={"native": shape == "native"})
    for manifest in _render_app(app_chart, values):
        kubernetes_validate.validate(manifest.body, kube_version, strict=True)


def test_native_shape_is_refused_by_kubernetes_before_1_29(app_chart: Path) -> None:
    """The validation is real: a container restartPolicy is unknown to 1.27's API."""
    values = _defaults(app_chart, sidecar={"native": True})
    deployment = only(_render_app(app_chart, values), "Deployment").body
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(deployment, OLDEST_KUBE, strict=True)


def test_native_grace_covers_the_application_then_the_sidecar(app_chart: Path) -> None:
    """The kubelet stops a native sidecar only after the app exited, from one budget.

    So the pod's grace is the app's time plus the sidecar's drain (shutdown_grace_s 20 + 10
    + 5); the classic shape, where all get SIGTERM at once, takes the larger of the two.
    """
    drain = 20 + 10 + 5
    for native, app_grace, expected in (
        (True, 30, 30 + drain),
        (False, 30, drain),
        (False, 60, 60),
    ):
        values = _defaults(
            app_chart, sidecar={"native": native, "appTerminationGracePeriodSeconds": app_grace}
        )
        pod = _shop(_render_app(app_chart, values))["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == expected, (native, app_grace)
    values = _defaults(app_chart, sidecar={"native": True}, terminationGracePeriodSeconds=drain)
    with pytest.raises(helm_python.HelmRenderError, match=f"at least {30 + drain}"):
        _render_app(app_chart, values)


def test_native_shape_on_1_28_is_refused_with_the_charts_message(app_chart: Path) -> None:
    """Not the API server's 'unknown field restartPolicy': the render says what to do."""
    values = _defaults(app_chart, sidecar={"native": True})
    with pytest.raises(helm_python.HelmRenderError, match=r"needs Kubernetes 1\.29 or newer"):
        render(values, chart=app_chart, kube_version="1.28.9")
    assert render(values, chart=app_chart, kube_version=NATIVE_SIDECAR_KUBE)
    classic = _defaults(app_chart, sidecar={"native": False})
    assert render(classic, chart=app_chart, kube_version="1.28.9")
