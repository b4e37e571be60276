"""Autoscaling the standalone Deployment: an HPA on CPU/memory, or KEDA on queue depth.

With either on, the Deployment has no spec.replicas (the autoscaler owns it, and an upgrade
must not reset it); the ScaledObject has one rabbitmq trigger per route's staging queue and
reads the broker through a TriggerAuthentication on the sidecar's own Secret. The KEDA
objects are validated against KEDA's CRD schemas (tests/deploy/crds), the rest strictly
with kubernetes-validate.
"""

from __future__ import annotations

from typing import Any

import helm_python
import jsonschema  # type: ignore[import-untyped]  # no stubs in the test extra
import kubernetes_validate
import pytest

from tests.deploy.conftest import (
    FULL_VALUES,
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    Manifest,
    only,
    read_values,
    render,
    render_notes,
)
from tests.deploy.crd_schema import validate_custom

KEDA_CRDS = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}
CUSTOM = {"ServiceMonitor", "PrometheusRule", "PodMonitor", *KEDA_CRDS}

ROUTES = [
    {"name": "orders", "from": "staging.orders", "to": {"exchange": "orders"}},
    {
        "name": "ledger",
        "from": "staging.ledger",
        "to": {"exchange": "ledger"},
        "single_active_consumer": True,
    },
]


def _values(**changes: Any) -> dict[str, Any]:
    values = read_values(MINIMAL_VALUES) | changes
    values["routeMap"] = {"routes": ROUTES}
    return values


def _validate(manifests: list[Manifest]) -> None:
    for manifest in manifests:
        if manifest.kind in KEDA_CRDS:
            validate_custom(manifest.body, KEDA_CRDS[manifest.kind])
        elif manifest.kind not in CUSTOM:
            for kube_version in KUBE_VERSIONS:
                kubernetes_validate.validate(manifest.body, kube_version, strict=True)


def test_the_deployment_keeps_its_replicas_without_an_autoscaler() -> None:
    deployment = only(render(_values()), "Deployment").body
    assert deployment["spec"]["replicas"] == 2


def test_hpa_on_cpu_leaves_the_replicas_to_it() -> None:
    manifests = render(_values(autoscaling={"enabled": True, "minReplicas": 3}))
    _validate(manifests)
    deployment = only(manifests, "Deployment").body
    assert "replicas" not in deployment["spec"]
    hpa = only(manifests, "HorizontalPodAutoscaler").body
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    [metric] = hpa["spec"]["metrics"]
    assert metric["resource"] == {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": 80},
    }


def test_hpa_on_memory_too() -> None:
    values = _values(autoscaling={"enabled": True, "targetMemoryUtilizationPercentage": 70})
    hpa = only(render(values), "HorizontalPodAutoscaler").body
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu", "memory"]


def _keda(**changes: Any) -> list[Manifest]:
    return render(_values(keda={"enabled": True} | changes))


def test_keda_scales_on_each_staging_queue() -> None:
    manifests = _keda(minReplicaCount=0, queueLength=500)
    _validate(manifests)
    deployment = only(manifests, "Deployment").body
    assert "replicas" not in deployment["spec"]
    assert "HorizontalPodAutoscaler" not in [m.kind for m in manifests]  # KEDA makes its own
    scaled = only(manifests, "ScaledObject").body
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] == 10
    auth = only(manifests, "TriggerAuthentication").body
    triggers = scaled["spec"]["triggers"]
    assert [t["metadata"]["queueName"] for t in triggers] == ["staging.orders", "staging.ledger"]
    for trigger in triggers:
        assert trigger["type"] == "rabbitmq"
        assert trigger["metadata"]["mode"] == "QueueLength"
        assert trigger["metadata"]["value"] == "500"
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    # The broker URL from the sidecar's own Secret, never in the object.
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "host", "name": "acemq-broker", "key": "url"}
    ]
    assert "amqp://" not in str(scaled)
    assert "host" not in str(scaled["spec"]["triggers"])


def test_keda_with_tls_reads_the_same_files() -> None:
    values = _values(
        keda={"enabled": True},
        tls={
            "enabled": True,
            "secretName": "broker-client",
            "caSecretName": "ca",
            "caKey": "ca.crt",
        },
    )
    manifests = render(values)
    _validate(manifests)
    auth = only(manifests, "TriggerAuthentication").body["spec"]
    refs = {ref["parameter"]: (ref["name"], ref["key"]) for ref in auth["secretTargetRef"]}
    assert refs["cert"] == ("broker-client", "tls.crt")
    assert refs["key"] == ("broker-client", "tls.key")
    assert refs["ca"] == ("ca", "ca.crt")
    assert auth["env"] == [
        {"parameter": "tls", "name": "ACEMQ_KEDA_TLS", "containerName": "acemq-sidecar"}
    ]
    [container] = only(manifests, "Deployment").body["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["ACEMQ_KEDA_TLS"] == "enable"


def test_keda_with_operator_credentials_reads_their_keys() -> None:
    """Host and port from the container's variables (no login in them), the login by key."""
    values = _values(keda={"enabled": True})
    values["broker"] = {"urlSecret": {"name": ""}, "credentialsSecret": {"name": "rabbit-user"}}
    manifests = render(values)
    _validate(manifests)
    auth = only(manifests, "TriggerAuthentication").body["spec"]
    assert auth["env"] == [
        {"parameter": "host", "name": "ACEMQ_BROKER_ADDRESS", "containerName": "acemq-sidecar"}
    ]
    assert auth["secretTargetRef"] == [
        {"parameter": "username", "name": "rabbit-user", "key": "username"},
        {"parameter": "password", "name": "rabbit-user", "key": "password"},
    ]
    [container] = only(manifests, "Deployment").body["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["ACEMQ_BROKER_ADDRESS"]["value"] == (
        "amqp://$(ACEMQ_BROKER_HOST):$(ACEMQ_BROKER_PORT)/%2F"
    )
    names = [item["name"] for item in container["env"]]
    assert names.index("ACEMQ_BROKER_HOST") < names.index("ACEMQ_BROKER_ADDRESS")


def test_the_crd_validation_is_real() -> None:
    """A trigger value that is not a string, or a field KEDA does not know, is refused."""
    scaled = only(_keda(), "ScaledObject").body
    scaled["spec"]["triggers"][0]["metadata"]["value"] = 500
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(scaled, KEDA_CRDS["ScaledObject"])
    scaled = only(_keda(), "ScaledObject").body
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate_custom(scaled, KEDA_CRDS["ScaledObject"])


def test_notes_name_the_routes_that_gain_nothing_from_scale_out() -> None:
    notes = render_notes(_values(keda={"enabled": True}))
    assert "scaled by KEDA" in notes
    [line] = [line for line in notes.splitlines() if "single_active_consumer" in line]
    assert line.endswith(": ledger.")
    assert "orders" not in line


def test_full_values_still_validate_with_keda_on() -> None:
    values = read_values(FULL_VALUES) | {"keda": {"enabled": True}}
    _validate(render(values))


def _operator_values(**keda: Any) -> dict[str, Any]:
    values = _values(keda={"enabled": True} | keda)
    values["broker"] = {"urlSecret": {"name": ""}, "credentialsSecret": {"name": "rabbit-user"}}
    return values


def test_keda_over_http_counts_unacknowledged_messages() -> None:
    """The management API counts ready and unacked: a scale-down waits for work in hand."""
    manifests = render(_operator_values(protocol="http"))
    _validate(manifests)
    for trigger in only(manifests, "ScaledObject").body["spec"]["triggers"]:
        assert trigger["metadata"]["protocol"] == "http"
        assert trigger["metadata"]["excludeUnacknowledged"] == "false"
    [container] = only(manifests, "Deployment").body["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["ACEMQ_BROKER_ADDRESS"]["value"] == "http://$(ACEMQ_BROKER_HOST):15672/%2F"
    auth = only(manifests, "TriggerAuthentication").body["spec"]
    assert [ref["parameter"] for ref in auth["secretTargetRef"]] == ["username", "password"]
    values = _operator_values(protocol="http", excludeUnacknowledged=True)
    values["keda"]["management"] = {"scheme": "https", "port": 15671}
    values["broker"]["address"] = {"host": "rabbit.messaging.svc"}
    manifests = render(values)
    _validate(manifests)
    [trigger, _] = only(manifests, "ScaledObject").body["spec"]["triggers"]
    assert trigger["metadata"]["excludeUnacknowledged"] == "true"
    [container] = only(manifests, "Deployment").body["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["ACEMQ_BROKER_ADDRESS"]["value"] == "https://rabbit.messaging.svc:15671/%2F"


@pytest.mark.parametrize("kind", ["TriggerAuthentication", "ClusterTriggerAuthentication"])
def test_keda_with_an_existing_trigger_authentication(kind: str) -> None:
    """A scaler user of its own: the triggers name it, the chart renders no authentication."""
    values = _values(
        keda={
            "enabled": True,
            "protocol": "http",
            "authenticationRef": {"name": "rabbitmq-scaler", "kind": kind},
        }
    )
    manifests = render(values)
    _validate(manifests)
    assert "TriggerAuthentication" not in [m.kind for m in manifests]
    for trigger in only(manifests, "ScaledObject").body["spec"]["triggers"]:
        assert trigger["authenticationRef"] == {"name": "rabbitmq-scaler", "kind": kind}
    [container] = only(manifests, "Deployment").body["spec"]["template"]["spec"]["containers"]
    assert "ACEMQ_BROKER_ADDRESS" not in {item["name"] for item in container["env"]}


@pytest.mark.parametrize(
    ("keda", "message"),
    [
        ({"excludeUnacknowledged": True}, "only protocol http counts unacknowledged"),
        ({"protocol": "http"}, "keda.protocol http: broker.urlSecret holds an AMQP URL"),
    ],
    ids=["excludeUnacknowledged over amqp", "http with a URL Secret"],
)
def test_keda_settings_that_cannot_work_are_refused(keda: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(_values(keda={"enabled": True} | keda))
