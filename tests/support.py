"""Test support: find a broker, and a plain AMQP client with throwaway topology.

The integration and e2e layers share this. The client publishes with the sidecar's codec
installed, so tests can send every AMQP field type exactly (pamqp alone cannot).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiormq
import aiormq.abc
import pytest
from pamqp.commands import Basic

from sidecar.amqp import install_codec

LOCAL_URL = "amqp://guest:guest@127.0.0.1:5672/"


def needs_tool(*names: str, why: str) -> None:
    """Skip unless one of the commands ``names`` is on PATH (``why``: what it is for).

    Under CI=true a missing tool fails the test instead: .ci/run installs every tool the
    suites use, and a skip there would pass what was never checked.
    """
    if any(shutil.which(name) is not None for name in names):
        return
    message = f"{' or '.join(names)} is not on PATH: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (.ci/run installs it)")
    pytest.skip(message)


def reachable(url: str) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            return True
    except OSError:
        return False


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    result = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=20)
    return result.returncode == 0


@contextlib.contextmanager
def broker_url() -> Iterator[str]:
    """Yield an AMQP URL: AMQP_URL, else a testcontainers RabbitMQ, else the local broker.

    Under CI=true an unreachable broker fails the run: a skipped integration suite proves
    nothing.
    """
    url = os.environ.get("AMQP_URL")
    if url is None and _docker_works():
        from testcontainers.rabbitmq import RabbitMqContainer  # noqa: PLC0415

        with RabbitMqContainer("rabbitmq:3.13-management") as container:
            params = container.get_connection_params()
            yield f"amqp://guest:guest@{params.host}:{params.port}/"
        return
    url = url or LOCAL_URL
    if not reachable(url):
        message = f"no RabbitMQ at {url}; start one (./dev test does) or set AMQP_URL"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    yield url


@dataclass
class Broker:
    """A plain AMQP client for tests; every name it makes is unique and deleted afterwards."""

    url: str
    connection: aiormq.abc.AbstractConnection
    channel: aiormq.abc.AbstractChannel
    prefix: str = field(default_factory=lambda: f"t.{uuid.uuid4().hex[:8]}.")
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)

    def name(self, suffix: str) -> str:
        """A name unique to this test."""
        return f"{self.prefix}{suffix}"

    async def queue(self, suffix: str, **arguments: Any) -> str:
        """Declare a durable queue; return its name."""
        name = self.name(suffix)
        await self.channel.queue_declare(name, durable=True, arguments=arguments or None)
        self.queues.append(name)
        return name

    async def exchange(self, suffix: str, kind: str = "topic") -> str:
        """Declare a durable exchange; return its name."""
        name = self.name(suffix)
        await self.channel.exchange_declare(name, exchange_type=kind, durable=True)
        self.exchanges.append(name)
        return name

    async def bind(self, queue: str, exchange: str, routing_key: str = "#") -> None:
        """Bind a queue to an exchange."""
        await self.channel.queue_bind(queue, exchange, routing_key=routing_key)

    async def publish(
        self,
        queue: str,
        *,
        body: bytes = b"{}",
        headers: dict[str, Any] | None = None,
        routing_key: str | None = None,
        exchange: str = "",
        **properties: Any,
    ) -> None:
        """Publish with a confirm (to a queue through the default exchange by default)."""
        props = Basic.Properties(delivery_mode=2, headers=headers)
        for key, value in properties.items():
            setattr(props, key, value)
        await self.channel.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key if routing_key is not None else queue,
            properties=props,
        )

    async def depth(self, queue: str) -> int:
        """Messages ready in a queue."""
        ok = await self.channel.queue_declare(queue, passive=True)
        return int(ok.message_count or 0)

    async def take(
        self, queue: str, count: int, *, timeout_s: float = 15.0
    ) -> list[aiormq.abc.DeliveredMessage]:
        """Get and ack ``count`` messages from a queue, waiting for them to arrive."""
        got: list[aiormq.abc.DeliveredMessage] = []
        async with asyncio.timeout(timeout_s):
            while len(got) < count:
                message = await self.channel.basic_get(queue, no_ack=True)
                if isinstance(message.delivery, Basic.GetOk):
                    got.append(message)
                else:
                    await asyncio.sleep(0.02)
        return got

    async def drain(self, queue: str) -> list[aiormq.abc.DeliveredMessage]:
        """Get and ack whatever a queue holds now."""
        got: list[aiormq.abc.DeliveredMessage] = []
        while True:
            message = await self.channel.basic_get(queue, no_ack=True)
            if not isinstance(message.delivery, Basic.GetOk):
                return got
            got.append(message)

    async def reconnect(self) -> None:
        """Replace a connection the broker closed (the names to clean up are kept)."""
        with contextlib.suppress(Exception):
            await self.connection.close()
        self.connection = await aiormq.connect(self.url)
        self.channel = await self.connection.channel(publisher_confirms=True)

    async def cleanup(self) -> None:
        """Delete everything this test declared."""
        channel = await self.connection.channel()
        for queue in self.queues:
            with contextlib.suppress(Exception):
                await channel.queue_delete(queue)
        for exchange in self.exchanges:
            with contextlib.suppress(Exception):
                await channel.exchange_delete(exchange)


@contextlib.asynccontextmanager
async def open_broker(url: str) -> AsyncIterator[Broker]:
    """Connect a test client (with the sidecar's codec) and clean up after it."""
    install_codec()
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    broker = Broker(url=url, connection=connection, channel=channel)
    try:
        yield broker
    finally:
        if broker.connection.is_closed:  # a fault test closed it (close_all_connections)
            await broker.reconnect()
        await broker.cleanup()
        await broker.connection.close()
