"""The chart's alerts under Prometheus' own rule engine: `promtool check rules` and `test rules`.

The PrometheusRule is rendered with ci/full-values.yaml, its groups written to a rules file,
and every scenario below becomes a promtool unit test: input series as the sidecar and the
scrape produce them, and at each evaluation time the alerts that must be firing, with their
labels and annotations. promtool comes from Debian's `prometheus` package; without it the
tests skip, except under CI (the CI variable set), where a skip would hide a broken rule.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import FULL_VALUES, NAMESPACE, RELEASE, only, read_values, render

# ci/full-values.yaml: fullnameOverride acemq-relay, so the ServiceMonitor's job is the
# Service's name and the PodMonitor's is namespace/name.
JOB = "acemq-relay-metrics"
POD_JOB = f"{NAMESPACE}/acemq-relay"
OTHER_JOB = "shop-acemq-sidecar-metrics"  # another release in the same namespace

PODS = ("acemq-relay-7d9c-a", "acemq-relay-7d9c-b", "acemq-relay-7d9c-c")
ROUTES = ("orders", "invoices", "legacy")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    reason = (
        "promtool not found: `apt-get install prometheus` (Debian) brings it; "
        "tests/deploy/test_alerts.py runs the chart's alerts through it"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{reason}. CI must run these, not skip them.")
    pytest.skip(reason)


def _series(metric: str, job: str = JOB, pod: str = PODS[0], **labels: str) -> str:
    every = {"namespace": NAMESPACE, "job": job, "pod": pod, "instance": f"{pod}:9102"} | labels
    inner = ", ".join(f'{key}="{value}"' for key, value in sorted(every.items()))
    return f"{metric}{{{inner}}}"


def _counter(
    metric: str, values: str, *, created: str = "0x60", pod: str = PODS[0], **labels: str
) -> dict[str, str]:
    """A counter's series and its ``_created`` (prometheus-client's: the Unix time it began).

    The default: begun at the test's time 0 (the pod's start, just before its first scrape).
    """
    return {
        _series(metric, pod=pod, **labels): values,
        _series(metric.removesuffix("_total") + "_created", pod=pod, **labels): created,
    }


@dataclass(frozen=True, slots=True)
class Expect:
    """At ``at`` (minutes), alert ``alert`` fires exactly once per label set in ``fired``."""

    at: int
    alert: str
    fired: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Scenario:
    """Input series (promtool's expanding notation, one sample a minute) and expectations."""

    name: str
    series: dict[str, str]
    expect: list[Expect]


def _pod_labels(pod: str = PODS[0], job: str = JOB) -> dict[str, str]:
    return {"namespace": NAMESPACE, "job": job, "pod": pod, "instance": f"{pod}:9102"}


VIOLATIONS = "acemq_sidecar_violations_total"
MESSAGES = "acemq_sidecar_messages_total"
ROUTE_UP = "acemq_sidecar_route_up"
CONNECTED = "acemq_sidecar_broker_connected"
RELOADS = "acemq_sidecar_config_reloads_total"
RECONNECTS = "acemq_sidecar_reconnects_total"
# absent() and count() keep no label: the rule gives the release's own.
ABSENT_LABELS = {"namespace": NAMESPACE, "release": RELEASE, "severity": "warning"}

SCENARIOS = [
    Scenario(
        "drift: an unknown reserved header appears",
        _counter(
            VIOLATIONS, "0x5 1x20", route="orders", kind="unknown_reserved", header="x-acemq-*"
        ),
        [
            Expect(5, "AcemqSidecarContractDrift"),
            Expect(
                8,
                "AcemqSidecarContractDrift",
                [{"namespace": NAMESPACE, "route": "orders", "kind": "unknown_reserved"}],
            ),
        ],
    ),
    Scenario(
        "drift: a publisher writes unsigned integer tags",
        _counter(VIOLATIONS, "0x5 3x20", route="invoices", kind="unportable", header="app"),
        [
            Expect(
                8,
                "AcemqSidecarContractDrift",
                [{"namespace": NAMESPACE, "route": "invoices", "kind": "unportable"}],
            ),
        ],
    ),
    Scenario(
        "drift: kinds that are not drift do not alert",
        {
            **_counter(
                VIOLATIONS, "0+10x20", route="orders", kind="defaulted", header="x-acemq-id"
            ),
            **_counter(
                VIOLATIONS, "0+1x20", route="orders", kind="coerced", header="x-acemq-attempt"
            ),
        },
        [Expect(10, "AcemqSidecarContractDrift")],
    ),
    Scenario(
        "drift: counted before the pod's first scrape",
        _counter(
            VIOLATIONS, "2x20", route="orders", kind="legacy_name", header="x-acemq-replay-count"
        ),
        [
            Expect(
                3,
                "AcemqSidecarContractDrift",
                [{"namespace": NAMESPACE, "route": "orders", "kind": "legacy_name"}],
            ),
        ],
    ),
    Scenario(
        "quarantine: messages set aside on two pods",
        {
            **_counter(MESSAGES, "0x5 0+1x20", pod=PODS[0], route="orders", outcome="quarantined"),
            **_counter(MESSAGES, "0x5 0+2x20", pod=PODS[1], route="orders", outcome="quarantined"),
            **_counter(MESSAGES, "0+100x25", pod=PODS[0], route="orders", outcome="relayed"),
        },
        [
            Expect(5, "AcemqSidecarQuarantining"),
            Expect(9, "AcemqSidecarQuarantining", [{"namespace": NAMESPACE, "route": "orders"}]),
        ],
    ),
    Scenario(
        "quarantine: counted before the pod's first scrape",
        _counter(MESSAGES, "1x20", route="invoices", outcome="quarantined"),
        [
            Expect(3, "AcemqSidecarQuarantining", [{"namespace": NAMESPACE, "route": "invoices"}]),
        ],
    ),
    Scenario(
        "quarantine: a relay without quarantines is quiet",
        _counter(MESSAGES, "0x20", route="orders", outcome="quarantined"),
        [Expect(10, "AcemqSidecarQuarantining")],
    ),
    Scenario(
        "scope: another release in the same namespace",
        {
            _series(MESSAGES, job=OTHER_JOB, route="orders", outcome="quarantined"): "0x5 0+1x20",
            _series(ROUTE_UP, job=OTHER_JOB, route="orders"): "0x30",
            _series(CONNECTED, job=OTHER_JOB): "0x30",
            _series("up", job=JOB): "1x30",
        },
        [
            Expect(9, "AcemqSidecarQuarantining"),
            Expect(20, "AcemqSidecarRouteDown"),
            Expect(20, "AcemqSidecarBrokerDisconnected"),
        ],
    ),
    Scenario(
        "scope: the release's sidecar in an application pod (PodMonitor job)",
        {_series(CONNECTED, job=POD_JOB, pod="shop-5f6b-x"): "0x10"},
        [
            Expect(
                5,
                "AcemqSidecarBrokerDisconnected",
                [_pod_labels("shop-5f6b-x", POD_JOB) | {"severity": "critical"}],
            ),
        ],
    ),
    Scenario(
        "route down: a missing staging queue, broker connected",
        {
            _series(ROUTE_UP, route="orders"): "1x3 0x20",
            _series(ROUTE_UP, route="invoices"): "1x25",
            _series(CONNECTED): "1x25",
        },
        [
            Expect(10, "AcemqSidecarRouteDown"),
            Expect(
                14,
                "AcemqSidecarRouteDown",
                [_pod_labels() | {"route": "orders", "severity": "page"}],
            ),
        ],
    ),
    Scenario(
        "broker outage: one alert per pod, no route alerts on top",
        {
            **{_series(CONNECTED, pod=pod): "1x2 0x30" for pod in PODS},
            **{
                _series(ROUTE_UP, pod=pod, route=route): "1x2 0x30"
                for pod in PODS
                for route in ROUTES
            },
        },
        [
            Expect(
                10,
                "AcemqSidecarBrokerDisconnected",
                [_pod_labels(pod) | {"severity": "critical"} for pod in PODS],
            ),
            Expect(20, "AcemqSidecarRouteDown"),
        ],
    ),
    Scenario(
        "reload refused: an invalid route map edited in place",
        {
            **_counter(RELOADS, "0x5 1x30", result="refused"),
            **_counter(RELOADS, "0x5 1x30", result="applied"),
        },
        [
            Expect(4, "AcemqSidecarConfigReloadRefused"),
            Expect(
                7,
                "AcemqSidecarConfigReloadRefused",
                [_pod_labels() | {"result": "refused", "severity": "warning"}],
            ),
        ],
    ),
    Scenario(
        "reconnects: a flapping connection",
        {_series(RECONNECTS): "0x5 0+1x30"},
        [
            Expect(7, "AcemqSidecarReconnectFlapping"),
            Expect(12, "AcemqSidecarReconnectFlapping", [_pod_labels() | {"severity": "warning"}]),
        ],
    ),
    Scenario(
        "reconnects: one reconnect after a broker restart is not flapping",
        {_series(RECONNECTS): "0x5 1x30"},
        [Expect(30, "AcemqSidecarReconnectFlapping")],
    ),
    Scenario(
        "absent: no target of the release is scraped",
        {_series("up", job=OTHER_JOB): "1x20"},
        [Expect(10, "AcemqSidecarTargetAbsent", [ABSENT_LABELS])],
    ),
    Scenario(
        "absent: the release's targets are down",
        {_series("up", pod=pod): "1x3 0x20" for pod in PODS[:2]},
        [
            Expect(3, "AcemqSidecarTargetAbsent"),
            Expect(12, "AcemqSidecarTargetAbsent", [ABSENT_LABELS]),
        ],
    ),
    Scenario(
        "absent: one pod of three scraped is not absent",
        {
            _series("up", pod=PODS[0]): "0x20",
            _series("up", pod=PODS[1]): "0x20",
            _series("up", pod=PODS[2]): "1x20",
        },
        [Expect(15, "AcemqSidecarTargetAbsent")],
    ),
]


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    """The rendered PrometheusRule's spec, as a Prometheus rules file."""
    spec: dict[str, Any] = only(render(read_values(FULL_VALUES)), "PrometheusRule").body["spec"]
    return {"groups": spec["groups"]}


def _rules_by_alert(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}


_LABEL_REF = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def _annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations as Prometheus expands them for an alert with ``labels``."""

    def label(match: re.Match[str]) -> str:
        assert match[1] in labels, (
            f"{rule['alert']}: an annotation uses $labels.{match[1]}, which the alert does not"
            f" carry (it has {sorted(labels)}); Prometheus would write <no value>"
        )
        return labels[match[1]]

    annotations = rule.get("annotations", {})
    assert "{{ $value" not in str(annotations), "expected values are not modelled here"
    return {key: _LABEL_REF.sub(label, value) for key, value in annotations.items()}


def _unit_tests(rules: dict[str, Any], scenarios: list[Scenario] | None = None) -> dict[str, Any]:
    by_alert = _rules_by_alert(rules)
    tests = []
    for scenario in SCENARIOS if scenarios is None else scenarios:
        checks = []
        for expect in scenario.expect:
            rule = by_alert[expect.alert]
            alerts = []
            for fired in expect.fired:
                labels = {"severity": rule["labels"]["severity"]} | fired
                alerts.append({"exp_labels": labels, "exp_annotations": _annotations(rule, labels)})
            checks.append(
                {"eval_time": f"{expect.at}m", "alertname": expect.alert, "exp_alerts": alerts}
            )
        tests.append(
            {
                "name": scenario.name,
                "interval": "1m",
                "input_series": [
                    {"series": series, "values": values}
                    for series, values in scenario.series.items()
                ],
                "alert_rule_test": checks,
            }
        )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_checks_the_rendered_rules(rules: dict[str, Any], tmp_path: Path) -> None:
    """The rules parse, every expression is valid PromQL, every template expands."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    result = _run("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_behaves_as_documented(rules: dict[str, Any], tmp_path: Path) -> None:
    """`promtool test rules`: each scenario's alerts fire, and only those, at each time."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(_unit_tests(rules), sort_keys=False), encoding="utf-8"
    )
    result = _run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case(rules: dict[str, Any]) -> None:
    """A new alert without scenarios, or one only ever tested quiet, fails here."""
    fired = {e.alert for s in SCENARIOS for e in s.expect if e.fired}
    quiet = {e.alert for s in SCENARIOS for e in s.expect if not e.fired}
    alerts = set(_rules_by_alert(rules))
    assert alerts == fired, f"never seen firing: {alerts - fired}; unknown: {fired - alerts}"
    assert alerts == quiet, f"never seen quiet: {alerts - quiet}"


# Where no pod need run (KEDA at zero, replicas 0, a Job between runs) TargetAbsent must
# not fire on no target at all, only on targets that exist and are all down.
SCALED_TO_ZERO = [
    Scenario(
        "absent, scaled to zero: no target at all is quiet",
        {_series("up", job=OTHER_JOB): "1x20"},
        [Expect(10, "AcemqSidecarTargetAbsent")],
    ),
    Scenario(
        "absent, scaled to zero: targets that are all down fire",
        {_series("up", pod=pod): "1x3 0x20" for pod in PODS[:2]},
        [
            Expect(3, "AcemqSidecarTargetAbsent"),
            Expect(12, "AcemqSidecarTargetAbsent", [ABSENT_LABELS]),
        ],
    ),
    Scenario(
        "absent, scaled to zero: one target up is quiet",
        {_series("up", pod=PODS[0]): "0x20", _series("up", pod=PODS[1]): "1x20"},
        [Expect(15, "AcemqSidecarTargetAbsent")],
    ),
]


def test_target_absent_is_quiet_when_no_pod_need_run(tmp_path: Path) -> None:
    values = read_values(FULL_VALUES) | {"keda": {"enabled": True, "minReplicaCount": 0}}
    spec = only(render(values), "PrometheusRule").body["spec"]
    rules = {"groups": spec["groups"]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    tests = _unit_tests(rules, SCALED_TO_ZERO)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = _run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- routing: per-alert labels and annotations, more rules, the rules' namespace ----------


def _rendered_rule(changes: dict[str, Any]) -> dict[str, Any]:
    values = read_values(FULL_VALUES)
    alerts = values["prometheusRule"]["alerts"]
    for name, alert in changes.pop("alerts", {}).items():
        alerts[name] = alerts.get(name, {}) | alert
    values["prometheusRule"] = values["prometheusRule"] | changes
    body: dict[str, Any] = only(render(values), "PrometheusRule").body
    return body


def test_each_alert_takes_labels_and_annotations_of_its_own() -> None:
    alerts = {
        "drift": {"labels": {"team": "payments", "severity": "ticket"}},
        "routeDown": {
            "annotations": {"dashboard": "https://grafana.example.com/d/acemq", "summary": "Mine"}
        },
    }
    rule = _rendered_rule({"alerts": alerts})
    by_alert = _rules_by_alert({"groups": rule["spec"]["groups"]})
    drift = by_alert["AcemqSidecarContractDrift"]
    assert drift["labels"] == {"team": "payments", "severity": "ticket"}
    route_down = by_alert["AcemqSidecarRouteDown"]
    assert route_down["labels"] == {"severity": "page"}  # ci/full-values.yaml's
    assert route_down["annotations"]["dashboard"] == "https://grafana.example.com/d/acemq"
    assert route_down["annotations"]["summary"] == "Mine"
    assert route_down["annotations"]["runbook_url"].endswith("#acemqsidecarroutedown")
    assert "team" not in by_alert["AcemqSidecarQuarantining"]["labels"]


def test_additional_rules_join_the_group_and_promtool_accepts_them(tmp_path: Path) -> None:
    extra = [
        {
            "record": "acemq:relayed:rate5m",
            "expr": (
                "sum by (namespace, route)"
                ' (rate(acemq_sidecar_messages_total{outcome="relayed"}[5m]))'
            ),
        },
        {
            "alert": "AcemqRelayStalled",
            "expr": "acemq:relayed:rate5m == 0",
            "for": "30m",
            "labels": {"severity": "warning"},
        },
    ]
    rule = _rendered_rule({"additionalRules": extra})
    [group] = rule["spec"]["groups"]
    assert group["rules"][-2:] == extra
    rules = {"groups": rule["spec"]["groups"]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    result = _run("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_go_where_prometheus_reads_them_and_still_select_the_release() -> None:
    rule = _rendered_rule({"namespace": "monitoring"})
    assert rule["metadata"]["namespace"] == "monitoring"
    for alert in rule["spec"]["groups"][0]["rules"]:
        assert f'namespace="{NAMESPACE}"' in alert["expr"], alert["alert"]
    assert _rendered_rule({})["metadata"]["namespace"] == NAMESPACE


def test_target_absent_summary_has_no_literal_quotes() -> None:
    rule = _rendered_rule({})
    by_alert = _rules_by_alert({"groups": rule["spec"]["groups"]})
    annotations = by_alert["AcemqSidecarTargetAbsent"]["annotations"]
    assert annotations["summary"] == f"No sidecar of acemq-relay in {NAMESPACE} is scraped"
    for alert in by_alert.values():
        for key, text in alert["annotations"].items():
            assert not text.startswith(("'", '"')), (alert["alert"], key, text)


# --- rate thresholds: drift and quarantine fire only at minRate a second over window ------

RATE_THRESHOLD = [
    Scenario(
        "threshold: one violation a minute stays under 0.1/s",
        {_series(VIOLATIONS, route="orders", kind="app_reserved", header="x"): "0x5 0+1x30"},
        [Expect(20, "AcemqSidecarContractDrift")],
    ),
    Scenario(
        "threshold: one violation counted before the first scrape is quiet",
        {_series(VIOLATIONS, route="orders", kind="legacy_name", header="x"): "2x20"},
        [Expect(3, "AcemqSidecarContractDrift")],
    ),
    Scenario(
        "threshold: 12 violations a minute on two pods (0.2/s) fire after `for`",
        {
            _series(VIOLATIONS, pod=pod, route="orders", kind="app_reserved", header="x"): (
                "0x5 0+6x30"
            )
            for pod in PODS[:2]
        },
        [
            Expect(8, "AcemqSidecarContractDrift"),
            Expect(
                20,
                "AcemqSidecarContractDrift",
                [{"namespace": NAMESPACE, "route": "orders", "kind": "app_reserved"}],
            ),
        ],
    ),
    Scenario(
        "threshold: a trickle of quarantined messages is quiet",
        {_series(MESSAGES, route="orders", outcome="quarantined"): "0x5 0+2x30"},
        [Expect(20, "AcemqSidecarQuarantining")],
    ),
    Scenario(
        "threshold: a burst of quarantined messages fires",
        {_series(MESSAGES, route="orders", outcome="quarantined"): "0x5 0+30x30"},
        [
            Expect(8, "AcemqSidecarQuarantining"),
            Expect(20, "AcemqSidecarQuarantining", [{"namespace": NAMESPACE, "route": "orders"}]),
        ],
    ),
]


def test_rate_thresholds_hold_drift_and_quarantine_back(tmp_path: Path) -> None:
    """minRate 0.1/s over 10m with for 5m: a trickle is quiet, a flood fires once it held."""
    threshold = {"minRate": 0.1, "window": "10m", "for": "5m"}
    values = read_values(FULL_VALUES)
    values["prometheusRule"]["alerts"] = values["prometheusRule"]["alerts"] | {
        "drift": threshold,
        "quarantine": threshold,
    }
    spec = only(render(values), "PrometheusRule").body["spec"]
    rules = {"groups": spec["groups"]}
    by_alert = _rules_by_alert(rules)
    assert "[10m]" in by_alert["AcemqSidecarContractDrift"]["expr"]
    assert by_alert["AcemqSidecarQuarantining"]["expr"].endswith("> 0.1")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    tests = _unit_tests(rules, RATE_THRESHOLD)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = _run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _run_scenarios(rules: dict[str, Any], scenarios: list[Scenario], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    tests = _unit_tests(rules, scenarios)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = _run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- scrape gaps: a counter is new by its _created time, not by a missing sample ----------

# A series begun an hour before the test: old, whatever its value.
AN_HOUR_AGO = "-3600"
# Three failed scrapes (Prometheus writes staleness markers) on a series that does not
# change across them, in its counter and in its _created alike.
GAP = "5x10 stale stale stale 5x20"
GAP_CREATED = f"{AN_HOUR_AGO}x10 stale stale stale {AN_HOUR_AGO}x20"

SCRAPE_GAPS = [
    Scenario(
        "gap: quarantined messages counted long ago, three scrapes lost",
        _counter(MESSAGES, GAP, created=GAP_CREATED, route="orders", outcome="quarantined"),
        [Expect(at, "AcemqSidecarQuarantining") for at in (2, 15, 16, 17, 18, 19, 25)],
    ),
    Scenario(
        "gap: drift counted long ago, three scrapes lost",
        _counter(
            VIOLATIONS,
            GAP,
            created=GAP_CREATED,
            route="orders",
            kind="legacy_name",
            header="x-acemq-replay-count",
        ),
        [Expect(at, "AcemqSidecarContractDrift") for at in (2, 15, 16, 17, 18, 19, 25)],
    ),
    Scenario(
        "gap: a reload refused long ago, one scrape lost",
        _counter(
            RELOADS,
            "1x20 stale 1x30",
            created=f"{AN_HOUR_AGO}x20 stale {AN_HOUR_AGO}x30",
            result="refused",
        ),
        [Expect(at, "AcemqSidecarConfigReloadRefused") for at in (5, 21, 30, 36, 40)],
    ),
    Scenario(
        "gap: a new pod that quarantined before its first scrape still fires",
        _counter(
            MESSAGES,
            "_x10 2x20",
            created="_x10 590x20",
            pod=PODS[1],
            route="orders",
            outcome="quarantined",
        ),
        [
            Expect(12, "AcemqSidecarQuarantining", [{"namespace": NAMESPACE, "route": "orders"}]),
            Expect(20, "AcemqSidecarQuarantining"),
        ],
    ),
    Scenario(
        "gap: a new pod that drifted before its first scrape still fires",
        _counter(
            VIOLATIONS,
            "_x10 1x20",
            created="_x10 590x20",
            pod=PODS[1],
            route="orders",
            kind="unknown_reserved",
            header="x-acemq-*",
        ),
        [
            Expect(
                12,
                "AcemqSidecarContractDrift",
                [{"namespace": NAMESPACE, "route": "orders", "kind": "unknown_reserved"}],
            ),
            Expect(20, "AcemqSidecarContractDrift"),
        ],
    ),
    Scenario(
        "gap: a new pod that refused a reload before its first scrape still fires",
        _counter(RELOADS, "_x10 1x30", created="_x10 590x30", pod=PODS[1], result="refused"),
        [
            Expect(
                11,
                "AcemqSidecarConfigReloadRefused",
                [_pod_labels(PODS[1]) | {"result": "refused", "severity": "warning"}],
            ),
            Expect(26, "AcemqSidecarConfigReloadRefused"),
        ],
    ),
]


def test_a_scrape_gap_does_not_make_an_old_counter_new(
    rules: dict[str, Any], tmp_path: Path
) -> None:
    """Failed scrapes (a pod busy, a network blip) of a counter that did not move alert nobody.

    Quarantining and ContractDrift used to fire minutes after three lost scrapes, and
    ConfigReloadRefused 15 minutes after a single one, for a count that was long known. A
    pod that counted before its first scrape still alerts: its series' _created is recent.
    """
    _run_scenarios(rules, SCRAPE_GAPS, tmp_path)


# --- TargetAbsent: one alert per release, with the namespace an AlertmanagerConfig routes --


def test_target_absent_is_one_alert_per_release_each_with_its_namespace(tmp_path: Path) -> None:
    """Two releases in one namespace and one in another, none scraped: three alerts.

    Each has its release's namespace and name (absent() keeps no label), also with the
    rules in a monitoring namespace: a namespaced AlertmanagerConfig, which only receives
    alerts carrying its namespace, gets its own team's.
    """
    releases = [(RELEASE, NAMESPACE), ("shop", NAMESPACE), (RELEASE, "payments")]
    values = read_values(FULL_VALUES)
    del values["fullnameOverride"]
    values["prometheusRule"]["namespace"] = "monitoring"
    files, expected = [], []
    for index, (release, namespace) in enumerate(releases):
        spec = only(render(values, release=release, namespace=namespace), "PrometheusRule")
        rules = {"groups": spec.body["spec"]["groups"]}
        name = f"rules-{index}.yaml"
        (tmp_path / name).write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
        files.append(name)
        rule = _rules_by_alert(rules)["AcemqSidecarTargetAbsent"]
        labels = {"namespace": namespace, "release": release, "severity": "warning"}
        expected.append({"exp_labels": labels, "exp_annotations": _annotations(rule, labels)})
    tests = {
        "rule_files": files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "no release is scraped",
                "interval": "1m",
                "input_series": [
                    {"series": _series("up", job="kubernetes-nodes"), "values": "1x20"}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "AcemqSidecarTargetAbsent",
                        "exp_alerts": expected,
                    }
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = _run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the PrometheusRule's name: unique where many releases' rules meet --------------------

K8S_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _rule_metadata(release: str, namespace: str, rule_namespace: str) -> dict[str, Any]:
    values = read_values(FULL_VALUES)
    del values["fullnameOverride"]
    values["prometheusRule"]["namespace"] = rule_namespace
    rule = only(render(values, release=release, namespace=namespace), "PrometheusRule")
    metadata: dict[str, Any] = rule.body["metadata"]
    return metadata


@pytest.mark.parametrize(
    ("release", "namespaces"),
    [
        ("orders", ("team-a", "team-b")),
        # Names past 63 characters, alike for their first 63: cut, and still two.
        ("r" * 53, ("team-" + "a" * 58, "team-" + "a" * 57 + "b")),
    ],
)
def test_one_release_name_in_two_namespaces_gives_two_rules_in_monitoring(
    release: str, namespaces: tuple[str, str]
) -> None:
    """With prometheusRule.namespace: monitoring, the same release in two team namespaces.

    Both PrometheusRules land in monitoring; one name would make the second install fail
    (the object belongs to the other release) or replace the first team's alerts.
    """
    first, second = (_rule_metadata(release, ns, "monitoring") for ns in namespaces)
    assert first["namespace"] == second["namespace"] == "monitoring"
    assert first["name"] != second["name"]
    for metadata in (first, second):
        assert len(metadata["name"]) <= 63, metadata["name"]
        assert K8S_LABEL.match(metadata["name"]), metadata["name"]


def test_the_rule_keeps_the_full_name_in_the_release_namespace() -> None:
    """Where the release is (prometheusRule.namespace unset or the same), no suffix."""
    assert _rule_metadata("orders", "team-a", "")["name"] == "orders-acemq-sidecar"
    assert _rule_metadata("orders", "team-a", "team-a")["name"] == "orders-acemq-sidecar"
    assert _rule_metadata("orders", "team-a", "monitoring")["name"] == "orders-acemq-sidecar-team-a"
