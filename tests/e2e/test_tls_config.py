"""TLS files as config, at the process: check, run and a reload refuse a bad one at its line.

A missing TLS file, or one that is not a certificate or key, fails each of the three at
once: ``check`` and ``run`` exit 2 and a reload is refused, with ``FILE:LINE``, rather than
a traceback at connect (or a reload applied, to fail at the next reconnect). Without
``ca_file`` the broker is verified against the system's CAs: a TLS endpoint built here
(a proxy to the test broker) is trusted through ``SSL_CERT_FILE`` and only through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.conftest import (
    Flow,
    Sidecar,
    declare_flow,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_until,
)
from tests.tls_files import TlsFiles, make_tls_files

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

DELIVERY_TIMEOUT_S = 30.0
CHECK_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A certificate for localhost that is its own CA, its key, and files that are neither."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# Each bad case: the tls block of the route map, the key reported, and what the message says.
BAD_TLS = {
    "ca file missing": (
        lambda f: {"ca_file": str(f.missing)},
        "ca_file",
        "No such file or directory",
    ),
    "ca file not a certificate": (
        lambda f: {"ca_file": str(f.not_pem)},
        "ca_file",
        "holds no PEM certificate",
    ),
    "cert file not a certificate": (
        lambda f: {"cert_file": str(f.not_pem), "key_file": str(f.key)},
        "cert_file",
        "holds no PEM certificate",
    ),
    "key file missing": (
        lambda f: {"cert_file": str(f.cert), "key_file": str(f.missing)},
        "key_file",
        "No such file or directory",
    ),
}


def _amqps(url: str, *, port: int | None = None) -> str:
    """The broker URL with the amqps scheme; with ``port``, to that port on 127.0.0.1."""
    parts = urlsplit(url)
    if port is not None:
        userinfo, at, _ = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{port}")
    return parts._replace(scheme="amqps").geturl()


def _with_tls(route_map: dict[str, Any], tls: dict[str, str], *, url: str) -> str:
    """Dump a route map over amqps:// with ``tls`` written one key per line, as people do."""
    route_map = {**route_map, "broker": {**route_map["broker"], "url": url, "tls": tls}}
    return yaml.safe_dump(route_map, default_flow_style=False)


def _line_of(text: str, key: str) -> int:
    """The 1-based line of ``key:`` inside the broker's tls block."""
    lines = text.splitlines()
    start = lines.index("  tls:")
    return next(i for i in range(start, len(lines)) if lines[i].strip().startswith(f"{key}:")) + 1


def _assert_names_the_key(stderr: str, *, config: Path, text: str, key: str, expected: str) -> None:
    """Assert that stderr holds ``FILE:LINE: broker.tls.KEY:`` and the reason, no traceback."""
    assert f"{config}:{_line_of(text, key)}: broker.tls.{key}: " in stderr, stderr
    assert expected in stderr, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("case", sorted(BAD_TLS))
def test_check_exits_2_naming_the_tls_key_and_its_line(
    files: TlsFiles, tmp_path: Path, case: str
) -> None:
    """``acemq-sidecar check`` reads the TLS files: what would fail at connect fails here."""
    tls, key, expected = BAD_TLS[case]
    route_map: dict[str, Any] = {
        "broker": {"url": "amqps://guest:guest@localhost:5671/"},
        "routes": [{"name": "a", "from": "q", "to": {"exchange": "x"}}],
    }
    text = _with_tls(route_map, tls(files), url=route_map["broker"]["url"])
    config = tmp_path / "routes.yaml"
    config.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "check", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=CHECK_TIMEOUT_S,
    )
    assert result.returncode == 2, result
    _assert_names_the_key(result.stderr, config=config, text=text, key=key, expected=expected)


@pytest.mark.parametrize("case", ["ca file missing", "ca file not a certificate"])
async def test_run_exits_2_naming_the_tls_key_before_touching_a_message(
    broker: Broker, sidecar: Sidecar, files: TlsFiles, case: str
) -> None:
    """``run`` refuses the map at start, exit 2 and FILE:LINE, not a traceback at connect."""
    tls, key, expected = BAD_TLS[case]
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "tls-run")
    await publish_ids(broker, flow.staging, ["tls-run-00000"])
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow])
    text = _with_tls(route_map, tls(files), url=_amqps(sidecar.amqp_url))
    sidecar.write(text)

    await sidecar.start(wait_ready=False)
    status = await sidecar.wait_exit(timeout_s=20)

    assert status == 2, sidecar.output()
    _assert_names_the_key(
        sidecar.stderr(), config=sidecar.config, text=text, key=key, expected=expected
    )
    assert await broker.depth(flow.staging) == 1


async def _relays(broker: Broker, sidecar: Sidecar, flow: Flow, prefix: str) -> None:
    ids = make_ids(prefix, 10)
    await publish_ids(broker, flow.staging, ids)
    await take_until(broker, flow.target, ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output)


@pytest.mark.parametrize("case", ["ca file missing", "cert file not a certificate"])
async def test_a_sighup_to_a_bad_tls_file_is_refused_and_the_old_map_keeps_relaying(
    broker: Broker, sidecar: Sidecar, files: TlsFiles, case: str
) -> None:
    """The reload is refused and counted; nothing of it applies, so no later reconnect dies."""
    tls, key, expected = BAD_TLS[case]
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "tls-reload")
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow])
    sidecar.write(route_map)
    sidecar.pad()  # room to rewrite it at the same size: only SIGHUP may trigger the reload
    await sidecar.start()
    await _relays(broker, sidecar, flow, "tls-before")

    text = _with_tls(route_map, tls(files), url=_amqps(sidecar.amqp_url))
    sidecar.write(text, keep_stamp=True)
    sidecar.send(signal.SIGHUP)

    async def refused() -> bool:
        return await sidecar.metric("acemq_sidecar_config_reloads_total", result="refused") >= 1

    await eventually(refused, timeout_s=10, what="the reload refused", context=sidecar.output)
    assert sidecar.is_running(), sidecar.output()
    await _relays(broker, sidecar, flow, "tls-after")
    await sidecar.wait_ready()
    text_metrics = await sidecar.metrics_text()
    assert 'acemq_sidecar_config_reloads_total{result="refused"} 1.0' in text_metrics
    assert 'acemq_sidecar_config_reloads_total{result="applied"} 0.0' in text_metrics
    _assert_names_the_key(
        sidecar.stderr(), config=sidecar.config, text=text, key=key, expected=expected
    )


# --- no ca_file: the system's CAs, verification on --------------------------------------------


@dataclass
class TlsProxy:
    """A TLS endpoint on a loopback port that pipes to the test broker."""

    port: int
    writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def drop(self) -> None:
        """Close every connection through the proxy, both sides: a lost connection."""
        for writer in self.writers:
            writer.close()
        self.writers.clear()


@contextlib.asynccontextmanager
async def tls_proxy(amqp_url: str, *, cert: Path, key: Path) -> AsyncIterator[TlsProxy]:
    """Terminate TLS with ``cert`` on a loopback port and pipe to the broker."""
    upstream = urlsplit(amqp_url)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxy.writers.add(writer)
        up_reader, up_writer = await asyncio.open_connection(
            upstream.hostname, upstream.port or 5672
        )
        proxy.writers.add(up_writer)
        for task in (
            asyncio.create_task(pipe(reader, up_writer), name="tls-proxy:up"),
            asyncio.create_task(pipe(up_reader, writer), name="tls-proxy:down"),
        ):
            pipes.add(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    proxy = TlsProxy(port=int(server.sockets[0].getsockname()[1]))
    try:
        yield proxy
    finally:
        server.close()
        proxy.drop()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await server.wait_closed()


@pytest.mark.parametrize("trusted", [True, False], ids=["in-the-trust-store", "not-trusted"])
async def test_without_ca_file_the_broker_is_verified_against_the_system_cas(
    broker: Broker,
    sidecar: Sidecar,
    files: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
    *,
    trusted: bool,
) -> None:
    """A kubernetes.io/tls Secret has no ca.crt: the system store decides, verification on.

    ``SSL_CERT_FILE`` points OpenSSL's default CA file at the endpoint's CA: then the
    sidecar relays; with the system's store alone, which lacks it, the handshake is refused.
    """
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "tls-system-ca")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", str(files.cert))
    else:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the real store: it lacks this CA
    async with tls_proxy(sidecar.amqp_url, cert=files.cert, key=files.key) as proxy:
        route_map = sidecar.route_map(quarantine=quarantine, flows=[flow])
        route_map["broker"]["url"] = _amqps(sidecar.amqp_url, port=proxy.port)
        sidecar.write(route_map)
        if trusted:
            await sidecar.start()
            await _relays(broker, sidecar, flow, "tls-system")
        else:
            await sidecar.start(wait_ready=False)

            def refused() -> bool:
                return "certificate verify failed" in sidecar.stderr()

            await eventually(
                refused, timeout_s=20, what="a refused TLS handshake", context=sidecar.output
            )
            assert sidecar.is_running(), sidecar.output()
            status, _ = await sidecar.get("/readyz")
            assert status == 503, sidecar.output()
        await sidecar.kill()


async def test_a_tls_file_gone_after_start_fails_the_reconnect_not_the_process(
    broker: Broker, sidecar: Sidecar, files: TlsFiles, tmp_path: Path
) -> None:
    """The files are read again at each connect: one gone since start is a connect that fails.

    It is logged with the key and retried with backoff, and the route resumes when the
    file is back; the process does not die with a traceback.
    """
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "tls-gone")
    ca_file = tmp_path / "ca.crt"
    shutil.copy(files.cert, ca_file)
    async with tls_proxy(sidecar.amqp_url, cert=files.cert, key=files.key) as proxy:
        route_map = sidecar.route_map(quarantine=quarantine, flows=[flow])
        route_map["broker"]["url"] = _amqps(sidecar.amqp_url, port=proxy.port)
        route_map["broker"]["tls"] = {"ca_file": str(ca_file)}
        sidecar.write(route_map)
        await sidecar.start()
        await _relays(broker, sidecar, flow, "tls-gone-before")

        ca_file.unlink()
        proxy.drop()

        def retried() -> bool:
            return f"broker.tls.ca_file: cannot read {ca_file}" in sidecar.stderr()

        await eventually(retried, timeout_s=20, what="a failed reconnect", context=sidecar.output)
        assert sidecar.is_running(), sidecar.output()
        assert "Traceback" not in sidecar.stderr(), sidecar.output()
        shutil.copy(files.cert, ca_file)
        await sidecar.wait_ready()
        await _relays(broker, sidecar, flow, "tls-gone-after")
        await sidecar.kill()
