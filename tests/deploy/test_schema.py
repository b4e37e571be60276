"""values.schema.json: a wrong value fails the install; the route map part is the sidecar's."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import pytest

from sidecar.routemap import route_map_json_schema
from tests.deploy.chart_schema import (
    VALUES_SCHEMA,
    chart_route_map_schema,
    embedded_route_map_schema,
)
from tests.deploy.conftest import MINIMAL_VALUES, read_values, render


def test_embedded_route_map_schema_matches_the_sidecar() -> None:
    """The chart's copy is the sidecar's schema; refresh: python -m tests.deploy.chart_schema."""
    assert embedded_route_map_schema() == chart_route_map_schema(route_map_json_schema())


def _route(**changes: Any) -> dict[str, Any]:
    return {"name": "orders", "from": "staging.orders", "to": {"exchange": "orders"}} | changes


# (what is wrong, the values to merge into ci/minimal-values.yaml, the path the error names)
SCHEMA_VIOLATIONS = [
    ("no route", {"routeMap": {"routes": []}}, "/routeMap/routes"),
    ("unknown route map key", {"routeMap": {"routez": []}}, "/routeMap"),
    ("unknown route key", {"routeMap": {"routes": [_route(queue="x")]}}, "/routeMap/routes/0"),
    ("route without to", {"routeMap": {"routes": [{"name": "a", "from": "q"}]}}, "/routes/0"),
    ("wrong mode", {"routeMap": {"mode": "enforcing"}}, "/routeMap/mode"),
    ("wrong publishers", {"routeMap": {"routes": [_route(publishers="app")]}}, "publishers"),
    ("prefetch zero", {"routeMap": {"broker": {"prefetch": 0}}}, "/routeMap/broker/prefetch"),
    ("prefetch too big", {"routeMap": {"routes": [_route(prefetch=70000)]}}, "prefetch"),
    ("prefetch as text", {"routeMap": {"broker": {"prefetch": "many"}}}, "prefetch"),
    ("negative grace", {"routeMap": {"shutdown_grace_s": -1}}, "/routeMap/shutdown_grace_s"),
    ("URL in the ConfigMap", {"routeMap": {"broker": {"url": "amqp://u:p@h/"}}}, "/broker"),
    ("TLS paths by hand", {"routeMap": {"broker": {"tls": {"ca_file": "/x"}}}}, "/broker"),
    ("Secret name", {"broker": {"urlSecret": {"name": "Broker_URL"}}}, "/broker/urlSecret/name"),
    ("credentials scheme", {"broker": {"credentialsSecret": {"scheme": "http"}}}, "/scheme"),
    ("TLS Secret name", {"tls": {"enabled": True, "secretName": "Client_TLS"}}, "/tls/secretName"),
    ("readiness as text", {"readinessProbe": {"enabled": "auto"}}, "/readinessProbe/enabled"),
    (
        "unknown eviction policy",
        {"deployment": {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Never"}}},
        "unhealthyPodEvictionPolicy",
    ),
    ("typo in the sidecar shape", {"sidecar": {"nativ": True}}, "/sidecar"),
    ("typo in a pod monitor", {"podMonitor": {"enable": True}}, "/podMonitor"),
    ("old Deployment key", {"deployment": {"podAnnotations": {"a": "b"}}}, "/deployment"),
    ("writable root", {"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRoot"),
    ("root allowed", {"securityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
    ("escalation", {"securityContext": {"allowPrivilegeEscalation": True}}, "allowPrivilege"),
    ("a capability", {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}, "capabilities"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("unknown top key", {"replicas": 3}, "replicas"),
    ("typo in a toggle", {"serviceMonitor": {"enable": True}}, "/serviceMonitor"),
    ("bad duration", {"prometheusRule": {"alerts": {"routeDown": {"for": "5 min"}}}}, "for"),
    ("long port name", {"portName": "acemq-sidecar-metrics"}, "/portName"),
    (
        "budget in words",
        {"deployment": {"podDisruptionBudget": {"maxUnavailable": "half"}}},
        "/deployment/podDisruptionBudget/maxUnavailable",
    ),
    (
        "typo in the budget",
        {"deployment": {"podDisruptionBudget": {"minAvailible": 1}}},
        "/deployment/podDisruptionBudget",
    ),
]


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.mark.parametrize(
    ("changes", "path"),
    [pytest.param(changes, path, id=what) for what, changes, path in SCHEMA_VIOLATIONS],
)
def test_schema_violation_fails_to_render(changes: dict[str, Any], path: str) -> None:
    """helm refuses the values before rendering anything, naming where the problem is."""
    values = _merge(read_values(MINIMAL_VALUES), changes)
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render(values)
    assert path in str(caught.value)


# What the schema cannot say; the templates refuse it with a message that says what to do.
TEMPLATE_REFUSALS = [
    ("loopback listen", {"routeMap": {"http": {"listen": "127.0.0.1:9090"}}}, "loopback"),
    ("listen from a variable", {"routeMap": {"http": {"listen": "${LISTEN}"}}}, "literal"),
    ("listen without port", {"routeMap": {"http": {"listen": "0.0.0.0"}}}, "host:port"),  # noqa: S104
    ("port zero", {"routeMap": {"http": {"listen": "0.0.0.0:0"}}}, "1 to 65535"),
    (
        "half a client certificate",
        {"tls": {"enabled": True, "secretName": "tls", "keyKey": ""}},
        "certKey and keyKey",
    ),
    ("grace too short", {"terminationGracePeriodSeconds": 39}, "at least 45"),
    (
        "both monitors",
        {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "every alert would fire twice",
    ),
    (
        "two broker Secrets",
        {"broker": {"credentialsSecret": {"name": "rabbit-default-user"}}},
        "not both",
    ),
    (
        "two autoscalers",
        {"autoscaling": {"enabled": True}, "keda": {"enabled": True}},
        "enable one",
    ),
    (
        "keda without the Deployment",
        {"keda": {"enabled": True}, "deployment": {"enabled": False}},
        "scale your own workload",
    ),
    (
        "HPA without a target",
        {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None}},
        "set targetCPUUtilizationPercentage",
    ),
]


@pytest.mark.parametrize(
    ("changes", "message"),
    [pytest.param(changes, message, id=what) for what, changes, message in TEMPLATE_REFUSALS],
)
def test_template_refusal_fails_to_render(changes: dict[str, Any], message: str) -> None:
    """Rendering stops with the reason instead of producing a pod that cannot work."""
    values = _merge(read_values(MINIMAL_VALUES), changes)
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


def test_tls_with_ca_only_renders() -> None:
    """Server verification without a client certificate: certKey and keyKey both empty."""
    values = _merge(
        read_values(MINIMAL_VALUES),
        {
            "tls": {
                "enabled": True,
                "secretName": "ca",
                "certKey": "",
                "keyKey": "",
                "caKey": "ca.crt",
            }
        },
    )
    assert render(values)


# Keys users of the Bitnami and prometheus-community charts reach for; each is accepted.
COMMON_KEYS = [
    ("optional dependency", {"enabled": True}),
    ("commonLabels", {"commonLabels": {"team": "platform"}}),
    ("commonAnnotations", {"commonAnnotations": {"example.com/owner": "platform"}}),
    ("extraVolumes", {"extraVolumes": [{"name": "ca", "configMap": {"name": "ca"}}]}),
    ("extraVolumeMounts", {"extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ca"}]}),
    ("extraEnvFrom", {"extraEnvFrom": [{"configMapRef": {"name": "sidecar-env"}}]}),
    ("startupProbe", {"startupProbe": {"enabled": True, "failureThreshold": 60}}),
    (
        "deployment.updateStrategy",
        {"deployment": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}}},
    ),
    (
        "serviceMonitor.relabelings",
        {"serviceMonitor": {"relabelings": [{"targetLabel": "team", "replacement": "x"}]}},
    ),
    (
        "serviceMonitor.metricRelabelings",
        {"serviceMonitor": {"metricRelabelings": [{"action": "drop", "regex": "x"}]}},
    ),
    ("serviceAccount", {"serviceAccount": {"create": False, "name": "shared"}}),
    ("podAnnotations", {"podAnnotations": {"example.com/scrape": "true"}}),
    ("priorityClassName", {"priorityClassName": "high"}),
    (
        "topologySpreadConstraints",
        {
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
            ]
        },
    ),
]


@pytest.mark.parametrize("changes", [pytest.param(c, id=what) for what, c in COMMON_KEYS])
def test_common_keys_are_accepted(changes: dict[str, Any]) -> None:
    """Each renders (an application chart may pass them through unchanged)."""
    assert render(_merge(read_values(MINIMAL_VALUES), changes))


def _objects(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with ``properties`` (``$defs`` included), with its path."""
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append((path, node))
        for key, value in node.items():
            found.extend(_objects(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found.extend(_objects(item, f"{path}/{index}"))
    return found


def test_every_schema_property_has_a_description() -> None:
    """Editors and `helm show` read them; the route map's come from chart_schema.DESCRIPTIONS."""
    schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    missing = [
        f"{path}/properties/{name}"
        for path, node in _objects(schema)
        for name, prop in node["properties"].items()
        if not (isinstance(prop, dict) and str(prop.get("description", "")).strip())
    ]
    assert not missing, missing


def test_every_object_of_the_charts_own_refuses_unknown_keys() -> None:
    """A typo is an error: every object with properties says additionalProperties false."""
    schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    # Pass-through Kubernetes objects keep their own fields (kubernetes-validate checks them).
    passthrough = {
        "/properties/securityContext",
        "/properties/securityContext/properties/capabilities",
    }
    open_objects = [
        path
        for path, node in _objects(schema)
        if node.get("additionalProperties") is not False
        and path not in passthrough
        and not path.endswith("/items")
    ]
    assert not open_objects, open_objects
