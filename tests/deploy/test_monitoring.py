"""ServiceMonitor, PrometheusRule and dashboard: well-formed, and about metrics that exist."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.observe.metrics import DRIFT_VIOLATIONS, Metrics
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
SCRAPE_LABELS = {"namespace", "job", "pod"}  # added by the scrape, not by the sidecar
METRIC = re.compile(r"\b(acemq_sidecar_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?:\{([^}]*)\})?")
ALERTS = {
    "AcemqSidecarContractDrift",
    "AcemqSidecarQuarantining",
    "AcemqSidecarRouteDown",
    "AcemqSidecarBrokerDisconnected",
    "AcemqSidecarConfigReloadRefused",
    "AcemqSidecarReconnectFlapping",
    "AcemqSidecarTargetAbsent",
}
# The release's scrape jobs in ci/full-values.yaml (fullnameOverride acemq-relay): the
# ServiceMonitor's (the Service's name) and the PodMonitor's (namespace/name).
JOBS = f"acemq-relay-metrics|{NAMESPACE}/acemq-relay"
MATCHERS = f'namespace="{NAMESPACE}", job=~"{JOBS}"'
# The kinds that mean a publisher drifts from docs/contract.md. `unportable` (section 7: an
# unsigned integer tag some client cannot decode) is drift too; sidecar.observe.metrics creates its
# series at zero once the sidecar counts it.
DRIFT_KINDS = {str(kind) for kind, _ in DRIFT_VIOLATIONS} | {"unportable"}


def _exposed_series() -> dict[str, set[str]]:
    """Return each metric family the sidecar exposes and its label names, from a live registry."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="test", contract="test")
    metrics.add_route("orders")
    # The producer series exist once a producer drifts (a label set per producer seen).
    metrics.count_violations("orders", [("legacy_name", "x-acemq-replay-count")], producer="pay")
    families: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            families.setdefault(family.name, set()).update(sample.labels)
            # And each sample's own name: a counter's _total and _created, a histogram's.
            families.setdefault(sample.name, set()).update(sample.labels)
    return families


def _check_metric_references(text: str) -> None:
    """Every acemq_sidecar_ metric in ``text`` exists, and is filtered on labels it has."""
    exposed = _exposed_series()
    # prometheus_client names a counter family without its _total suffix.
    names = exposed | {f"{name}_total": labels for name, labels in exposed.items()}
    found = METRIC.findall(text)
    assert found, text
    for name, matchers in found:
        assert name in names, f"{name} is not a metric of sidecar/observe/metrics.py"
        for label in re.findall(r"([a-z_]+)\s*=~?", matchers):
            if label not in SCRAPE_LABELS:
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
    assert set(endpoint) <= {
        "port",
        "path",
        "scheme",
        "interval",
        "scrapeTimeout",
        "relabelings",
        "metricRelabelings",
    }
    assert endpoint["relabelings"][0]["targetLabel"] == "cluster"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"


def test_metrics_service_selects_the_sidecar_pods(full: list[Manifest]) -> None:
    """The Service's selector matches the pod labels and reaches the container's port."""
    service = only(full, "Service").body
    template = only(full, "Deployment").body["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = {port["containerPort"] for port in sidecar_container(template["spec"])["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports


def _rules(full: list[Manifest]) -> list[dict[str, Any]]:
    rule = only(full, "PrometheusRule").body
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert K8S_NAME.match(rule["metadata"]["name"])
    groups = rule["spec"]["groups"]
    assert groups
    assert len({group["name"] for group in groups}) == len(groups)
    return [rule for group in groups for rule in group["rules"]]


def test_prometheus_rule_has_every_alert(full: list[Manifest]) -> None:
    """Each alert with expr, for, severity, summary, description and runbook; known metrics."""
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
        if rule["alert"] == "AcemqSidecarTargetAbsent":
            assert expr.startswith("absent(up{"), expr  # the scrape's own series
        else:
            _check_metric_references(expr)


def _expr(full: list[Manifest], alert: str) -> str:
    return " ".join(next(r["expr"] for r in _rules(full) if r["alert"] == alert).split())


def test_drift_alert_watches_the_drift_kinds(full: list[Manifest]) -> None:
    """The drift kinds: the ones observe.metrics pre-creates for the alert, and unportable."""
    expr = _expr(full, "AcemqSidecarContractDrift")
    match = re.search(r'acemq_sidecar_violations_total\{kind=~"([^"]+)"', expr)
    assert match, expr
    assert set(match[1].split("|")) == DRIFT_KINDS
    assert re.search(r"rate\(acemq_sidecar_violations_total\{.*\}\[\d+m\]\)", expr)
    assert expr.endswith("> 0")


def test_drift_alert_says_where_to_see_the_top_producers(full: list[Manifest]) -> None:
    """The description holds the PromQL to run, on the alert's own namespace, route and kind."""
    rule = next(r for r in _rules(full) if r["alert"] == "AcemqSidecarContractDrift")
    description = rule["annotations"]["description"]
    query = re.search(r"topk\(5, sum by \(producer\) \(increase\((.*?)\[1h\]\)\)\)", description)
    assert query, description
    assert query[1] == (
        'acemq_sidecar_producer_violations_total{namespace="{{ $labels.namespace }}",'
        ' route="{{ $labels.route }}", kind="{{ $labels.kind }}"}'
    )
    _check_metric_references(query[1])
    assert "Drift by producer" in description
    panels = [panel["title"] for panel in _dashboard(full)["panels"]]
    assert "Drift by producer" in panels


def test_quarantine_alert_watches_quarantined_messages(full: list[Manifest]) -> None:
    """Fires on any quarantined message."""
    expr = _expr(full, "AcemqSidecarQuarantining")
    assert re.search(r'rate\(acemq_sidecar_messages_total\{outcome="quarantined"', expr)
    assert expr.endswith("> 0")


def test_state_alerts_fire_on_zero(full: list[Manifest]) -> None:
    """A gauge at 0; a route's alert held back while its pod has no connection at all."""
    broker = _expr(full, "AcemqSidecarBrokerDisconnected")
    assert broker == f"acemq_sidecar_broker_connected{{{MATCHERS}}} == 0"
    route = _expr(full, "AcemqSidecarRouteDown")
    assert route == (
        f"acemq_sidecar_route_up{{{MATCHERS}}} == 0 unless on (namespace, pod) "
        f"acemq_sidecar_broker_connected{{{MATCHERS}}} == 0"
    )


def test_alerts_are_scoped_to_the_release(full: list[Manifest]) -> None:
    """Its namespace and its monitors' jobs: two releases in one namespace do not alert twice."""
    for rule in _rules(full):
        for selector in re.findall(r"acemq_sidecar_\w+\{([^}]*)\}|up\{([^}]*)\}", rule["expr"]):
            assert MATCHERS in "".join(selector), (rule["alert"], selector)


def test_custom_matchers_replace_the_release_scope() -> None:
    """Scraping the sidecar another way, prometheusRule.matchers names that job."""
    values = read_values(FULL_VALUES)
    values["prometheusRule"]["matchers"] = 'job="kubernetes-pods", namespace="messaging"'
    for rule in _rules(render(values)):
        assert 'job="kubernetes-pods", namespace="messaging"' in rule["expr"], rule["alert"]
        assert "acemq-relay-metrics" not in rule["expr"]


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
    assert has(r"sum by \(route\) \(acemq_sidecar_in_flight\{")
    assert has(r"increase\(acemq_sidecar_reconnects_total\{")
    assert has(r"sum by \(result\) \(increase\(acemq_sidecar_config_reloads_total\{")
    assert has(
        r"topk\(10, sum by \(producer, kind\) \(rate\(acemq_sidecar_producer_violations_total\{"
    )
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Only this release's sidecars: every query filters on the hidden constant $job,
    # which the chart sets to the jobs the alerts are scoped to.
    for title, expr in exprs.items():
        assert 'job=~"$job"' in expr, title
    [job] = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert job["type"] == "constant"
    assert job["query"] == job["current"]["value"] == JOBS
    # Wherever the dashboard names violation kinds, they are the drift alert's.
    named = [set(k.split("|")) for k in re.findall(r'kind=~"([^"]+)"', joined)]
    assert named, "no panel shows the drift kinds"
    assert all(kinds == DRIFT_KINDS for kinds in named), named


def test_monitoring_is_off_by_default() -> None:
    """No CRD objects unless asked: a cluster without prometheus-operator installs cleanly."""
    values = read_values(FULL_VALUES)
    for toggle in ("serviceMonitor", "prometheusRule", "grafanaDashboard"):
        del values[toggle]
    kinds = [m.kind for m in render(values)]
    assert "ServiceMonitor" not in kinds
    assert "PrometheusRule" not in kinds
    assert kinds.count("ConfigMap") == 1


def _dashboard(manifests: list[Manifest]) -> dict[str, Any]:
    [dashboard_map] = [
        m
        for m in manifests
        if m.kind == "ConfigMap" and any(k.endswith(".json") for k in m.body["data"])
    ]
    [text] = dashboard_map.body["data"].values()
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def test_two_releases_get_two_dashboards() -> None:
    """Grafana keys dashboards by uid (at most 40 characters) and by title within a folder."""
    values = read_values(FULL_VALUES)
    del values["fullnameOverride"]
    first = _dashboard(render(values, release="orders"))
    second = _dashboard(render(values, release="billing"))
    elsewhere = _dashboard(render(values, release="orders", namespace="staging"))
    uids = {first["uid"], second["uid"], elsewhere["uid"]}
    assert len(uids) == 3, uids
    assert all(len(uid) <= 40 for uid in uids), uids
    assert len({first["title"], second["title"], elsewhere["title"]}) == 3
