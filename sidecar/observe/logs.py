"""Log formatting: one line per event, JSON when not on a TTY, key=value on one.

Only the CLI calls ``configure``; modules use ``logging.getLogger(__name__)`` and put
context in ``extra``. Logs go to stderr: stdout belongs to the commands' results
(``check``, ``conform``, ``normalise``), and a container runtime collects both streams.
Whether a line is JSON or key=value depends on whether that stream is a terminal.

Every line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``msg``, then the
record's ``extra`` fields (``route``, ``kind``, ``header``, ``message_id``, ...), then
``exc`` for a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["LEVELS", "JsonFormatter", "KeyValueFormatter", "configure", "parse_level"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_HEAD = ("ts", "level", "logger", "msg")


def parse_level(text: str) -> str:
    """Return the logging level named by ``text``, any case; ValueError naming the choices."""
    level = text.strip().upper()
    if level not in LEVELS:
        raise ValueError(f"unknown log level {text!r}; expected one of {', '.join(LEVELS)}")
    return level


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key in _STANDARD:
            continue
        # An extra named like a head field must not overwrite it (a level, a timestamp).
        fields[f"extra.{key}" if key in _HEAD else key] = value
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one line of JSON; values JSON cannot hold become strings."""
        return json.dumps(_fields(record), default=str, ensure_ascii=False)


def _value(value: object) -> str:
    """Show a value as logfmt does: bare when it is one plain word, else quoted."""
    text = value if isinstance(value, str) else str(value)
    if text and not any(c.isspace() or c in '"=\\' for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``ts LEVEL msg key=value ...`` for a human at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one line (a traceback follows on its own lines)."""
        fields = _fields(record)
        head = f"{fields.pop('ts')} {str(fields.pop('level')).upper():7} {fields.pop('msg')}"
        fields.pop("logger")
        exc = fields.pop("exc", None)
        tail = " ".join(f"{key}={_value(value)}" for key, value in fields.items())
        line = f"{head} {tail}".rstrip()
        return f"{line}\n{exc}" if exc else line


def configure(*, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) in the format that suits it.

    Replaces the root logger's handlers, so calling it again reconfigures rather than
    doubling every line. aiormq is kept at WARNING or above: its INFO is per-channel chatter.
    """
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(KeyValueFormatter() if _is_tty(out) else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(parse_level(level))
    logging.getLogger("aiormq").setLevel(max(logging.WARNING, root.level))


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False
