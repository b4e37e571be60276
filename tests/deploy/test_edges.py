"""The chart's sharp edges, each rendered.

Labels, probes, the dashboard's scope, OpenShift, the NetworkPolicy, the helm test hook, and
the TargetAbsent alert where pods may rightly be absent.
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import (
    CHART,
    FULL_VALUES,
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    RELEASE,
    Manifest,
    only,
    read_values,
    render,
    render_templates,
    sidecar_container,
)

CUSTOM = {"ServiceMonitor", "PrometheusRule", "PodMonitor"}


def _validate(manifests: list[Manifest]) -> None:
    for manifest in manifests:
        if manifest.kind not in CUSTOM:
            for kube_version in KUBE_VERSIONS:
                kubernetes_validate.validate(manifest.body, kube_version, strict=True)


def _keys_written_twice(text: str) -> list[str]:
    """Keys given twice in one mapping of the rendered YAML (pyyaml keeps the last)."""
    twice: list[str] = []

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        keys = [loader.construct_object(key) for key, _ in node.value]
        twice.extend(str(key) for key in keys if keys.count(key) > 1)
        return loader.construct_mapping(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    list(yaml.load_all(text, Loader=Loader))
    return twice


def test_labels_naming_a_chart_label_are_written_once() -> None:
    """yaml.v3 and kustomize refuse a key given twice; the user's value wins, once."""
    values = read_values(FULL_VALUES) | {
        "commonLabels": {"app.kubernetes.io/part-of": "shop", "team": "payments"},
        "podLabels": {
            "app.kubernetes.io/part-of": "shop-pods",
            "acemq-sidecar/instance": "acemq-relay",
        },
    }
    values["serviceMonitor"] = values["serviceMonitor"] | {"labels": {"team": "observability"}}
    rendered = render_templates(values)
    for template, text in rendered.items():
        if not template.endswith("NOTES.txt"):
            assert _keys_written_twice(text) == [], template
    manifests = render(values)
    deployment = only(manifests, "Deployment").body
    assert deployment["metadata"]["labels"]["app.kubernetes.io/part-of"] == "shop"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/part-of"] == "shop-pods"
    assert only(manifests, "ServiceMonitor").body["metadata"]["labels"]["team"] == "observability"
    _validate(manifests)


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        ({"commonLabels": {"app.kubernetes.io/instance": "other"}}, "app.kubernetes.io/instance"),
        ({"podLabels": {"acemq-sidecar/instance": "other"}}, "acemq-sidecar/instance"),
    ],
)
def test_a_selector_label_cannot_change(labels: dict[str, Any], key: str) -> None:
    values = read_values(MINIMAL_VALUES) | labels
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(key)):
        render(values)


def test_readiness_enabled_null_is_unset_again() -> None:
    """A parent chart's `enabled: null` puts the shape's default back instead of failing."""
    values = read_values(MINIMAL_VALUES) | {"readinessProbe": {"enabled": None}}
    container = sidecar_container(
        only(render(values), "Deployment").body["spec"]["template"]["spec"]
    )
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def _dashboard_exprs(manifests: list[Manifest]) -> list[str]:
    [dashboard_map] = [
        m for m in manifests if m.kind == "ConfigMap" and "acemq-sidecar.json" in m.body["data"]
    ]
    dashboard = json.loads(dashboard_map.body["data"]["acemq-sidecar.json"])
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_follows_prometheus_rule_matchers() -> None:
    """Scraped by another job, every panel selects what the alerts select."""
    matchers = 'namespace="messaging", job="kubernetes-pods", app="relay"'
    values = read_values(FULL_VALUES)
    values["prometheusRule"] = values["prometheusRule"] | {"matchers": matchers}
    exprs = _dashboard_exprs(render(values))
    assert exprs
    for expr in exprs:
        assert matchers in expr, expr
        assert "$job" not in expr, expr
    assert all('job=~"$job"' in expr for expr in _dashboard_exprs(render(read_values(FULL_VALUES))))


def _target_absent(values: dict[str, Any]) -> str:
    rule = only(render(values), "PrometheusRule").body
    [expr] = [
        r["expr"]
        for group in rule["spec"]["groups"]
        for r in group["rules"]
        if r["alert"] == "AcemqSidecarTargetAbsent"
    ]
    return str(expr)


@pytest.mark.parametrize(
    ("changes", "always"),
    [
        ({}, True),
        ({"deployment": {"replicas": 0}}, False),
        ({"keda": {"enabled": True, "minReplicaCount": 0}}, False),
        ({"keda": {"enabled": True, "minReplicaCount": 1}}, True),
        ({"autoscaling": {"enabled": True}}, True),
        ({"deployment": {"enabled": False}}, False),
    ],
)
def test_target_absent_fires_on_no_target_only_where_a_pod_should_run(
    changes: dict[str, Any],
    always: bool,  # noqa: FBT001 - a parametrized case
) -> None:
    """A Job between runs, replicas 0 or KEDA at zero have no pod: no target is no alert."""
    values = read_values(FULL_VALUES) | changes
    expr = _target_absent(values)
    assert expr.startswith("absent(") is always, expr
    if not always:
        assert "count(up{" in expr


def test_openshift_arbitrary_uid_leaves_the_ids_out() -> None:
    values = read_values(FULL_VALUES) | {"openshift": {"arbitraryUid": True}}
    manifests = render(values)
    _validate(manifests)
    for manifest in manifests:
        if manifest.kind in ("Deployment", "Pod"):
            spec = manifest.body["spec"].get("template", {}).get("spec", manifest.body["spec"])
            for context in [
                spec["securityContext"],
                *(c["securityContext"] for c in spec["containers"]),
            ]:
                assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), manifest.kind
                assert context["runAsNonRoot"] is True
    pod = only(render(read_values(FULL_VALUES)), "Deployment").body["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001


def test_network_policy_lets_in_the_metrics_port_and_out_dns_and_the_broker() -> None:
    broker = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}}]
    values = read_values(FULL_VALUES) | {"networkPolicy": {"enabled": True, "brokerTo": broker}}
    manifests = render(values)
    _validate(manifests)
    policy = only(manifests, "NetworkPolicy").body["spec"]
    deployment = only(manifests, "Deployment").body
    assert policy["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    [ingress] = policy["ingress"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert ingress["ports"] == [{"port": container["ports"][0]["containerPort"], "protocol": "TCP"}]
    dns, amqp = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert [p["port"] for p in amqp["ports"]] == [5672, 5671]
    assert amqp["to"] == broker
    assert "NetworkPolicy" not in [m.kind for m in render(read_values(FULL_VALUES))]


def test_helm_test_asks_the_metrics_service_for_readyz() -> None:
    manifests = render(read_values(FULL_VALUES))
    _validate(manifests)
    pod = only(manifests, "Pod").body
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = only(manifests, "Service").body
    [container] = pod["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    assert container["command"][-1] == (
        f"http://{service['metadata']['name']}.messaging.svc:{service['spec']['ports'][0]['port']}/readyz"
    )
    assert (
        container["image"]
        == sidecar_container(only(manifests, "Deployment").body["spec"]["template"]["spec"])[
            "image"
        ]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    values = read_values(FULL_VALUES) | {"helmTest": {"enabled": False}}
    assert "Pod" not in [m.kind for m in render(values)]


def test_helm_lint_is_clean_with_the_new_objects_on() -> None:
    values = read_values(FULL_VALUES) | {
        "networkPolicy": {"enabled": True},
        "keda": {"enabled": True},
        "openshift": {"arbitraryUid": True},
    }
    report = helm_python.lint(CHART, values, strict=True)
    assert not [m for m in report["messages"] if m["severity"] >= 2], report
    assert RELEASE
