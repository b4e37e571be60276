"""Interop consumer on pika: one canonical JSON line per queue.

    python consume_pika.py AMQP_URL QUEUE...

For each queue, get one message (auto-ack) and print what pika decoded (canonical_json.py).
A message pika cannot decode breaks its connection: that is reported for the queue and a new
connection serves the next one.
"""

from __future__ import annotations

import contextlib
import sys

import pika
import pika.adapters.blocking_connection
from canonical_json import PROPERTY_NAMES, failure, success


def take(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> str:
    """Get one message from ``queue``; return its line."""
    method, props, body = channel.basic_get(queue, auto_ack=True)
    if method is None:
        return failure(queue, "queue is empty")
    values = {name: getattr(props, name, None) for name in PROPERTY_NAMES}
    return success(queue, body, values, props.headers, bytes_kind="bytes")


def main(url: str, queues: list[str]) -> None:
    """Print one line per queue, reconnecting after a failure."""
    parameters = pika.URLParameters(url)
    parameters.heartbeat = 0
    connection: pika.BlockingConnection | None = None
    for queue in queues:
        try:
            if connection is None or not connection.is_open:
                connection = pika.BlockingConnection(parameters)
            channel = connection.channel()
            result = take(channel, queue)
            channel.close()
        except Exception as e:  # noqa: BLE001 - the client's error is the result
            result = failure(queue, e)
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            connection = None
        print(result, flush=True)  # noqa: T201 - the line is the program's output


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
