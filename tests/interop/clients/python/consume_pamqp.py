"""Interop consumer on pamqp through aiormq: one canonical JSON line per queue.

    python consume_pamqp.py AMQP_URL QUEUE...

For each queue, get one message (no-ack) and print what pamqp decoded (canonical_json.py).
A message pamqp cannot decode closes aiormq's connection: that is reported for the queue
and a new connection serves the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import aiormq
import aiormq.abc
from canonical_json import PROPERTY_NAMES, failure, success
from pamqp.commands import Basic

TIMEOUT_S = 20.0


async def take(connection: aiormq.abc.AbstractConnection, queue: str) -> str:
    """Get one message from ``queue``; return its line."""
    channel = await connection.channel()
    message = await channel.basic_get(queue, no_ack=True)
    if not isinstance(message.delivery, Basic.GetOk):
        return failure(queue, "queue is empty")
    await channel.close()
    props = message.header.properties
    values = {name: getattr(props, name, None) for name in PROPERTY_NAMES}
    values["type"] = props.message_type  # pamqp's name for the type property
    return success(queue, message.body, values, props.headers, bytes_kind="string")


async def main(url: str, queues: list[str]) -> None:
    """Print one line per queue, reconnecting after a failure."""
    connection: aiormq.abc.AbstractConnection | None = None
    for queue in queues:
        try:
            if connection is None or connection.is_closed:
                connection = await aiormq.connect(url)
            result = await asyncio.wait_for(take(connection, queue), TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the client's error is the result
            result = failure(queue, e)
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.close()
            connection = None
        print(result, flush=True)  # noqa: T201 - the line is the program's output
    if connection is not None:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
