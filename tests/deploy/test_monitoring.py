"""ServiceMonitor, PrometheusRule and dashboard: well-formed, and about metrics that exist."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.metrics import DRIFT_VIOLATIONS, Metrics
from tests.deploy.conftest import (
    FULL_VALUES,
    NAMESPACE,
    Manifest,
    only,
    read_values,
    render,
    sidecar_container,
)

# prometheus-operator's Duration pattern (monitoring.coreos.com/v1).
DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
METRIC = re.compile(r"\b(acemq_sidecar_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?:\{([^}]*)\})?")
ALERTS = {
    "AcemqSidecarContractDrift",
    "AcemqSidecarQuarantining",
    "AcemqSidecarRouteDown",
    "AcemqSidecarBrokerDisconnected",
}


def _exposed_series() -> dict[str, set[str]]:
    """Return each metric family the sidecar exposes and its label names, from a live registry."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="test", contract="test")
    metrics.add_route("orders")
    families: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            families.setdefault(family.name, set()).update(sample.labels)
    return families


def _check_metric_references(text: str) -> None:
    """Every acemq_sidecar_ metric in ``text`` exists, and is filtered on labels it has."""
    exposed = _exposed_series()
    # prometheus_client names a counter family without its _total suffix.
    names = exposed | {f"{name}_total": labels for name, labels in exposed.items()}
    found = METRIC.findall(text)
    assert found, text
    for name, matchers in found:
        assert name in names, f"{name} is not a metric of sidecar/metrics.py"
        for label in re.findall(r"([a-z_]+)\s*=~?", matchers):
            if label != "namespace":  # added by the scrape, not by the sidecar
                assert label in names[name] | {"le"}, f"{name} has no label {label}"


@pytest.fixture(scope="module")
def full() -> list[Manifest]:
    return render(read_values(FULL_VALUES))


def test_service_monitor_scrapes_the_metrics_service(full: list[Manifest]) -> None:
    """apiVersion, selector matching the Service, an endpoint on the named metrics port."""
    monitor = only(full, "ServiceMonitor").body
    service = only(full, "Service").body
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert K8S_NAME.match(monitor["metadata"]["name"])
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert DURATION.match(endpoint["interval"])
    assert DURATION.match(endpoint["scrapeTimeout"])
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}


def test_metrics_service_selects_the_sidecar_pods(full: list[Manifest]) -> None:
    """The Service's selector matches the pod labels and reaches the container's port."""
    service = only(full, "Service").body
    template = only(full, "Deployment").body["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = {port["name"] for port in sidecar_container(template["spec"])["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports


def _rules(full: list[Manifest]) -> list[dict[str, Any]]:
    rule = only(full, "PrometheusRule").body
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert K8S_NAME.match(rule["metadata"]["name"])
    groups = rule["spec"]["groups"]
    assert groups
    assert len({group["name"] for group in groups}) == len(groups)
    return [rule for group in groups for rule in group["rules"]]


def test_prometheus_rule_has_the_four_alerts(full: list[Manifest]) -> None:
    """Drift, quarantine, route down, broker down; each with expr, for, severity, summary."""
    rules = _rules(full)
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["expr"], str)
        assert rule["expr"].strip()
        assert DURATION.match(rule["for"]), rule["for"]
        assert rule["labels"]["severity"]
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
        assert rule["annotations"]["runbook_url"].startswith("https://docs.example.com/")
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), expr
        assert expr.count("{") == expr.count("}"), expr
        _check_metric_references(expr)


def _expr(full: list[Manifest], alert: str) -> str:
    return " ".join(next(r["expr"] for r in _rules(full) if r["alert"] == alert).split())


def test_drift_alert_watches_the_drift_kinds(full: list[Manifest]) -> None:
    """The kinds in the alert are the ones sidecar.metrics pre-creates for it, no more."""
    expr = _expr(full, "AcemqSidecarContractDrift")
    match = re.search(r'acemq_sidecar_violations_total\{kind=~"([^"]+)"', expr)
    assert match, expr
    assert set(match[1].split("|")) == {str(kind) for kind, _ in DRIFT_VIOLATIONS}
    assert re.search(r"rate\(acemq_sidecar_violations_total\{.*\}\[\d+m\]\)", expr)
    assert expr.endswith("> 0")


def test_quarantine_alert_watches_quarantined_messages(full: list[Manifest]) -> None:
    """Fires on any quarantined message."""
    expr = _expr(full, "AcemqSidecarQuarantining")
    assert re.search(r'rate\(acemq_sidecar_messages_total\{outcome="quarantined"', expr)
    assert expr.endswith("> 0")


@pytest.mark.parametrize(
    ("alert", "metric"),
    [
        ("AcemqSidecarRouteDown", "acemq_sidecar_route_up"),
        ("AcemqSidecarBrokerDisconnected", "acemq_sidecar_broker_connected"),
    ],
)
def test_state_alerts_fire_on_zero(full: list[Manifest], alert: str, metric: str) -> None:
    """A gauge at 0 for the alert's duration."""
    expr = _expr(full, alert)
    assert re.fullmatch(rf'{metric}\{{namespace="{NAMESPACE}"\}} == 0', expr), expr


def test_alerts_are_scoped_to_the_release_namespace(full: list[Manifest]) -> None:
    """Two releases in two namespaces do not alert on each other's sidecars."""
    for rule in _rules(full):
        assert f'namespace="{NAMESPACE}"' in rule["expr"], rule["alert"]


def test_alert_toggle_drops_the_alert() -> None:
    """An alert switched off is not rendered; the others remain."""
    values = read_values(FULL_VALUES)
    values["prometheusRule"]["alerts"]["drift"] = {"enabled": False, "for": "1m", "severity": "x"}
    rules = _rules(render(values))
    assert {rule["alert"] for rule in rules} == ALERTS - {"AcemqSidecarContractDrift"}


def test_dashboard_shows_rates_and_violations(full: list[Manifest]) -> None:
    """Found by label; relayed and quarantined rates, violations by kind and by route."""
    [dashboard_map] = [
        m
        for m in full
        if m.kind == "ConfigMap" and any(k.endswith(".json") for k in m.body["data"])
    ]
    assert dashboard_map.body["metadata"]["labels"]["grafana_dashboard"] == "1"
    [text] = dashboard_map.body["data"].values()
    dashboard = json.loads(text)
    assert dashboard["uid"]
    assert dashboard["title"]
    exprs = {
        panel["title"]: " ".join(target["expr"] for target in panel["targets"])
        for panel in dashboard["panels"]
    }
    joined = " ".join(exprs.values())
    _check_metric_references(joined)

    def has(pattern: str) -> bool:
        return any(re.search(pattern, expr) for expr in exprs.values())

    assert has(r'sum by \(route\) \(rate\(acemq_sidecar_messages_total\{outcome=~?"relayed')
    assert has(r'sum by \(route\) \(rate\(acemq_sidecar_messages_total\{outcome="quarantined"')
    assert has(r"sum by \(kind\) \(rate\(acemq_sidecar_violations_total")
    assert has(r"sum by \(route\) \(rate\(acemq_sidecar_violations_total")
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_monitoring_is_off_by_default() -> None:
    """No CRD objects unless asked: a cluster without prometheus-operator installs cleanly."""
    values = read_values(FULL_VALUES)
    for toggle in ("serviceMonitor", "prometheusRule", "grafanaDashboard"):
        del values[toggle]
    kinds = [m.kind for m in render(values)]
    assert "ServiceMonitor" not in kinds
    assert "PrometheusRule" not in kinds
    assert kinds.count("ConfigMap") == 1
