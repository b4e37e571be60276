"""Quarantine list and replay: the rows, the reader, the commands.

The rows an operator reads and the replay plan are pure; the reader holds a queue's
messages without changing it, and the commands run list and replay on it.
"""

from __future__ import annotations

from sidecar.quarantine.reader import QuarantineInputError
from sidecar.quarantine.rows import QuarantinedMessage, Selection, format_rows
from sidecar.quarantine.tool import BrokerTarget, list_messages, open_connection, replay_messages

__all__ = [
    "BrokerTarget",
    "QuarantineInputError",
    "QuarantinedMessage",
    "Selection",
    "format_rows",
    "list_messages",
    "open_connection",
    "replay_messages",
]
