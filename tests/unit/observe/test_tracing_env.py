"""The OTEL_* variables as the SDK specification says them, and what the sidecar cannot honour.

Each variable a user sets either works as the specification says or is said at start
(``unhonoured``), never silently ignored.
"""

from __future__ import annotations

import logging

import pytest

from sidecar.observe import start_tracing, tracing_wanted
from sidecar.observe.tracing.export import QUEUE_SIZE, queue_size, sampling_for
from sidecar.observe.tracing.setup import unhonoured
from sidecar.routemap import TracingConfig
from tests.fakes.route import orders_route


@pytest.mark.parametrize(
    ("exporters", "on"),
    [
        ("otlp", True),
        ("otlp,console", True),
        (" console , OTLP ", True),
        ("console", False),
        ("none", False),
        ("", False),
    ],
)
def test_tracing_is_on_when_the_exporter_list_names_otlp(exporters: str, *, on: bool) -> None:
    assert tracing_wanted(None, {"OTEL_TRACES_EXPORTER": exporters}) is on


def test_what_the_sidecar_cannot_honour_is_said_one_line_each() -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp,console,zipkin",
        "OTEL_PROPAGATORS": "tracecontext,b3,jaeger",
        "OTEL_TRACES_SAMPLER": "xray",
    }
    said = unhonoured(env)
    assert len(said) == 3
    assert said[0].startswith("OTEL_TRACES_EXPORTER names console, zipkin:")
    assert said[1].startswith("OTEL_PROPAGATORS names b3, jaeger:")
    assert said[2].startswith("OTEL_TRACES_SAMPLER=xray is not a sampler the sidecar knows")


def test_what_it_honours_is_not_said() -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_PROPAGATORS": "tracecontext,baggage",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    }
    assert unhonoured(env) == []


def test_the_lines_are_logged_when_tracing_starts(caplog: pytest.LogCaptureFixture) -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"}
    with caplog.at_level(logging.WARNING, logger="sidecar.observe.tracing.setup"):
        tracing = start_tracing(None, env=env, metrics=orders_route().context.metrics, version="1")
    assert tracing is not None
    tracing.shutdown(timeout_s=1)
    assert "OTEL_TRACES_EXPORTER names console" in caplog.text


@pytest.mark.parametrize(
    ("sampler", "ratio", "expected"),
    [
        ("always_off", None, (False, 0.0)),
        ("traceidratio", "0.25", (False, 0.25)),
        ("parentbased_traceidratio", "0.5", (True, 0.5)),
        # Unknown: the specification's default, parentbased_always_on, not the argument.
        ("xray", "0.1", (True, 1.0)),
    ],
)
def test_the_sampler_variables(
    sampler: str, ratio: str | None, expected: tuple[bool, float]
) -> None:
    env = {"OTEL_TRACES_SAMPLER": sampler}
    if ratio is not None:
        env["OTEL_TRACES_SAMPLER_ARG"] = ratio
    sampling = sampling_for(TracingConfig(), env)
    assert (sampling.parent_based, sampling.ratio) == expected


@pytest.mark.parametrize(
    ("configured", "variable", "expected"),
    [
        (None, None, QUEUE_SIZE),
        (None, "4096", 4096),
        (512, "4096", 512),  # the route map wins
        (None, "nonsense", QUEUE_SIZE),
        (None, "0", QUEUE_SIZE),
    ],
)
def test_the_export_queue_is_the_maps_else_otel_bsp_max_queue_size(
    configured: int | None, variable: str | None, expected: int
) -> None:
    env = {} if variable is None else {"OTEL_BSP_MAX_QUEUE_SIZE": variable}
    assert queue_size(TracingConfig(max_queue_size=configured), env) == expected
