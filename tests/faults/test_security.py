"""Security: amqps:// verified, credentials masked, /metrics bound as configured and content-free.

TLS runs against a loopback endpoint the test builds: ``openssl`` makes a CA, a server
certificate for 127.0.0.1 and localhost, a client certificate and, for the refusal cases,
a second CA nobody trusts; ``socat`` terminates TLS and forwards to the broker under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from sidecar.wire import Int32
from tests.conftest import REPO
from tests.e2e.conftest import Sidecar, eventually, free_port
from tests.faults.conftest import Fate, scrape
from tests.support import needs_tool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.faults.conftest import MixedFlow

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PASSWORD = "Zq7-secret-pw"  # noqa: S105 - a test password, distinctive: must appear in no output
REFUSED_WATCH_S = 6.0  # how long a refused sidecar is watched
MAX_ATTEMPTS_IN_WATCH = 8  # backoff 0.5 s doubling: about 4 attempts in 6 s; a spin is hundreds
TLS_ERROR_WORDS = ("SSL", "TLS", "certificate")


# --- a PKI and a TLS endpoint ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pki:
    """Files made by openssl: a trusted CA with server and client certs, and a rogue CA's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_server_cert: Path
    rogue_server_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def _leaf(directory: Path, name: str, *, ca: str, extensions: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Generate the certificates (EC keys: fast)."""
    needs_tool("openssl", why="the test certificates are made with it")
    directory = tmp_path_factory.mktemp("pki")
    server = "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    server += "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
    client = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    _ca(directory, "ca")
    _ca(directory, "rogue-ca")
    _leaf(directory, "server", ca="ca", extensions=server)
    _leaf(directory, "client", ca="ca", extensions=client)
    _leaf(directory, "rogue-server", ca="rogue-ca", extensions=server)
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        rogue_server_cert=directory / "rogue-server.crt",
        rogue_server_key=directory / "rogue-server.key",
    )


@contextlib.asynccontextmanager
async def tls_endpoint(
    amqp_url: str, *, cert: Path, key: Path, ca: Path, verify_client: bool
) -> AsyncIterator[int]:
    """Run socat terminating TLS on a loopback port, forwarding to the broker; yield the port."""
    needs_tool("socat", why="it terminates TLS in front of the broker")
    port = free_port()
    broker_port = urlsplit(amqp_url).port or 5672
    listen = (
        f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={cert},key={key},"
        f"cafile={ca},verify={int(verify_client)}"
    )
    process = await asyncio.create_subprocess_exec(
        "socat",
        listen,
        f"TCP:127.0.0.1:{broker_port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        await eventually(listening, timeout_s=10, what=f"socat listening on {port}")
        yield port
    finally:
        process.terminate()
        async with asyncio.timeout(10):
            await process.wait()


def tls_route_map(
    flow: MixedFlow, sidecar: Sidecar, *, port: int, pki: Pki, client_cert: bool
) -> dict[str, Any]:
    """The flow's route map over amqps:// to the TLS endpoint, verifying against the CA."""
    user = urlsplit(sidecar.amqp_url)
    route_map = flow.route_map(sidecar, prefetch=32)
    route_map["broker"]["url"] = f"amqps://{user.username}:{user.password}@localhost:{port}/"
    route_map["broker"]["tls"] = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert) if client_cert else None,
        "key_file": str(pki.client_key) if client_cert else None,
    }
    return route_map


# --- TLS -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mutual", [False, True], ids=["server-verified", "client-certificate"])
async def test_amqps_relays_through_a_verified_tls_endpoint(
    flow: MixedFlow, sidecar: Sidecar, amqp_url: str, pki: Pki, *, mutual: bool
) -> None:
    """amqps:// with the CA verified (and a client certificate where required) relays."""
    async with tls_endpoint(
        amqp_url, cert=pki.server_cert, key=pki.server_key, ca=pki.ca, verify_client=mutual
    ) as port:
        sidecar.write(tls_route_map(flow, sidecar, port=port, pki=pki, client_cert=mutual))
        await flow.publish(50)
        await sidecar.start()
        await flow.wait_complete(timeout_s=30, context=sidecar.output)
        flow.check(max_duplicates=0, context=sidecar.output)
        assert "connected to amqps://guest:***@localhost" in sidecar.stderr(), sidecar.output()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A TLS endpoint the sidecar must refuse or be refused by."""

    untrusted_server: bool
    client_cert: bool


REFUSALS = {
    "server certificate from an untrusted CA": Refusal(untrusted_server=True, client_cert=False),
    "client certificate required, none configured": Refusal(
        untrusted_server=False, client_cert=False
    ),
}


async def watch_refused(flow: MixedFlow, sidecar: Sidecar) -> None:
    """Assert a sidecar that cannot connect stays alive, unready and idle, without spinning."""
    await flow.publish(10)
    await sidecar.start(wait_ready=False)
    await asyncio.sleep(REFUSED_WATCH_S)
    assert sidecar.is_running(), f"the sidecar exited instead of retrying\n{sidecar.output()}"
    status, body = await sidecar.get("/readyz")
    assert status == 503, (status, body)
    assert (await scrape(sidecar)).value("acemq_sidecar_broker_connected") == 0
    assert await flow.staging_depth() == flow.published, "something was relayed"
    attempts = [line for line in sidecar.stderr().splitlines() if "unreachable" in line]
    assert 1 <= len(attempts) <= MAX_ATTEMPTS_IN_WATCH, (
        f"{len(attempts)} connection attempts in {REFUSED_WATCH_S:g}s\n{sidecar.output()}"
    )
    sidecar.send(signal.SIGTERM)
    assert await sidecar.wait_exit(timeout_s=15) == 0, sidecar.output()


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_a_refused_tls_handshake_is_logged_retried_with_backoff_and_never_relays(
    flow: MixedFlow, sidecar: Sidecar, amqp_url: str, pki: Pki, case: str
) -> None:
    """A failed TLS handshake: a clear TLS error, /readyz 503, backoff, alive, no relay."""
    refusal = REFUSALS[case]
    cert, key = (
        (pki.rogue_server_cert, pki.rogue_server_key)
        if refusal.untrusted_server
        else (pki.server_cert, pki.server_key)
    )
    async with tls_endpoint(amqp_url, cert=cert, key=key, ca=pki.ca, verify_client=True) as port:
        sidecar.write(
            tls_route_map(flow, sidecar, port=port, pki=pki, client_cert=refusal.client_cert)
        )
        await watch_refused(flow, sidecar)
    attempts = [line for line in sidecar.stderr().splitlines() if "unreachable" in line]
    assert any(word in attempts[0] for word in TLS_ERROR_WORDS), (
        f"not a clear TLS error: {attempts[0]}"
    )


# --- credentials ---------------------------------------------------------------------------


def assert_password_masked(output: str) -> None:
    """The password appears nowhere; the URL is shown with ``***`` instead."""
    assert PASSWORD not in output, [line for line in output.splitlines() if PASSWORD in line]
    assert "***" in output, output[-2000:]


@pytest.mark.parametrize("failure", ["refused port", "wrong password", "tls failure"])
async def test_the_password_never_appears_in_any_output(
    flow: MixedFlow, sidecar: Sidecar, amqp_url: str, pki: Pki, failure: str
) -> None:
    """A URL with a distinctive password: run (three failures) and check never print it."""
    broker = urlsplit(amqp_url)
    async with contextlib.AsyncExitStack() as stack:
        route_map = flow.route_map(sidecar, prefetch=8)
        match failure:
            case "refused port":
                url = f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}/"
            case "wrong password":
                url = f"amqp://guest:{PASSWORD}@{broker.hostname}:{broker.port or 5672}/"
            case _:
                port = await stack.enter_async_context(
                    tls_endpoint(
                        amqp_url,
                        cert=pki.rogue_server_cert,
                        key=pki.rogue_server_key,
                        ca=pki.ca,
                        verify_client=False,
                    )
                )
                url = f"amqps://guest:{PASSWORD}@localhost:{port}/"
                route_map["broker"]["tls"] = {"ca_file": str(pki.ca)}
        route_map["broker"]["url"] = url
        sidecar.write(route_map)
        await watch_refused(flow, sidecar)
    run_output = "".join(
        (sidecar.workdir / f"{stream}.{sidecar.runs}.log").read_text(errors="replace")
        for stream in ("stdout", "stderr")
    )
    assert_password_masked(run_output)
    check = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", "check", str(sidecar.config)],
        capture_output=True,
        check=False,
        cwd=REPO,
        timeout=20,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert_password_masked(check.stdout + check.stderr)


# --- the metrics listener ------------------------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """Return the IPv4 addresses with a TCP listener on ``port`` (from /proc/net/tcp)."""
    addresses = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            addresses.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return addresses


def other_local_addresses() -> Iterator[str]:
    """Yield this host's non-loopback IPv4 addresses."""
    hostname = shutil.which("hostname")
    if hostname is None:
        return
    result = subprocess.run([hostname, "-I"], capture_output=True, text=True, check=False)
    yield from (a for a in result.stdout.split() if "." in a and not a.startswith("127."))


SECRETS = {
    "body": "zz-body-7781",
    "header value": "zz-value-7782",
    "header name": "x-zz-name-7783",
    "reserved name": "x-acemq-zz-7784",
    "message id": "zz-id-7785",
    "routing key": "ok.zz-key-7786",
    "unroutable key": "bad.zz-key-7787",
}


async def test_metrics_bind_where_configured_and_show_no_message_content(
    flow: MixedFlow, sidecar: Sidecar
) -> None:
    """http.listen 127.0.0.1:PORT binds only there; /metrics has no body, id, header or key."""
    sidecar.write(flow.route_map(sidecar, prefetch=8))
    await sidecar.start()
    assert listening_addresses(sidecar.port) == {"127.0.0.1"}
    for address in other_local_addresses():
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex((address, sidecar.port)) != 0, f"reachable on {address}"

    for lane in flow.lanes:
        for routing_key in (SECRETS["routing key"], SECRETS["unroutable key"]):
            headers: dict[str, Any] = {
                SECRETS["header name"]: SECRETS["header value"],
                "x-acemq-attempt": Int32(1),
                SECRETS["reserved name"]: SECRETS["header value"],
            }
            message_id = f"{SECRETS['message id']}-{lane.name}-{routing_key}"
            await flow.broker.publish(
                lane.staging,
                body=SECRETS["body"].encode(),
                headers=headers,
                exchange=lane.staging_exchange,
                routing_key=routing_key,
                message_id=message_id,
            )
            flow.fates[message_id] = (
                Fate.TARGET
                if lane.publishers == "acemq" and routing_key.startswith("ok.")
                else Fate.QUARANTINE
            )
    await flow.wait_complete(timeout_s=30, context=sidecar.output)
    text = (await scrape(sidecar)).text
    assert "acemq_sidecar_messages_total" in text
    leaked = {what: secret for what, secret in SECRETS.items() if secret in text}
    assert not leaked, f"/metrics shows message content: {leaked}"
