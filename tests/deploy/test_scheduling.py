"""Replicas spread by default: a soft pod anti-affinity whose selector the chart fills in."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.conftest import (
    FULL_VALUES,
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    only,
    read_values,
    render,
)


def _deployment(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    manifests = render(read_values(MINIMAL_VALUES) | (changes or {}))
    body: dict[str, Any] = only(manifests, "Deployment").body
    for kube_version in KUBE_VERSIONS:
        kubernetes_validate.validate(body, kube_version, strict=True)
    return body


def test_replicas_prefer_different_nodes_by_default() -> None:
    deployment = _deployment()
    selector = deployment["spec"]["selector"]["matchLabels"]
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    [preferred] = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == 100
    term = preferred["podAffinityTerm"]
    assert term == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    # The term selects this release's replicas, and only them.
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/instance"] == "acemq"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"podAntiAffinityPreset": "hard"}, "requiredDuringSchedulingIgnoredDuringExecution"),
        (
            {"podAntiAffinityTopologyKey": "topology.kubernetes.io/zone"},
            "preferredDuringSchedulingIgnoredDuringExecution",
        ),
    ],
)
def test_the_preset_and_its_topology_key(changes: dict[str, Any], expected: str) -> None:
    anti = _deployment(changes)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(anti) == [expected]
    [term] = anti[expected]
    term = term.get("podAffinityTerm", term)
    assert term["topologyKey"] == changes.get(
        "podAntiAffinityTopologyKey", "kubernetes.io/hostname"
    )


def test_no_preset_and_an_affinity_of_ones_own() -> None:
    assert "affinity" not in _deployment({"podAntiAffinityPreset": ""})["spec"]["template"]["spec"]
    node = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["messaging"]}
                        ]
                    }
                ]
            }
        }
    }
    affinity = _deployment({"affinity": node})["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in affinity["podAntiAffinity"]
    # ci/full-values.yaml sets podAntiAffinity itself: it is kept as given.
    full = only(render(read_values(FULL_VALUES)), "Deployment").body
    anti = full["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "acemq-sidecar"}
    }


def test_a_spread_constraint_without_a_selector_counts_the_releases_replicas() -> None:
    zone = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
    }
    own = zone | {"labelSelector": {"matchLabels": {"tier": "messaging"}}}
    deployment = _deployment({"topologySpreadConstraints": [zone, own]})
    filled, kept = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert filled == zone | {
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    }
    assert kept == own
