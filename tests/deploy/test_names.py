"""Every name the chart renders fits its kind's limit, with the longest names Helm allows."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest

from tests.deploy.conftest import (
    FULL_VALUES,
    MINIMAL_VALUES,
    Manifest,
    read_values,
    render,
)

# Helm refuses release names over 53 characters (helm_python.validate_release_name).
LONGEST_RELEASE = "payments-eu-west-1-production-blue-green-rollout-2025"
LONGEST_NAME = "a" + "b" * 61 + "c"  # a 63-character fullnameOverride or nameOverride

# Kubernetes' own validations (k8s.io/apimachinery/pkg/util/validation).
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # Services: at most 63
DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)  # most other objects: at most 253
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # at most 63


def _everything_on(values: dict[str, Any], *, monitor: str = "serviceMonitor") -> dict[str, Any]:
    """Every object on: one of the two monitors (both is refused), KEDA, the NetworkPolicy."""
    values = read_values(FULL_VALUES) | values
    values.pop("fullnameOverride", None)
    values["serviceMonitor"] = values["serviceMonitor"] | {"enabled": monitor == "serviceMonitor"}
    values["podMonitor"] = {"enabled": monitor == "podMonitor"}
    values["keda"] = {"enabled": True}
    values["networkPolicy"] = {"enabled": True}
    return values


CASES = [
    pytest.param(LONGEST_RELEASE, read_values(MINIMAL_VALUES), id="minimal-longest-release"),
    pytest.param(LONGEST_RELEASE, _everything_on({}), id="full-longest-release"),
    pytest.param(
        LONGEST_RELEASE, _everything_on({}, monitor="podMonitor"), id="full-podMonitor-longest"
    ),
    pytest.param(
        "acemq", _everything_on({"fullnameOverride": LONGEST_NAME}), id="full-fullnameOverride"
    ),
    pytest.param(
        LONGEST_RELEASE, _everything_on({"nameOverride": LONGEST_NAME}), id="full-nameOverride"
    ),
]


def test_the_longest_release_name_is_one_helm_accepts() -> None:
    """The test uses the real limit: 53 characters pass Helm's check, 54 do not."""
    assert len(LONGEST_RELEASE) == 53
    helm_python.validate_release_name(LONGEST_RELEASE)
    with pytest.raises(helm_python.HelmInvalidArgError):
        helm_python.validate_release_name(LONGEST_RELEASE + "x")


def _check_name(manifest: Manifest) -> None:
    name = manifest.name
    where = f"{manifest.template}: {manifest.kind} {name!r} ({len(name)} characters)"
    if manifest.kind == "Service":
        assert len(name) <= 63, f"{where}: a Service name is a DNS-1035 label of at most 63"
        assert DNS1035_LABEL.match(name), f"{where}: not a DNS-1035 label"
    else:
        assert len(name) <= 253, where
        assert DNS1123_SUBDOMAIN.match(name), f"{where}: not a DNS-1123 subdomain"


def _label_maps(node: Any) -> list[dict[str, Any]]:
    """Every labels / matchLabels / selector map in an object, at any depth."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("labels", "matchLabels") and isinstance(value, dict):
                found.append(value)
            elif key == "selector" and isinstance(value, dict) and "matchLabels" not in value:
                found.append(value)  # a Service's selector is the label map itself
            found.extend(_label_maps(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_label_maps(item))
    return found


@pytest.mark.parametrize(("release", "values"), CASES)
def test_every_name_fits_its_kind(release: str, values: dict[str, Any]) -> None:
    """Services are DNS-1035 labels (63), the rest DNS-1123 subdomains; names stay unique."""
    manifests = render(values, release=release)
    for manifest in manifests:
        _check_name(manifest)
    keys = [(m.kind, m.name) for m in manifests]
    assert len(keys) == len(set(keys)), keys


@pytest.mark.parametrize(("release", "values"), CASES)
def test_every_label_value_fits(release: str, values: dict[str, Any]) -> None:
    """Label values (and selectors) are at most 63 characters of the allowed set."""
    for manifest in render(values, release=release):
        for labels in _label_maps(manifest.body):
            for key, value in labels.items():
                text = str(value)
                where = f"{manifest.kind} {manifest.name}: label {key}={text!r}"
                assert len(text) <= 63, where
                assert LABEL_VALUE.match(text), where


@pytest.mark.parametrize(("release", "values"), CASES)
def test_service_monitor_and_rules_follow_the_truncated_service_name(
    release: str, values: dict[str, Any]
) -> None:
    """The alerts' job matcher names the Service as rendered, not as it would be untruncated."""
    manifests = render(values, release=release)
    services = [m.name for m in manifests if m.kind == "Service"]
    rules = [m for m in manifests if m.kind == "PrometheusRule"]
    for rule in rules:
        exprs = " ".join(r["expr"] for g in rule.body["spec"]["groups"] for r in g["rules"])
        for service in services:
            assert service in exprs, f"{service} missing from the alerts' matchers"
