"""The chart's standalone rendering: valid Kubernetes objects, hardened pods, a sound route map."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from sidecar.cli import build_parser
from sidecar.routemap.model import DEFAULT_MAX_IN_FLIGHT_BYTES
from sidecar.service import SHUTDOWN_SLACK_S
from tests.deploy.conftest import (
    CHART,
    FULL_VALUES,
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    REPO,
    Manifest,
    only,
    read_values,
    render,
    render_notes,
    routes_yaml,
    sidecar_container,
)

VALUES_FILES = pytest.mark.parametrize(
    "values_file", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"]
)

# Kinds kubernetes-validate has no schema for; test_monitoring.py checks them field by field.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _pod_spec(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    return spec


@VALUES_FILES
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_validates_strictly(values_file: Path, kube_version: str) -> None:
    """Each object matches its Kubernetes schema, unknown fields refused (kubectl --strict)."""
    manifests = render(read_values(values_file))
    assert manifests
    for manifest in manifests:
        if manifest.kind in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(manifest.body, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(part) for part in e.path)
            pytest.fail(
                f"{manifest.template}: {manifest.kind} {manifest.name}: {path}: {e.message}"
            )


def test_minimal_values_render_the_standalone_objects(minimal_manifests: list[Manifest]) -> None:
    """Defaults: a Deployment, its account, disruption budget, route map and metrics Service.

    And the `helm test` Pod (a hook: `helm install` does not create it).
    """
    assert sorted(m.kind for m in minimal_manifests) == [
        "ConfigMap",
        "Deployment",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]


def test_full_values_render_every_object(full_manifests: list[Manifest]) -> None:
    """Every toggle on: the dashboard, the ServiceMonitor and the PrometheusRule appear."""
    assert sorted(m.kind for m in full_manifests) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Pod",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_chart_defaults_alone_are_refused() -> None:
    """Without a route the install fails at the schema; without a broker Secret, at render."""
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render(None)
    assert "/routeMap/routes" in str(caught.value)
    values = read_values(MINIMAL_VALUES)
    del values["broker"]
    with pytest.raises(helm_python.HelmRenderError) as refused:
        render(values)
    assert "broker: name the existing Secret: broker.urlSecret.name" in str(refused.value)
    assert "broker.credentialsSecret.name" in str(refused.value)


@VALUES_FILES
def test_helm_lint_is_clean(values_file: Path) -> None:
    """`helm lint --strict` reports no warning or error (an icon is only recommended)."""
    report = helm_python.lint(CHART, read_values(values_file), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


@VALUES_FILES
def test_container_is_locked_down(values_file: Path) -> None:
    """Non-root, read-only root filesystem, no privilege escalation, no capabilities."""
    manifests = render(read_values(values_file))
    pod = _pod_spec(manifests)
    context = sidecar_container(pod)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert isinstance(context["runAsUser"], int)
    assert context["runAsUser"] > 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "add" not in context["capabilities"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False


@VALUES_FILES
def test_probes_hit_the_sidecar_endpoints_on_its_listen_port(values_file: Path) -> None:
    """Liveness on /healthz, readiness on /readyz, on the port of routeMap.http.listen."""
    values = read_values(values_file)
    manifests = render(values)
    container = sidecar_container(_pod_spec(manifests))
    listen = values["routeMap"].get("http", {}).get("listen", "0.0.0.0:9090")
    port = int(listen.rpartition(":")[2])
    [container_port] = container["ports"]
    assert container_port["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": container_port["name"],
    }
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": container_port["name"],
    }
    service = only(manifests, "Service").body
    assert service["spec"]["ports"][0]["targetPort"] == port


@VALUES_FILES
def test_broker_url_comes_from_the_secret_never_the_config_map(values_file: Path) -> None:
    """The route map says ${AMQP_URL}; the container reads it from the named Secret."""
    values = read_values(values_file)
    manifests = render(values)
    route_map = yaml.safe_load(routes_yaml(manifests))
    assert route_map["broker"]["url"] == "${AMQP_URL}"
    for manifest in manifests:
        if manifest.kind == "ConfigMap":
            assert "amqp://" not in str(manifest.body)
            assert "amqps://" not in str(manifest.body)
    env = {item["name"]: item for item in sidecar_container(_pod_spec(manifests))["env"]}
    secret = values["broker"]["urlSecret"]
    assert env["AMQP_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["name"],
        "key": secret.get("key", "url"),
    }


def test_tls_files_are_mounted_where_the_route_map_looks(full_manifests: list[Manifest]) -> None:
    """broker.tls paths name the files the TLS volume projects from the Secret's keys."""
    route_map = yaml.safe_load(routes_yaml(full_manifests))
    pod = _pod_spec(full_manifests)
    mounts = {m["name"]: m for m in sidecar_container(pod)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    tls_dir = mounts["acemq-sidecar-tls"]["mountPath"]
    assert mounts["acemq-sidecar-tls"]["readOnly"] is True
    projected = {
        item["path"]: (source["secret"]["name"], item["key"])
        for source in volumes["acemq-sidecar-tls"]["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    for field, key in {"ca_file": "ca.crt", "cert_file": "tls.crt", "key_file": "tls.key"}.items():
        directory, _, name = route_map["broker"]["tls"][field].rpartition("/")
        assert directory == tls_dir
        assert projected[name] == ("rabbitmq-client-tls", key)


@VALUES_FILES
def test_config_map_is_mounted_where_the_container_reads_it(values_file: Path) -> None:
    """The container's --config is routes.yaml in the mounted ConfigMap's directory."""
    manifests = render(read_values(values_file))
    pod = _pod_spec(manifests)
    container = sidecar_container(pod)
    args = build_parser().parse_args(["run", *container["args"]])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_map = next(
        m for m in manifests if m.kind == "ConfigMap" and "routes.yaml" in m.body["data"]
    )
    assert volumes["acemq-sidecar-config"]["configMap"]["name"] == config_map.name
    # A directory mount (no subPath), so that a changed ConfigMap reaches the running file.
    assert "subPath" not in mounts["acemq-sidecar-config"]
    assert Path(args.config) == Path(mounts["acemq-sidecar-config"]["mountPath"]) / "routes.yaml"


def _self_signed(directory: Path) -> None:
    """Write tls.crt, tls.key (a fresh self-signed P-256 certificate) and ca.crt (the same)."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the TLS files a pod mounts"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=acemq-sidecar",
            "-days",
            "2",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    shutil.copyfile(directory / "tls.crt", directory / "ca.crt")


@VALUES_FILES
def test_rendered_route_map_passes_acemq_sidecar_check(values_file: Path, tmp_path: Path) -> None:
    """`acemq-sidecar check` accepts the route map the chart renders, as the pod would see it.

    The TLS files the pod would mount are made here (a self-signed certificate, its key, and
    itself as the CA), at the rendered paths moved under tmp_path.
    """
    values = read_values(values_file)
    text = routes_yaml(render(values))
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    if values.get("tls", {}).get("enabled"):
        _self_signed(tls_dir)
    route_map = tmp_path / "routes.yaml"
    route_map.write_text(text.replace("/etc/acemq-sidecar-tls", str(tls_dir)), encoding="utf-8")
    scheme = "amqps" if values.get("tls", {}).get("enabled") else "amqp"
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "check", str(route_map)],
        env={**os.environ, "AMQP_URL": f"{scheme}://user:secret@rabbitmq:5672/vhost"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    routes = values["routeMap"]["routes"]
    assert f"routes ({len(routes)}):" in result.stdout
    assert "secret" not in result.stdout  # the password is masked


def test_yaml_ambiguous_strings_stay_strings(full_manifests: list[Manifest]) -> None:
    """A queue "1:20" or an origin "yes" must not come back as a number or a boolean."""
    route = next(
        r for r in yaml.safe_load(routes_yaml(full_manifests))["routes"] if r["name"] == "legacy"
    )
    assert route["from"] == "1:20"
    assert route["origin"] == "yes"
    assert route["to"]["routing_key"] == "0x1F"


@pytest.mark.parametrize(("grace_s", "expected"), [(None, 30), (0, 0), (20.5, 20.5), (120, 120)])
def test_termination_grace_covers_the_sidecar_shutdown(
    grace_s: float | None, expected: float
) -> None:
    """Derived from shutdown_grace_s plus the sidecar's closing slack, with a margin."""
    values = read_values(MINIMAL_VALUES)
    if grace_s is not None:
        values["routeMap"]["shutdown_grace_s"] = grace_s
    pod = _pod_spec(render(values))
    route_map_grace = yaml.safe_load(routes_yaml(render(values))).get("shutdown_grace_s")
    assert route_map_grace == expected
    assert pod["terminationGracePeriodSeconds"] >= math.ceil(expected + SHUTDOWN_SLACK_S) + 1


MEBI = 2**20
SIDECAR_ITSELF = 64 * MEBI  # the sidecar with nothing in flight: 43 MiB measured
BROKER_MAX_MESSAGE_SIZE = 128 * MEBI  # RabbitMQ 3.10's default max_message_size


def test_the_default_memory_limit_holds_the_default_byte_budget(
    minimal_manifests: list[Manifest],
) -> None:
    """Each route holds its budget plus one message of the broker's largest: within the limit.

    docs/memory.md gives the rule (64Mi + routes x (max_in_flight_bytes + max_message_size)).
    """
    limit = sidecar_container(_pod_spec(minimal_manifests))["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    route_map = yaml.safe_load(routes_yaml(minimal_manifests))
    budget = route_map.get("broker", {}).get("max_in_flight_bytes", DEFAULT_MAX_IN_FLIGHT_BYTES)
    needed = len(route_map["routes"]) * (budget + BROKER_MAX_MESSAGE_SIZE) + SIDECAR_ITSELF
    assert int(limit.removesuffix("Mi")) * MEBI >= needed


def test_explicit_termination_grace_is_kept_when_long_enough() -> None:
    """An explicit value at or above the minimum is used as given."""
    values = read_values(FULL_VALUES)
    assert _pod_spec(render(values))["terminationGracePeriodSeconds"] == 60


def test_explicit_termination_grace_too_short_is_refused() -> None:
    """The kubelet would SIGKILL the sidecar mid-drain: rendering fails and says why."""
    values = read_values(MINIMAL_VALUES)
    values["terminationGracePeriodSeconds"] = 30  # shutdown_grace_s defaults to 30
    with pytest.raises(helm_python.HelmRenderError, match="terminationGracePeriodSeconds"):
        render(values)


def test_changed_route_map_rolls_the_pods() -> None:
    """The pod template carries a checksum of the route map, so a change rolls the pods."""
    values = read_values(MINIMAL_VALUES)

    def checksum(values: dict[str, Any]) -> str:
        annotations = only(render(values), "Deployment").body["spec"]["template"]["metadata"]
        return str(annotations["annotations"]["checksum/acemq-sidecar-config"])

    before = checksum(values)
    assert before == checksum(read_values(MINIMAL_VALUES))
    values["routeMap"]["routes"][0]["publishers"] = "apps"
    assert checksum(values) != before


def test_replicas_are_competing_consumers() -> None:
    """deployment.replicas sets the number of consumers; disabling it drops the Deployment."""
    values = read_values(MINIMAL_VALUES)
    values["deployment"] = {"enabled": True, "replicas": 4}
    assert only(render(values), "Deployment").body["spec"]["replicas"] == 4
    values["deployment"] = {"enabled": False}
    manifests = render(values)
    assert "Deployment" not in {m.kind for m in manifests}
    assert "ConfigMap" in {m.kind for m in manifests}  # still there for including charts


def test_disruption_budget_covers_the_replicas_and_follows_its_values() -> None:
    """One replica at a time by default, minAvailable when set, none without a Deployment."""
    values = read_values(MINIMAL_VALUES)
    manifests = render(values)
    budget = only(manifests, "PodDisruptionBudget").body["spec"]
    deployment = only(manifests, "Deployment").body["spec"]
    assert budget["selector"] == deployment["selector"]
    assert budget["maxUnavailable"] == 1
    assert "minAvailable" not in budget

    values["deployment"] = {"enabled": True, "podDisruptionBudget": {"minAvailable": "50%"}}
    budget = only(render(values), "PodDisruptionBudget").body["spec"]
    assert budget == {
        "minAvailable": "50%",
        "selector": deployment["selector"],
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }

    for deployment_values in (
        {"enabled": True, "podDisruptionBudget": {"enabled": False}},
        {"enabled": False},
    ):
        values["deployment"] = deployment_values
        assert "PodDisruptionBudget" not in {m.kind for m in render(values)}


def test_image_tag_follows_the_release() -> None:
    """values image.tag, Chart appVersion and the package version are one version."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert chart["apiVersion"] == "v2"
    assert values["image"]["tag"] == chart["appVersion"] == project["version"]


def test_image_digest_pins_the_tag() -> None:
    """repository:tag@digest: the digest is what the pod pulls, the tag stays readable."""
    values = read_values(MINIMAL_VALUES)
    digest = "sha256:" + "ab" * 32
    values["image"] = {"digest": digest}
    image = sidecar_container(_pod_spec(render(values)))["image"]
    assert image == f"acemq-sidecar:0.1.0@{digest}"


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        ("registry.example.com", "registry.example.com/acemq-sidecar:0.1.0"),
        ("registry.example.com:5000/", "registry.example.com:5000/acemq-sidecar:0.1.0"),
        ("", "acemq-sidecar:0.1.0"),
    ],
)
def test_image_registry_goes_before_the_repository(registry: str, expected: str) -> None:
    values = read_values(MINIMAL_VALUES)
    values["image"] = {"registry": registry.rstrip("/")}
    manifests = render(values)
    assert sidecar_container(_pod_spec(manifests))["image"] == expected
    [test_pod] = [m for m in manifests if m.kind == "Pod"]
    assert test_pod.body["spec"]["containers"][0]["image"] == expected


def test_notes_name_the_routes_and_the_secret() -> None:
    """NOTES.txt tells the installer what was set up and how to look at it."""
    notes = render_notes(read_values(FULL_VALUES))
    assert "orders: staging.orders -> orders" in notes
    assert "Secret rabbitmq-acemq, key amqps-url" in notes
    assert "client certificate from Secret rabbitmq-client-tls" in notes
    assert "key ca.crt of Secret rabbitmq-client-tls" in notes
    assert "rollout status deployment/acemq-relay" in notes
    assert "ServiceMonitor acemq-relay scrapes that Service (job acemq-relay-metrics)" in notes
    assert "WARNING" not in notes


def test_notes_for_the_sidecar_shape_name_the_templates_and_what_is_scraped() -> None:
    """No Deployment: the templates to include and the label the monitors select."""
    values = read_values(MINIMAL_VALUES)
    values |= {"deployment": {"enabled": False}, "sidecar": {"native": True}}
    values |= {"prometheusRule": {"enabled": True}}
    notes = render_notes(values)
    assert "acemq-sidecar.initContainer (initContainers" in notes
    assert "acemq-sidecar.podLabels" in notes
    assert "selects pods labelled acemq-sidecar/instance=acemq-acemq-sidecar" in notes
    assert "the system trust store" not in notes  # no TLS
    # Alerts on, nothing that gives the series the release's job: say so.
    assert "WARNING: no ServiceMonitor or PodMonitor is enabled" in notes


def test_disruption_budget_lets_unready_pods_be_evicted() -> None:
    """A broker outage makes every replica NotReady at once; a drain must still evict them."""
    values = read_values(MINIMAL_VALUES)
    budget = only(render(values), "PodDisruptionBudget").body["spec"]
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    values["deployment"] = {
        "podDisruptionBudget": {"unhealthyPodEvictionPolicy": "IfHealthyBudget"}
    }
    budget = only(render(values), "PodDisruptionBudget").body["spec"]
    assert budget["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"


def test_common_keys_take_effect(full_manifests: list[Manifest]) -> None:
    """commonLabels/Annotations on every object; the pod keys where Kubernetes reads them."""
    for manifest in full_manifests:
        metadata = manifest.body["metadata"]
        assert metadata["labels"]["team"] == "platform", manifest.kind
        assert metadata["annotations"]["example.com/owner"] == "platform", manifest.kind
    deployment = only(full_manifests, "Deployment").body
    template = deployment["spec"]["template"]
    pod = template["spec"]
    container = sidecar_container(pod)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert template["metadata"]["labels"]["team"] == "platform"
    assert template["metadata"]["labels"]["tier"] == "messaging"
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]
    assert template["metadata"]["annotations"]["example.com/scrape"] == "false"
    assert pod["priorityClassName"] == "high"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert container["envFrom"] == [{"configMapRef": {"name": "acemq-sidecar-env"}}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["corporate-ca"] == "/etc/ssl/corporate"
    assert {"name": "corporate-ca", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
    assert container["startupProbe"]["periodSeconds"] == 2
    account = only(full_manifests, "ServiceAccount").body
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "acemq-sidecar"
    assert account["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False


def test_an_existing_service_account_is_used_not_created() -> None:
    """serviceAccount.create false: the named account, or the namespace's default one."""
    values = read_values(MINIMAL_VALUES)
    values["serviceAccount"] = {"create": False, "name": "shared"}
    manifests = render(values)
    assert "ServiceAccount" not in {m.kind for m in manifests}
    assert _pod_spec(manifests)["serviceAccountName"] == "shared"
    values["serviceAccount"] = {"create": False}
    assert "serviceAccountName" not in _pod_spec(render(values))


def test_a_rotated_broker_secret_rolls_the_pods() -> None:
    """checksum/acemq-broker-secret follows the Secret's name, key and revision.

    `helm template` cannot read the cluster (lookup is empty there), so the revision is
    what a GitOps rotation changes; the annotation shows a hash, never the Secret.
    """

    def checksum(values: dict[str, Any]) -> str:
        metadata = only(render(values), "Deployment").body["spec"]["template"]["metadata"]
        return str(metadata["annotations"]["checksum/acemq-broker-secret"])

    values = read_values(MINIMAL_VALUES)
    before = checksum(values)
    assert before == checksum(read_values(MINIMAL_VALUES))
    assert len(before) == 64
    values["broker"]["urlSecret"]["revision"] = "2025-06-01"
    rotated = checksum(values)
    assert rotated != before
    values["broker"]["urlSecret"]["revision"] = "2025-09-01"
    assert checksum(values) not in {before, rotated}
    values = read_values(MINIMAL_VALUES)
    values["broker"]["urlSecret"]["name"] = "acemq-broker-v2"
    assert checksum(values) != before
