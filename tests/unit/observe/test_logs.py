"""Log lines: JSON off a terminal, key=value on one, on stderr, at the configured level."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.observe import logs


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        """Say yes, as a terminal does."""
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure() changes the root logger; give every test a clean one back."""
    root, aiormq = logging.getLogger(), logging.getLogger("aiormq")
    handlers, level, aiormq_level = root.handlers[:], root.level, aiormq.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    aiormq.setLevel(aiormq_level)


def emit(level: int = logging.INFO, **extra: object) -> None:
    logging.getLogger("sidecar.relay").log(
        level, "route %s: %s on %s", "orders", "unknown_reserved", "x-acemq-*", extra=extra
    )


VIOLATION: dict[str, Any] = {
    "route": "orders",
    "kind": "unknown_reserved",
    "header": "x-acemq-*",
    "names": "x-acemq-zone",
    "message_id": "ord-4",
    "origin": "checkout@app-7",
    "suppressed": 12,
}


def test_not_a_terminal_gets_one_json_object_per_line() -> None:
    """Log shippers read one JSON object per line, with the extra fields at the top level."""
    out = io.StringIO()
    logs.configure(stream=out)
    emit(**VIOLATION)
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "info"
    assert record["logger"] == "sidecar.relay"
    assert record["msg"] == "route orders: unknown_reserved on x-acemq-*"
    assert record["ts"].endswith("+00:00")
    assert {key: record[key] for key in VIOLATION} == VIOLATION


def test_a_terminal_gets_key_value_with_quoted_values() -> None:
    """A human reads key=value; a value with spaces or quotes is quoted, so it reads back."""
    out = Terminal()
    logs.configure(stream=out)
    emit(**VIOLATION, reason='header "x-acemq-tenant" is reserved')
    (line,) = out.getvalue().splitlines()
    assert " INFO    route orders: unknown_reserved on x-acemq-* " in line
    assert "route=orders kind=unknown_reserved header=x-acemq-* names=x-acemq-zone" in line
    assert "suppressed=12" in line
    assert 'reason="header \\"x-acemq-tenant\\" is reserved"' in line
    assert not line.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("stderr_tty", "stdout_tty", "json_lines"),
    [(False, True, True), (True, False, False)],
    ids=["stderr-piped", "stderr-terminal"],
)
def test_the_format_follows_the_stream_the_logs_go_to(
    monkeypatch: pytest.MonkeyPatch, *, stderr_tty: bool, stdout_tty: bool, json_lines: bool
) -> None:
    """Logs go to stderr, and it is stderr's terminal-ness (not stdout's) that picks the format."""
    err = Terminal() if stderr_tty else io.StringIO()
    out = Terminal() if stdout_tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    logs.configure()
    emit(route="orders")
    assert out.getvalue() == ""
    line = err.getvalue().strip()
    assert line.startswith("{") is json_lines, line


def test_an_exception_stays_on_one_json_line() -> None:
    """A traceback is a field of the line, not lines of its own that a shipper would split."""
    out = io.StringIO()
    logs.configure(stream=out)
    try:
        raise RuntimeError("boom")  # noqa: TRY301
    except RuntimeError:
        logging.getLogger("sidecar.service").exception("failed")
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert "RuntimeError: boom" in record["exc"]


def test_values_json_cannot_hold_are_written_as_text() -> None:
    """An odd extra value (bytes, an object) never costs the line."""
    out = io.StringIO()
    logs.configure(stream=out)
    emit(route="orders", message_id=b"\xff", origin=object())
    record = json.loads(out.getvalue())
    assert record["message_id"] == "b'\\xff'"
    assert record["origin"].startswith("<object object")


def test_an_extra_cannot_overwrite_the_head_fields() -> None:
    """An extra named level or ts is kept under extra.*, and the line's own stay true."""
    out = io.StringIO()
    logs.configure(stream=out)
    emit(level=logging.WARNING, ts="yesterday", logger="mine")
    # "level" is not a LogRecord attribute, so logging lets it through as an extra.
    logging.getLogger("sidecar").warning("x", extra={"level": "debug"})
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["level"], first["logger"]) == ("warning", "sidecar.relay")
    assert (first["extra.ts"], first["extra.logger"]) == ("yesterday", "mine")
    assert (second["level"], second["extra.level"]) == ("warning", "debug")


@pytest.mark.parametrize("level", ["WARNING", "warning", " Warning "])
def test_level_filters_and_is_read_in_any_case(level: str) -> None:
    """--log-level warning drops INFO lines; the level name is read in any case."""
    out = io.StringIO()
    logs.configure(level=level, stream=out)
    emit(logging.INFO, route="orders")
    emit(logging.WARNING, route="orders")
    assert [json.loads(line)["level"] for line in out.getvalue().splitlines()] == ["warning"]


def test_debug_leaves_aiormq_at_warning() -> None:
    """aiormq's per-frame chatter stays out even when the sidecar logs at DEBUG."""
    logs.configure(level="DEBUG", stream=io.StringIO())
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("aiormq").level == logging.WARNING


def test_configure_twice_does_not_double_lines() -> None:
    """A second configure replaces the handler instead of adding one."""
    out = io.StringIO()
    logs.configure(stream=out)
    logs.configure(stream=out)
    emit(route="orders")
    assert len(out.getvalue().splitlines()) == 1


def test_unknown_level_is_refused_with_the_choices() -> None:
    """A typo in the level is an error that lists what is allowed, not a silent default."""
    with pytest.raises(ValueError, match="DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        logs.parse_level("loud")
