"""The chart's tracing values: the OTEL_* variables they set, the Secret for headers, refusals."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.conftest import (
    MINIMAL_VALUES,
    Manifest,
    only,
    read_values,
    render,
    routes_yaml,
    sidecar_container,
)

pytestmark = pytest.mark.deploy

COLLECTOR = "http://otel-collector.observability:4318"


def _values(tracing: dict[str, Any], **more: Any) -> dict[str, Any]:
    values = read_values(MINIMAL_VALUES)
    values["tracing"] = {**values.get("tracing", {}), **tracing}
    values.update(more)
    return values


def _env(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    pod = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    return {item["name"]: item for item in sidecar_container(pod).get("env", [])}


def test_tracing_is_off_by_default_and_sets_no_variable() -> None:
    env = _env(render(read_values(MINIMAL_VALUES)))
    assert not [name for name in env if name.startswith("OTEL_")]


def test_tracing_on_sets_the_standard_variables_and_the_headers_from_the_secret() -> None:
    values = _values(
        {
            "enabled": True,
            "endpoint": COLLECTOR,
            "samplerRatio": 0.05,
            "resourceAttributes": {"deployment.environment": "prod", "team": "payments"},
            "headersSecret": {"name": "honeycomb", "key": "otlp-headers"},
        }
    )
    manifests = render(values)
    env = _env(manifests)
    plain = {name: item.get("value") for name, item in env.items() if name.startswith("OTEL_")}
    assert plain == {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.05",
        "OTEL_SERVICE_NAME": "acemq-acemq-sidecar",  # the release's full name
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=payments",
        "OTEL_EXPORTER_OTLP_HEADERS": None,
    }
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "honeycomb",
        "key": "otlp-headers",
    }
    for manifest in manifests:  # the API key stays in its Secret
        if manifest.kind == "ConfigMap":
            assert "otlp-headers" not in str(manifest.body)


def test_the_route_maps_tracing_section_is_rendered_and_checked() -> None:
    values = _values({})
    values["routeMap"] = {**values["routeMap"], "tracing": {"link": "links"}}
    route_map = yaml.safe_load(routes_yaml(render(values)))
    assert route_map["tracing"] == {"link": "links"}
    values["routeMap"]["tracing"] = {"link": "parents"}
    with pytest.raises(helm_python.HelmValuesError, match="tracing"):
        render(values)


@pytest.mark.parametrize(
    "tracing",
    [
        {"protocol": "http/json"},
        {"samplerRatio": 1.5},
        {"endpoint": "otel-collector:4318"},
        {"headersSecret": {"name": "Not_A_Name", "key": "headers"}},
        {"sampler": 0.1},
    ],
)
def test_bad_tracing_values_are_refused(tracing: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="tracing"):
        render(_values(tracing))


def test_tracing_on_without_an_endpoint_is_refused_with_what_to_set() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"tracing\.endpoint"):
        render(_values({"enabled": True}))
