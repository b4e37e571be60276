"""The `helm test` Pod: labels of its own, let through the NetworkPolicy, in every shape.

No selector the chart renders (the Deployment's, the metrics Service's, the
PodDisruptionBudget's, the NetworkPolicy's, the PodMonitor's) selects the test Pod, so it is
never a Service endpoint, never counted by the budget and never held to the sidecar's
egress; with a NetworkPolicy that limits who may reach the metrics port, the test Pod is
one of those let in. Its command, run against a real sidecar, is in
tests/e2e/test_chart_login_only_user.py.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.deploy.conftest import (
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    NAMESPACE,
    Manifest,
    only,
    read_values,
    render,
)

PROMETHEUS = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]

SHAPES: dict[str, dict[str, Any]] = {
    "standalone": {},
    "standalone with a NetworkPolicy": {"networkPolicy": {"enabled": True}},
    "NetworkPolicy limiting the metrics port": {
        "networkPolicy": {"enabled": True, "metricsFrom": PROMETHEUS}
    },
    "keda": {"keda": {"enabled": True, "minReplicaCount": 0}},
    "classic sidecar": {"deployment": {"enabled": False}, "podMonitor": {"enabled": True}},
    "native sidecar": {
        "deployment": {"enabled": False},
        "sidecar": {"native": True},
        "podMonitor": {"enabled": True},
    },
    "common labels": {
        "commonLabels": {"team": "platform", "app.kubernetes.io/name": "acemq-sidecar"},
        "networkPolicy": {"enabled": True},
    },
}


def _render(changes: dict[str, Any]) -> list[Manifest]:
    return render(read_values(MINIMAL_VALUES) | changes, kube_version="1.31.0")


def _selectors(manifests: list[Manifest]) -> list[tuple[str, dict[str, str]]]:
    """Every label selector of the rendered objects (matchLabels, or a Service's selector)."""
    found = []
    for manifest in manifests:
        spec = manifest.body.get("spec", {})
        if manifest.kind == "Service":
            found.append((manifest.kind, spec["selector"]))
        elif manifest.kind in ("Deployment", "PodDisruptionBudget", "PodMonitor"):
            found.append((manifest.kind, spec["selector"]["matchLabels"]))
        elif manifest.kind == "NetworkPolicy":
            found.append((manifest.kind, spec["podSelector"]["matchLabels"]))
    return found


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("changes", SHAPES.values(), ids=SHAPES.keys())
def test_no_selector_of_the_chart_selects_the_test_pod(changes: dict[str, Any]) -> None:
    manifests = _render(changes)
    test_pod = only(manifests, "Pod").body
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    labels = test_pod["metadata"]["labels"]
    selectors = _selectors(manifests)
    assert selectors
    for kind, selector in selectors:
        assert not _selects(selector, labels), f"the {kind}'s selector {selector} selects it"
    assert labels["app.kubernetes.io/component"] == "helm-test"
    for manifest in manifests:
        if manifest.kind not in ("PodMonitor", "ServiceMonitor", "PrometheusRule") and (
            manifest.kind not in ("ScaledObject", "TriggerAuthentication")
        ):
            for kube_version in KUBE_VERSIONS:
                kubernetes_validate.validate(manifest.body, kube_version, strict=True)


@pytest.mark.parametrize("changes", SHAPES.values(), ids=SHAPES.keys())
def test_the_test_pod_asks_the_service_that_selects_the_sidecar(changes: dict[str, Any]) -> None:
    """Its URL is the metrics Service's, whose selector matches the sidecar's pods."""
    manifests = _render(changes)
    service = only(manifests, "Service").body
    [container] = only(manifests, "Pod").body["spec"]["containers"]
    name, port = service["metadata"]["name"], service["spec"]["ports"][0]["port"]
    assert container["command"][-1] == f"http://{name}.{NAMESPACE}.svc:{port}/readyz"
    deployments = [m for m in manifests if m.kind == "Deployment"]
    if deployments:
        pod_labels = deployments[0].body["spec"]["template"]["metadata"]["labels"]
    else:  # the application's pods carry acemq-sidecar.podLabels
        pod_labels = {"acemq-sidecar/instance": "acemq-acemq-sidecar", "app": "shop"}
    assert _selects(service["spec"]["selector"], pod_labels)


def _peer_lets_in(peer: dict[str, Any], labels: dict[str, str]) -> bool:
    """A NetworkPolicyPeer of the release's namespace that admits a pod with ``labels``."""
    if set(peer) != {"podSelector"}:
        return False
    selector = peer["podSelector"]
    return set(selector) == {"matchLabels"} and _selects(selector["matchLabels"], labels)


def test_the_network_policy_lets_the_test_pod_reach_the_metrics_port() -> None:
    manifests = _render(SHAPES["NetworkPolicy limiting the metrics port"])
    labels = only(manifests, "Pod").body["metadata"]["labels"]
    policy = only(manifests, "NetworkPolicy").body["spec"]
    [ingress] = policy["ingress"]
    assert PROMETHEUS[0] in ingress["from"]
    assert any(_peer_lets_in(peer, labels) for peer in ingress["from"]), ingress
    service = only(manifests, "Service").body
    assert ingress["ports"] == [
        {"port": service["spec"]["ports"][0]["targetPort"], "protocol": "TCP"}
    ]


def test_without_metrics_from_anyone_may_reach_the_metrics_port() -> None:
    policy = only(_render(SHAPES["standalone with a NetworkPolicy"]), "NetworkPolicy").body
    [ingress] = policy["spec"]["ingress"]
    assert "from" not in ingress


def test_more_labels_for_the_test_pod_but_no_selector_label() -> None:
    manifests = _render({"helmTest": {"enabled": True, "podLabels": {"egress": "allowed"}}})
    assert only(manifests, "Pod").body["metadata"]["labels"]["egress"] == "allowed"
    with pytest.raises(helm_python.HelmRenderError, match=r"helmTest\.podLabels"):
        _render(
            {"helmTest": {"enabled": True, "podLabels": {"app.kubernetes.io/instance": "acemq"}}}
        )
