"""What `helm lint`, `helm show` and a chart index show: icon, README, and clean lint."""

from __future__ import annotations

from pathlib import Path

import helm_python
import pytest
import yaml

from tests.deploy.chart_readme import README, chart_readme
from tests.deploy.conftest import CHART, FULL_VALUES, MINIMAL_VALUES, read_values, render


@pytest.mark.parametrize("values_file", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_helm_lint_strict_has_nothing_to_say(values_file: Path) -> None:
    """Not even an INFO: the icon is there."""
    report = helm_python.lint(CHART, read_values(values_file), strict=True)
    assert report["messages"] == [], report["messages"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["icon"].startswith("data:image/svg+xml;base64,")


def test_the_chart_readme_is_generated_from_the_schema() -> None:
    """helm/acemq-sidecar/README.md: regenerate with `python -m tests.deploy.chart_readme`."""
    assert README.read_text(encoding="utf-8") == chart_readme(), (
        "helm/acemq-sidecar/README.md is stale: run .venv/bin/python -m tests.deploy.chart_readme"
    )


def test_the_readme_has_a_row_per_value_with_its_description() -> None:
    text = chart_readme()
    assert '| `broker.address.host` | string | `""` |' in text
    assert '| `keda.protocol` | one of "amqp", "http" | `"amqp"` |' in text
    assert "| `prometheusRule.alerts.drift.minRate` | number | `0` |" in text


def test_pod_annotations_cannot_repeat_the_checksum_keys() -> None:
    values = read_values(MINIMAL_VALUES) | {
        "podAnnotations": {"checksum/acemq-broker-secret": "rotated"}
    }
    with pytest.raises(helm_python.HelmRenderError) as refused:
        render(values)
    assert 'podAnnotations: "checksum/acemq-broker-secret" is the chart\'s own' in str(
        refused.value
    )
    assert "revision" in str(refused.value)
