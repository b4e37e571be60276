"""The metrics module: names, labels, zero-initialised series and what each call counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from sidecar import contract
from sidecar.contract import Kind, Violation
from sidecar.observe import metrics as metrics_module
from sidecar.observe.metrics import DRIFT_VIOLATIONS, Metrics, ReloadResult
from sidecar.settle.settlement import Outcome
from sidecar.wire import FieldValue
from tests.compiled import is_compiled

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

P = "acemq_sidecar_"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(registry, version="1.2.3", contract="1")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(P + name, labels)


def route_series(route: str) -> list[tuple[str, dict[str, str]]]:
    """Every (sample name, labels) add_route promises, as the Helm chart reads them."""
    series = [("messages_total", {"route": route, "outcome": o.value}) for o in Outcome]
    series += [
        ("violations_total", {"route": route, "kind": kind, "header": header})
        for kind, header in DRIFT_VIOLATIONS
    ]
    series += [
        ("in_flight", {"route": route}),
        ("route_up", {"route": route}),
        ("trace_context_invalid_total", {"route": route}),
        ("relay_seconds_count", {"route": route}),
        ("relay_seconds_sum", {"route": route}),
        ("relay_seconds_bucket", {"route": route, "le": "+Inf"}),
        ("relay_seconds_bucket", {"route": route, "le": "0.0005"}),
        ("relay_seconds_bucket", {"route": route, "le": "10.0"}),
    ]
    return series


def test_constructor_creates_process_series_at_zero(registry: CollectorRegistry) -> None:
    """Alerts on broker_connected == 0 and reload failures need the series before any event."""
    Metrics(registry, version="1.2.3", contract="1")
    assert value(registry, "broker_connected") == 0
    assert value(registry, "reconnects_total") == 0
    for result in ReloadResult:
        assert value(registry, "config_reloads_total", result=result.value) == 0


def test_build_info_is_one_with_version_and_contract(registry: CollectorRegistry) -> None:
    """build_info names the running version and contract, with value 1."""
    Metrics(registry, version="1.2.3", contract="1")
    assert value(registry, "build_info", version="1.2.3", contract="1") == 1


def test_no_route_series_before_add_route(registry: CollectorRegistry) -> None:
    """The constructor knows no route, so it creates no per-route series."""
    Metrics(registry, version="1.2.3", contract="1")
    for name, labels in route_series("orders"):
        assert registry.get_sample_value(P + name, labels) is None, name


def test_add_route_creates_every_route_series_at_zero(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """Every series is present at zero from the first scrape, so rate() and alerts see it."""
    metrics.add_route("orders")
    for name, labels in route_series("orders"):
        assert registry.get_sample_value(P + name, labels) == 0, (name, labels)


def test_drift_series_match_the_contracts_labels() -> None:
    """The zero-initialised drift series use the exact labels the contract emits."""
    expected = {
        (Kind.APP_RESERVED, contract.UNKNOWN_RESERVED_LABEL),
        (Kind.UNKNOWN_RESERVED, contract.UNKNOWN_RESERVED_LABEL),
        *((Kind.LEGACY_NAME, legacy) for legacy in contract.LEGACY_NAMES),
        (Kind.UNPORTABLE, contract.APP_LABEL),
    }
    assert set(DRIFT_VIOLATIONS) == expected


def test_add_route_twice_keeps_the_counts(metrics: Metrics, registry: CollectorRegistry) -> None:
    """A reload that keeps a route must not reset its counters."""
    metrics.add_route("orders")
    metrics.observe_message("orders", Outcome.RELAYED, 0.01)
    metrics.add_route("orders")
    assert value(registry, "messages_total", route="orders", outcome="relayed") == 1


@pytest.mark.parametrize("outcome", list(Outcome))
def test_observe_message_counts_one_outcome_and_observes_latency(
    metrics: Metrics, registry: CollectorRegistry, outcome: Outcome
) -> None:
    """One message moves its outcome's counter and the route's histogram, nothing else."""
    metrics.add_route("orders")
    metrics.add_route("billing")
    metrics.observe_message("orders", outcome, 0.003)
    for other in Outcome:
        expected = 1 if other is outcome else 0
        assert value(registry, "messages_total", route="orders", outcome=other) == expected
        assert value(registry, "messages_total", route="billing", outcome=other) == 0
    assert value(registry, "relay_seconds_count", route="orders") == 1
    assert value(registry, "relay_seconds_sum", route="orders") == pytest.approx(0.003)
    assert value(registry, "relay_seconds_bucket", route="orders", le="0.0025") == 0
    assert value(registry, "relay_seconds_bucket", route="orders", le="0.005") == 1
    assert value(registry, "relay_seconds_count", route="billing") == 0


def test_relay_seconds_buckets_are_upper_bounds_inclusive_and_cumulative(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """As a prometheus_client Histogram counts: a value on a bound is in that bucket (le)."""
    for seconds in (0.0005, 0.0005001, 10.0, 11.0):
        metrics.observe_message("orders", Outcome.RELAYED, seconds)
    assert value(registry, "relay_seconds_bucket", route="orders", le="0.0005") == 1
    assert value(registry, "relay_seconds_bucket", route="orders", le="0.001") == 2
    assert value(registry, "relay_seconds_bucket", route="orders", le="5.0") == 2
    assert value(registry, "relay_seconds_bucket", route="orders", le="10.0") == 3
    assert value(registry, "relay_seconds_bucket", route="orders", le="+Inf") == 4
    assert value(registry, "relay_seconds_count", route="orders") == 4
    assert value(registry, "relay_seconds_sum", route="orders") == pytest.approx(21.0010001)
    assert value(registry, "messages_total", route="orders", outcome="relayed") == 4


def test_the_plain_series_expose_created_as_prometheus_client_does(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    metrics.add_route("orders")
    metrics.count_violations("orders", [("coerced", "x-acemq-attempt")], producer="billing")
    for name, labels in (
        ("messages_created", {"route": "orders", "outcome": "relayed"}),
        ("relay_seconds_created", {"route": "orders"}),
        ("violations_created", {"route": "orders", "kind": "coerced", "header": "x-acemq-attempt"}),
        (
            "producer_violations_created",
            {"route": "orders", "producer": "billing", "kind": "coerced"},
        ),
        ("retried_copies_created", {"route": "orders"}),
    ):
        assert (value(registry, name, **labels) or 0) > 0, name


def test_the_plain_series_drop_created_when_prometheus_client_does(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """disable_created_metrics (or PROMETHEUS_DISABLE_CREATED_SERIES) holds for them too."""
    metrics.add_route("orders")
    metrics.count_violations("orders", [("coerced", "x-acemq-attempt")], producer="billing")
    prometheus_client.disable_created_metrics()
    try:
        created = [s.name for m in registry.collect() for s in m.samples if "_created" in s.name]
    finally:
        prometheus_client.enable_created_metrics()
    assert created == []


def test_count_violations_counts_each_pair(metrics: Metrics, registry: CollectorRegistry) -> None:
    """Each (kind, header) pair adds one to its own series; repeated pairs add again."""
    metrics.add_route("orders")
    metrics.count_violations(
        "orders",
        [
            Violation(Kind.LEGACY_NAME, "x-acemq-replayed-at"),
            ("coerced", "acemq-attempt"),
            ("coerced", "acemq-attempt"),
        ],
    )
    assert (
        value(
            registry,
            "violations_total",
            route="orders",
            kind="legacy_name",
            header="x-acemq-replayed-at",
        )
        == 1
    )
    assert (
        value(registry, "violations_total", route="orders", kind="coerced", header="acemq-attempt")
        == 2
    )
    assert (
        value(
            registry,
            "violations_total",
            route="orders",
            kind="legacy_name",
            header="x-acemq-replay-count",
        )
        == 0
    )


def test_count_violations_enum_and_string_kinds_share_a_series(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """A Kind member and its string value are one label value, not two series."""
    metrics.count_violations("orders", [(Kind.MIRROR, "acemq-id"), ("mirror", "acemq-id")])
    assert (
        value(registry, "violations_total", route="orders", kind="mirror", header="acemq-id") == 2
    )


def test_count_violations_with_none_changes_nothing(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """The common case, a clean message, leaves every sample as it was."""
    metrics.add_route("orders")
    before = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _samples(registry)}
    metrics.count_violations("orders", ())
    metrics.count_violations("orders", iter(()))
    after = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _samples(registry)}
    assert after == before


def test_in_flight_and_route_up(metrics: Metrics, registry: CollectorRegistry) -> None:
    """in_flight follows the deltas; route_up is 1 while consuming and 0 after."""
    metrics.add_route("orders")
    metrics.add_in_flight("orders", 3)
    metrics.add_in_flight("orders", -1)
    assert value(registry, "in_flight", route="orders") == 2
    metrics.set_route_up("orders", up=True)
    assert value(registry, "route_up", route="orders") == 1
    metrics.set_route_up("orders", up=False)
    assert value(registry, "route_up", route="orders") == 0


def test_process_wide_series(metrics: Metrics, registry: CollectorRegistry) -> None:
    """broker_connected, reconnects_total and config_reloads_total move as called."""
    metrics.set_broker_connected(connected=True)
    assert value(registry, "broker_connected") == 1
    metrics.set_broker_connected(connected=False)
    assert value(registry, "broker_connected") == 0
    metrics.count_reconnect()
    metrics.count_reconnect()
    assert value(registry, "reconnects_total") == 2
    metrics.count_reload(ReloadResult.REFUSED)
    assert value(registry, "config_reloads_total", result="refused") == 1
    assert value(registry, "config_reloads_total", result="applied") == 0
    assert value(registry, "trace_spans_dropped_total", reason="queue_full") == 0
    metrics.count_spans_dropped("export_failed", 3)
    assert value(registry, "trace_spans_dropped_total", reason="export_failed") == 3


def test_remove_route_removes_its_series_only(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """A route a reload deleted disappears from the scrape; other routes are untouched."""
    metrics.add_route("orders")
    metrics.add_route("billing")
    metrics.count_violations("orders", [("coerced", "acemq-attempt")])
    metrics.remove_route("orders")
    assert not [s for s in _samples(registry) if s.labels.get("route") == "orders"]
    for name, labels in route_series("billing"):
        assert registry.get_sample_value(P + name, labels) == 0, (name, labels)


def test_remove_route_then_add_route_starts_from_zero(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """A route deleted and later re-added starts afresh, with every series at zero."""
    metrics.add_route("orders")
    metrics.observe_message("orders", Outcome.RELAYED, 0.01)
    metrics.count_violations("orders", [("coerced", "acemq-attempt")])
    metrics.remove_route("orders")
    metrics.remove_route("orders")  # idempotent
    metrics.add_route("orders")
    for name, labels in route_series("orders"):
        assert registry.get_sample_value(P + name, labels) == 0, (name, labels)
    assert (
        value(registry, "violations_total", route="orders", kind="coerced", header="acemq-attempt")
        is None
    )


def test_unknown_route_is_created_on_first_use(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """A late observation for a route not (or no longer) added still counts, with its zeros."""
    metrics.observe_message("late", Outcome.QUARANTINED, 0.5)
    assert value(registry, "messages_total", route="late", outcome="quarantined") == 1
    assert value(registry, "messages_total", route="late", outcome="relayed") == 0
    assert value(registry, "route_up", route="late") == 0


def test_only_the_documented_metric_names_exist(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """The scrape exposes exactly docs/metrics.md's metrics, all under the acemq_sidecar_ prefix."""
    metrics.add_route("orders")
    names = {m.name for m in registry.collect()}
    assert names == {
        P + "messages",
        P + "violations",
        P + "producer_violations",
        P + "relay_seconds",
        P + "in_flight",
        P + "route_up",
        P + "broker_connected",
        P + "reconnects",
        P + "config_reloads",
        P + "build_info",
        P + "retried_copies",
        P + "return_retries",
        P + "dead_lettered",
        P + "broker_blocked",
        P + "trace_context_invalid",
        P + "trace_spans_dropped",
    }


def test_nothing_is_registered_on_the_global_registry() -> None:
    """Constructing Metrics twice would otherwise fail with duplicate registrations."""
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    first = Metrics(CollectorRegistry(), version="1.2.3", contract="1")
    second = Metrics(CollectorRegistry(), version="1.2.3", contract="1")
    first.add_route("orders")
    second.add_route("orders")
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not [n for n in before if n.startswith(P)]


def _samples(registry: CollectorRegistry) -> list[Sample]:
    return [s for m in registry.collect() for s in m.samples if not s.name.endswith("_created")]


@pytest.mark.skipif(
    is_compiled(metrics_module),
    reason="replaces a method, which a compiled class does not let be replaced; plain runs it",
)
def test_counting_a_seen_violation_resolves_no_label(
    metrics: Metrics, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per message, a violation costs a dictionary look-up: .labels() runs once per triple."""
    metrics.add_route("orders")
    metrics.count_violations("orders", [("coerced", "x-acemq-attempt")])
    calls: list[tuple[object, ...]] = []
    resolve = metrics._drift._violations.labels

    def counting(*args: str, **kwargs: str) -> object:
        calls.append(args)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(metrics._drift._violations, "labels", counting)
    for _ in range(100):
        metrics.count_violations(
            "orders",
            [
                ("coerced", "x-acemq-attempt"),
                (Kind.COERCED, "x-acemq-attempt"),
                (Kind.UNKNOWN_RESERVED, "x-acemq-*"),  # zero-initialised by add_route
            ],
        )
    metrics.count_violations("orders", [("mirror", "message_id")])  # a new triple: once
    metrics.count_violations("orders", [("mirror", "message_id")])
    assert calls == [("orders", "mirror", "message_id")]
    assert (
        value(
            registry, "violations_total", route="orders", kind="coerced", header="x-acemq-attempt"
        )
        == 201
    )


def test_violation_labels_never_carry_a_raw_header_name(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    """Unknown reserved names and application headers reach the metric only as their labels."""
    unknown = [f"x-acemq-custom-{i}" for i in range(5)]
    headers: dict[str, FieldValue] = dict.fromkeys(unknown, "v")
    headers |= {"x-tenant-secret": None, "x-acemq-attempt": " 2 "}
    for publishers in contract.Publishers:
        verdict = contract.normalise(
            "orders",
            {"message_id": "m-1"},
            headers,
            policy=contract.Policy(publishers=publishers),
            now_ms=1_790_000_000_000,
            new_id=lambda: "id-1",
        )
        metrics.count_violations(str(publishers), verdict.violations)
    labels = {
        sample.labels["header"]
        for sample in _samples(registry)
        if sample.name == P + "violations_total"
    }
    allowed = {
        *contract.CONTRACT_HEADERS,
        contract.UNKNOWN_RESERVED_LABEL,
        contract.APP_LABEL,
        "message_id",
        "reply_to",
        "user_id",
    }
    assert labels <= allowed, labels - allowed
    assert contract.APP_LABEL in labels  # the void application header was counted as "app"
    assert (
        value(registry, "violations_total", route="apps", kind="app_reserved", header="x-acemq-*")
        == 5
    )


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("messages_total", [o.value for o in Outcome]),
        ("config_reloads_total", [r.value for r in ReloadResult]),
        ("violations_total", ["kind", "x-acemq-*", "app"]),
        ("route_up", ["/readyz"]),
        ("in_flight", ["prefetch"]),
        ("relay_seconds", ["confirm"]),
        ("build_info", ["version", "contract"]),
    ],
)
def test_help_tells_an_operator_what_the_number_means(
    metrics: Metrics, registry: CollectorRegistry, name: str, words: list[str]
) -> None:
    """The HELP line explains the labels' values and what to look at, not just the name."""
    metrics.add_route("orders")
    family = name.removesuffix("_total")
    (documentation,) = [m.documentation for m in registry.collect() if m.name == P + family]
    for word in words:
        assert word in documentation, (word, documentation)


def test_every_metric_has_help_text(metrics: Metrics, registry: CollectorRegistry) -> None:
    """No metric ships with an empty or one-word HELP."""
    metrics.add_route("orders")
    for family in registry.collect():
        assert len(family.documentation.split()) >= 8, (family.name, family.documentation)


def test_drift_by_producer_is_bounded_per_route_under_ten_thousand_origins() -> None:
    """10,000 distinct producers on one route: at most the limit, plus other, as series."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="1.2.3", contract="1.1", producers_per_route=20)
    metrics.add_route("orders")
    for i in range(10_000):
        metrics.count_violations(
            "orders", [("legacy_name", "x-acemq-replayed-at")], producer=f"svc-{i}"
        )
    metrics.count_violations("billing", [("defaulted", "x-acemq-type")], producer="svc-1")
    producers = {
        sample.labels["producer"]
        for family in registry.collect()
        if family.name == P + "producer_violations"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["route"] == "orders"
    }
    assert len(producers) == 21
    assert "other" in producers
    assert {f"svc-{i}" for i in range(20)} <= producers
    assert (
        value(
            registry,
            "producer_violations_total",
            route="orders",
            producer="other",
            kind="legacy_name",
        )
        == 9_980
    )
    assert (
        value(
            registry,
            "producer_violations_total",
            route="billing",
            producer="svc-1",
            kind="defaulted",
        )
        == 1
    )


def test_a_removed_route_forgets_its_producers() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, version="1.2.3", contract="1.1", producers_per_route=1)
    metrics.add_route("orders")
    metrics.count_violations("orders", [("coerced", "x-acemq-attempt")], producer="a")
    metrics.remove_route("orders")
    metrics.count_violations("orders", [("coerced", "x-acemq-attempt")], producer="b")
    assert (
        value(registry, "producer_violations_total", route="orders", producer="a", kind="coerced")
        is None
    )
    assert (
        value(registry, "producer_violations_total", route="orders", producer="b", kind="coerced")
        == 1
    )


def test_a_plain_counter_refuses_the_wrong_number_of_labels(metrics: Metrics) -> None:
    with pytest.raises(ValueError, match="violations: expected labels"):
        metrics._drift._violations.labels("orders", "coerced")
