"""What a broker's release changes for its clients: read from its ``version`` property.

The AMQP client is told these as options (``sidecar.amqp.ClientOptions``); it knows no
release itself. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["NACK_FREE_FROM", "nack_is_free"]

NACK_FREE_FROM: Final = (4, 3)  # RabbitMQ's first release whose quorum queues do not count it
_RELEASE = re.compile(r"(\d+)\.(\d+)")


def nack_is_free(server_version: object) -> bool:
    """Whether a requeueing ``basic.nack`` spends no attempt of a quorum queue's limit.

    ``server_version`` is the broker's ``version`` server property ("4.3.6"). Measured
    (tests/faults/test_broker_versions.py): 0 on 4.3.6, 1 on 3.10.8 and 4.0.5, where a
    nack of every unacked delivery before a channel's close also reordered a quorum queue
    that the close alone kept in order; so only from 4.3 is it worth sending.
    """
    text = (
        server_version.decode(errors="replace")
        if isinstance(server_version, bytes)
        else server_version
    )
    match = _RELEASE.match(text) if isinstance(text, str) else None
    return match is not None and (int(match[1]), int(match[2])) >= NACK_FREE_FROM
