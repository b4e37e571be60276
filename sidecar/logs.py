"""Log formatting: one line per event, JSON when not on a TTY, key=value on one.

Only the CLI calls ``configure``; modules use ``logging.getLogger(__name__)`` and put
context in ``extra``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["configure"]

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``ts level msg key=value ...`` for a human at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        head = f"{fields.pop('ts')} {str(fields.pop('level')).upper():7} {fields.pop('msg')}"
        fields.pop("logger")
        exc = fields.pop("exc", None)
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{head} {tail}".rstrip()
        return f"{line}\n{exc}" if exc else line


def configure(*, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) in the format that suits it."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(KeyValueFormatter() if out.isatty() else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiormq").setLevel(max(logging.WARNING, root.level))
