"""The command line: conform and normalise, run in-process through main()."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path

import pytest

from sidecar import __version__
from sidecar.cli import YOUNG_COLLECTION_EVERY, build_parser, main, tune_collector
from sidecar.contract import CONTRACT_VERSION
from sidecar.contract import normaliser as normalise_module
from tests.unit.contract.test_contract_vectors import VECTORS


def test_conform_passes_the_conformance_vectors(capsys: pytest.CaptureFixture[str]) -> None:
    """conform on the vector file reports every vector passed and exits 0."""
    assert main(["conform", str(VECTORS)]) == 0
    count = len(json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"{count} passed, 0 failed"


def test_conform_reports_a_failing_vector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong expectation is named with its first difference, counted, and exits 1."""
    document = json.loads(VECTORS.read_text(encoding="utf-8"))
    broken = next(v for v in document["vectors"] if v["name"] == "no-acemq-headers-at-all")
    broken["expect"]["headers"]["x-acemq-type"] = "wrong"
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"format": 1, "vectors": [broken, document["vectors"][0]]}))
    assert main(["conform", str(path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "no-acemq-headers-at-all" in lines[0]
    assert "headers.x-acemq-type" in lines[0]
    assert lines[-1] == "1 passed, 1 failed"


def test_conform_unreadable_file_is_usage_error(tmp_path: Path) -> None:
    """A file that is not a vector file exits 2 rather than passing vacuously."""
    path = tmp_path / "v.json"
    path.write_text("{not json")
    assert main(["conform", str(path)]) == 2


def test_normalise_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """normalise prints the verdict in the vector expect format, types tagged."""
    message = {
        "routing_key": "orders",
        "properties": {"message_id": "m-1"},
        "headers": {"x-acemq-attempt": " 4 ", "price": {"$double": 0.1}},
        "now_ms": 1_790_000_000_000,
    }
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(message)))
    assert main(["normalise"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "relay"
    assert verdict["headers"]["x-acemq-attempt"] == {"$int32": 4}
    assert verdict["headers"]["x-acemq-first-seen"] == {"$int64": 1_790_000_000_000}
    assert verdict["headers"]["price"] == {"$double": 0.1}
    assert ["coerced", "x-acemq-attempt"] in verdict["violations"]


def test_normalise_rejects_bad_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Malformed input is a usage error with a message, not a traceback."""
    monkeypatch.setattr("sys.stdin", io.StringIO('{"headers": {"a": {"$int32": "x"}}}'))
    assert main(["normalise"]) == 2
    assert "$int32" in capsys.readouterr().err


def test_check_prints_the_routes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check validates a route map and prints each route, with the password masked."""
    path = tmp_path / "routes.yaml"
    path.write_text(
        "broker: {url: 'amqp://svc:s3cret@mq:5672/'}\n"
        "quarantine: {exchange: q}\n"
        "routes:\n"
        "  - {name: orders, from: staging.orders, to: {exchange: orders, routing_key: keep}}\n"
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "orders: staging.orders -> orders" in out
    assert "s3cret" not in out


def test_check_invalid_file_exits_2_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid route map exits 2 and names the file, the line and the key."""
    path = tmp_path / "routes.yaml"
    path.write_text("quarantine: {exchange: q}\nroutes:\n  - {name: a, frm: b}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: routes[0]" in err


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("collector:4318/?token=hunter2&tenant=t1", "collector:4318/?token=***&tenant=***"),
        (
            "ftp://bob:hunter2@collector:4318/v1?api_key=hunter2",
            "ftp://bob:***@collector:4318/v1?api_key=***",
        ),
        ("bob:hun/ter2@collector:4318", "bob:***@collector:4318"),
    ],
)
def test_check_masks_the_secrets_of_a_refused_tracing_endpoint(
    endpoint: str,
    shown: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A refused tracing.endpoint is shown interpolated, its password and query values masked."""
    monkeypatch.setenv("OTEL_URL", endpoint)
    path = tmp_path / "routes.yaml"
    path.write_text(
        "routes:\n  - {name: a, from: b, to: {exchange: c}}\ntracing:\n  endpoint: ${OTEL_URL}\n"
    )
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:4: tracing.endpoint: expected the collector's URL"), err
    assert f'got "{shown}"' in err
    assert "ter2" not in err


@pytest.mark.parametrize(("given", "level"), [("debug", "DEBUG"), ("Warning", "WARNING")])
def test_run_log_level_is_read_in_any_case(given: str, level: str) -> None:
    """--log-level takes a level name in any case."""
    args = build_parser().parse_args(["run", "--config", "f.yaml", "--log-level", given])
    assert args.log_level == level


def test_run_log_level_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """ACEMQ_LOG_LEVEL sets the level when --log-level is not given; else the file's, INFO."""
    monkeypatch.delenv("ACEMQ_LOG_LEVEL", raising=False)
    assert build_parser().parse_args(["run", "--config", "f.yaml"]).log_level is None
    monkeypatch.setenv("ACEMQ_LOG_LEVEL", "error")
    assert build_parser().parse_args(["run", "--config", "f.yaml"]).log_level == "ERROR"


@pytest.mark.parametrize("source", ["flag", "environment"])
def test_run_unknown_log_level_exits_2_with_the_choices(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
) -> None:
    """A bad level is a usage error naming the choices, before any connection is tried."""
    argv = ["run", "--config", str(tmp_path / "routes.yaml")]
    if source == "flag":
        argv += ["--log-level", "loud"]
    else:
        monkeypatch.setenv("ACEMQ_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unknown log level 'loud'" in err
    assert "DEBUG, INFO, WARNING, ERROR, CRITICAL" in err


def test_the_collector_is_tuned_for_the_relay() -> None:
    """Young collections far apart, start-up's objects frozen out of the full passes."""
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        made_at_start_up: list[list[int]] = [[] for _ in range(100)]
        tune_collector()
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 20, 20)
        assert gc.get_freeze_count() >= len(made_at_start_up)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_version_says_the_release_the_contract_and_the_build(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a user types first answers, instead of asking for a command."""
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    line = capsys.readouterr().out.strip()
    # This suite runs on both builds (./dev): the build is read off the normaliser's file.
    compiled = not normalise_module.__file__.endswith(".py")
    build = "compiled" if compiled else "plain"
    assert line == f"acemq-sidecar {__version__} (contract {CONTRACT_VERSION}, {build} build)"
