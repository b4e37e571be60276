"""The HTTP endpoint: /metrics, /healthz and /readyz served from a thread on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import resource
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sidecar import service as service_module
from sidecar.clock import Clock
from sidecar.observe.health import HealthBindError, HealthServer, Probe
from sidecar.observe.http_exchange import Reply, Request
from sidecar.observe.http_server import (
    RESERVED_DESCRIPTORS,
    HttpServer,
    Limits,
    connection_budget,
    listen,
)
from sidecar.observe.metrics import Metrics
from sidecar.route_files import load_route_map
from sidecar.service import Service

if TYPE_CHECKING:
    from collections.abc import Iterator
    from email.message import Message

HOST = "127.0.0.1"


@dataclass
class Probes:
    """Probe results a test sets; the server reads them from its thread."""

    liveness: Probe = field(default_factory=lambda: Probe(ok=True, detail=""))
    readiness: Probe = field(default_factory=lambda: Probe(ok=True, detail=""))
    error: Exception | None = None

    def live(self) -> Probe:
        """Report the liveness the test set."""
        return self.liveness

    def ready(self) -> Probe:
        """Report the readiness the test set, or raise the error it set."""
        if self.error is not None:
            raise self.error
        return self.readiness


@dataclass(frozen=True)
class Response:
    """What a client saw: status, the two headers that matter, and the body."""

    status: int
    content_type: str
    content_length: int
    body: str


@pytest.fixture
def probes() -> Probes:
    return Probes()


def make_server(probes: Probes, *, port: int = 0, limits: Limits | None = None) -> HealthServer:
    registry = CollectorRegistry()
    Metrics(registry, version="1.2.3", contract="1").add_route("orders")
    return HealthServer(
        host=HOST,
        port=port,
        registry=registry,
        liveness=probes.live,
        readiness=probes.ready,
        limits=limits,
    )


@pytest.fixture
def server(probes: Probes) -> Iterator[HealthServer]:
    server = make_server(probes)
    server.start()
    yield server
    server.stop()


def fetch(
    server: HealthServer | int, path: str, *, method: str = "GET", accept: str | None = None
) -> Response:
    port = server if isinstance(server, int) else server.port
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method)
    if accept is not None:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310
            return _response(reply.status, reply.headers, reply.read())
    except urllib.error.HTTPError as e:
        with e:
            return _response(e.code, e.headers, e.read())


def _response(status: int, headers: Message, body: bytes) -> Response:
    return Response(status, headers["Content-Type"], int(headers["Content-Length"]), body.decode())


def test_metrics_serves_the_registry(server: HealthServer) -> None:
    """Prometheus gets the text exposition (0.0.4) of the injected registry."""
    reply = fetch(server, "/metrics")
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain; version=0.0.4")
    assert "# EOF" not in reply.body
    assert 'acemq_sidecar_build_info{contract="1",version="1.2.3"} 1.0' in reply.body
    assert 'acemq_sidecar_route_up{route="orders"} 0.0' in reply.body


def test_metrics_ignores_a_query_string(server: HealthServer) -> None:
    """Scrapers that add parameters still reach /metrics."""
    assert fetch(server, "/metrics?name[]=x").status == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probe_ok_is_200(server: HealthServer, path: str) -> None:
    """A passing probe answers 200 "ok"."""
    reply = fetch(server, path)
    assert (reply.status, reply.body) == (200, "ok\n")
    assert reply.content_type.startswith("text/plain")


@pytest.mark.parametrize(
    ("path", "attribute"), [("/healthz", "liveness"), ("/readyz", "readiness")]
)
def test_probe_not_ok_is_503_with_its_detail(
    server: HealthServer, probes: Probes, path: str, attribute: str
) -> None:
    """A failing probe answers 503 and says why, one line per reason."""
    detail = 'route orders: exchange "orders" does not exist\nroute billing: not consuming'
    setattr(probes, attribute, Probe(ok=False, detail=detail))
    reply = fetch(server, path)
    assert (reply.status, reply.body) == (503, detail + "\n")


def test_probes_are_independent(server: HealthServer, probes: Probes) -> None:
    """Not ready is not dead: /healthz stays 200 while /readyz is 503."""
    probes.readiness = Probe(ok=False, detail="broker: not connected")
    assert fetch(server, "/healthz").status == 200
    assert fetch(server, "/readyz").status == 503


def test_probe_reflects_the_current_state(server: HealthServer, probes: Probes) -> None:
    """The probe runs per request, so recovery shows without a restart."""
    probes.readiness = Probe(ok=False, detail="broker: not connected")
    assert fetch(server, "/readyz").status == 503
    probes.readiness = Probe(ok=True, detail="")
    assert fetch(server, "/readyz").status == 200


def test_raising_probe_is_503_and_the_server_survives(server: HealthServer, probes: Probes) -> None:
    """A probe bug reports unready with its text instead of killing the HTTP thread."""
    probes.error = KeyError("orders")
    reply = fetch(server, "/readyz")
    assert reply.status == 503
    assert "KeyError" in reply.body
    assert "orders" in reply.body
    probes.error = None
    assert fetch(server, "/readyz").status == 200


@pytest.mark.parametrize("path", ["/", "/metricsz", "/healthz/extra", "/favicon.ico"])
def test_unknown_path_is_404(server: HealthServer, path: str) -> None:
    """Only the three endpoints exist."""
    assert fetch(server, path).status == 404


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/nope"])
def test_head_has_get_headers_and_no_body(server: HealthServer, path: str) -> None:
    """HEAD answers the same status and length as GET, without the body."""
    get = fetch(server, path)
    head = fetch(server, path, method="HEAD")
    assert head.status == get.status
    assert head.content_type == get.content_type
    assert head.body == ""
    # Nothing changes the registry between the two requests, so the lengths agree.
    assert head.content_length == get.content_length == len(get.body.encode())


def test_head_on_failing_probe_is_503(server: HealthServer, probes: Probes) -> None:
    """Load balancers that probe with HEAD see the same verdict."""
    probes.liveness = Probe(ok=False, detail="event loop stalled")
    assert fetch(server, "/healthz", method="HEAD").status == 503


def test_requests_are_not_logged_to_stderr(
    server: HealthServer, probes: Probes, capfd: pytest.CaptureFixture[str]
) -> None:
    """Scrapes every few seconds must not flood the sidecar's log."""
    probes.error = RuntimeError("boom")
    for path in ["/metrics", "/healthz", "/readyz", "/nope"]:
        fetch(server, path)
    assert capfd.readouterr().err == ""


def test_stop_frees_the_port(probes: Probes) -> None:
    """After stop() a new server can listen on the same port, as a restart would."""
    first = make_server(probes)
    first.start()
    port = first.port
    assert fetch(first, "/healthz").status == 200
    first.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=5)
    second = make_server(probes, port=port)
    second.start()
    try:
        assert second.port == port
        assert fetch(second, "/healthz").status == 200
    finally:
        second.stop()


def test_stop_is_idempotent_and_safe_before_start(probes: Probes) -> None:
    """Shutdown paths may stop a server twice, or one that never started."""
    server = make_server(probes)
    server.stop()
    server.start()
    assert fetch(server, "/healthz").status == 200, "a stop before start left it unable to serve"
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{HOST}:{server.port}/healthz", timeout=5)


def test_bind_failure_names_the_address(server: HealthServer, probes: Probes) -> None:
    """A taken port fails start() with an OSError that says which address and what to do."""
    clash = make_server(probes, port=server.port)
    with pytest.raises(HealthBindError) as caught:
        clash.start()
    assert isinstance(caught.value, OSError)
    assert f"{HOST}:{server.port}" in str(caught.value)
    assert caught.value.errno is not None
    assert (caught.value.host, caught.value.port) == (HOST, server.port)
    clash.stop()


def test_port_before_start_is_an_error(probes: Probes) -> None:
    """There is no port to report until the socket is bound."""
    server = make_server(probes)
    with pytest.raises(RuntimeError, match="before start"):
        _ = server.port


@pytest.mark.parametrize(
    "accept",
    [
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "application/openmetrics-text",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    ],
)
def test_metrics_speaks_openmetrics_when_asked(server: HealthServer, accept: str) -> None:
    """A scraper that accepts OpenMetrics gets it: its content type, the # EOF terminator."""
    reply = fetch(server, "/metrics", accept=accept)
    assert reply.status == 200
    assert reply.content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert reply.body.endswith("# EOF\n")
    assert 'acemq_sidecar_build_info{contract="1",version="1.2.3"} 1.0' in reply.body


def test_metrics_plain_accept_gets_the_text_format(server: HealthServer) -> None:
    """An Accept header without OpenMetrics (curl's */*) gets the Prometheus text format."""
    reply = fetch(server, "/metrics", accept="*/*")
    assert reply.content_type.startswith("text/plain")
    families = {f.name for f in text_string_to_metric_families(reply.body)}
    assert "acemq_sidecar_messages" in families


@pytest.mark.parametrize("ok", [True, False])
def test_probe_with_a_report_answers_json(
    server: HealthServer, probes: Probes, *, ok: bool
) -> None:
    """A report is the body, as JSON, whether the probe passes (200) or fails (503)."""
    report = {"ready": ok, "broker": "connected", "routes": {"orders": "consuming"}}
    probes.readiness = Probe(ok=ok, detail="ignored", report=report)
    reply = fetch(server, "/readyz")
    assert reply.status == (200 if ok else 503)
    assert reply.content_type == "application/json"
    assert json.loads(reply.body) == report
    assert reply.body.endswith("}\n")


def test_probe_report_that_is_not_json_is_503(server: HealthServer, probes: Probes) -> None:
    """A report JSON cannot hold is a probe bug: 503 with its text, never a dead thread."""
    probes.readiness = Probe(ok=True, report={"when": object()})
    reply = fetch(server, "/readyz")
    assert reply.status == 503
    assert "TypeError" in reply.body
    probes.readiness = Probe(ok=True)
    assert fetch(server, "/readyz").status == 200


# --- the service's probes, as the HTTP thread sees them -------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def make_service(tmp_path: Path, *, routes: tuple[str, ...] = ("orders",)) -> Service:
    """A Service on a route map whose broker nobody listens on (probes need no broker)."""
    lines = [
        f"broker: {{url: 'amqp://guest:guest@{HOST}:{_closed_port()}/', connect_timeout_s: 1}}",
        f"http: {{listen: '{HOST}:0'}}",
        "quarantine: {exchange: q}",
        "routes:",
        *(
            f"  - {{name: {r}, from: s.{r}, to: {{exchange: {r}, routing_key: keep}}}}"
            for r in routes
        ),
    ]
    path = tmp_path / "routes.yaml"
    path.write_text("\n".join(lines) + "\n")
    return Service(
        load_route_map(path, env={}),
        config_path=path,
        env={},
        registry=CollectorRegistry(),
        clock=Clock.system(),
        new_id=lambda: "id",
        rng=random.Random(1),
    )


@dataclass
class FakeWorker:
    """What readiness reads of a route worker."""

    pause_reason: str | None


def test_readiness_report_without_a_connection(tmp_path: Path) -> None:
    """Not connected: 503 naming the broker, every route waiting for it."""
    service = make_service(tmp_path, routes=("orders", "invoices"))
    probe = service.readiness()
    assert not probe.ok
    assert probe.detail == "broker: not connected"
    assert probe.report == {
        "ready": False,
        "broker": "not connected",
        "routes": {"orders": "waiting for the broker", "invoices": "waiting for the broker"},
    }


def test_readiness_report_names_the_paused_route_and_why(tmp_path: Path) -> None:
    """Connected with one route paused: the report says which and why, the other consumes."""
    service = make_service(tmp_path, routes=("orders", "invoices"))
    missing = 'exchange "orders" does not exist; create it'
    service._connected = True
    service._fleet._workers = {
        "orders": (FakeWorker(pause_reason=missing), None),  # type: ignore[dict-item]
        "invoices": (FakeWorker(pause_reason=None), None),  # type: ignore[dict-item]
    }
    probe = service.readiness()
    assert not probe.ok
    assert probe.detail == f"route orders: {missing}"
    assert probe.report == {
        "ready": False,
        "broker": "connected",
        "routes": {"orders": missing, "invoices": "consuming"},
    }
    service._fleet._workers["orders"] = (FakeWorker(pause_reason=None), None)  # type: ignore[assignment]
    probe = service.readiness()
    assert probe.ok
    assert probe.report is not None
    assert probe.report["ready"] is True


def test_readiness_counts_a_route_without_a_worker_as_down(tmp_path: Path) -> None:
    """A route of the map that has no worker yet is not consuming, even when connected."""
    service = make_service(tmp_path, routes=("orders",))
    service._connected = True
    probe = service.readiness()
    assert not probe.ok
    assert probe.report == {"ready": False, "broker": "connected", "routes": {"orders": "starting"}}


@pytest.mark.timeout(30)
async def test_healthz_goes_503_while_the_event_loop_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocked event loop fails /healthz from the HTTP thread, and recovers when it runs.

    The real wiring: the service's tick task, its liveness probe and the HTTP thread.
    The thresholds are shortened so the test blocks the loop for a second, not a minute.
    """
    monkeypatch.setattr(service_module, "TICK_S", 0.05)
    monkeypatch.setattr(service_module, "LIVENESS_STALE_S", 0.5)
    service = make_service(tmp_path)
    task = asyncio.create_task(service.run(), name="service-under-test")
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if service._health._port is not None:
                break
        port = service._health.port
        alive = await asyncio.to_thread(fetch, port, "/healthz")
        assert alive.status == 200, alive

        seen: list[Response] = []

        def probe_while_stuck() -> None:
            time.sleep(1.0)
            seen.append(fetch(port, "/healthz"))

        prober = threading.Thread(target=probe_while_stuck)
        prober.start()
        time.sleep(1.5)  # noqa: ASYNC251 - blocking the loop is the point
        prober.join()
        assert seen[0].status == 503, seen
        assert "event loop has not run" in seen[0].body

        await asyncio.sleep(0.3)  # the loop runs again: a tick stamps it alive
        again = await asyncio.to_thread(fetch, port, "/healthz")
        assert again.status == 200, again
    finally:
        service.request_stop()
        async with asyncio.timeout(15):
            assert await task == 0


def test_healthz_stays_200_while_stopping(tmp_path: Path) -> None:
    """Draining after SIGTERM ends the ticks; that is a planned exit, not a dead loop."""
    service = make_service(tmp_path)
    service._last_tick -= 10 * service_module.LIVENESS_STALE_S
    assert not service.liveness().ok
    service.request_stop()
    assert service.liveness().ok


# --- the bounds: connections, time per request, threads, descriptors ------------------------

# The start of a request that never ends: what a slowloris client sends.
UNFINISHED = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nX-Slow: "


def open_unfinished(port: int) -> socket.socket:
    """Connect and send the start of a request, never its end."""
    sock = socket.create_connection((HOST, port), timeout=5)
    sock.sendall(UNFINISHED)
    return sock


def closed_by_server(sock: socket.socket, *, wait_s: float) -> bool:
    """Whether the server closed ``sock`` (end of stream or reset) within ``wait_s``."""
    sock.settimeout(wait_s)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", f"the server answered instead of closing: {data[:200]!r}"
    return True


def exchange(port: int, raw: bytes) -> bytes:
    """Send raw bytes, read until the server closes; return what it sent."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(raw)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Leave this process no free file descriptor for the block (RLIMIT_NOFILE lowered)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd.name) for fd in Path("/proc/self/fd").iterdir())
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 16, hard))
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as e:
                if e.errno != errno.EMFILE:
                    raise
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_at_the_cap_the_oldest_unfinished_connection_makes_room(probes: Probes) -> None:
    """Ten slow clients on a cap of two: a probe is still answered, never more than two open.

    Refusing the newcomer instead would let a flood of slow clients hold every slot, and
    every kubelet probe would fail: the pod would be restarted and the relay stopped.
    """
    server = make_server(probes, limits=Limits(max_connections=2, request_timeout_s=60))
    server.start()
    slow = [open_unfinished(server.port) for _ in range(10)]
    try:
        assert fetch(server, "/healthz").status == 200  # accepted after all ten
        assert [closed_by_server(sock, wait_s=5) for sock in slow[:-1]] == [True] * 9
        assert not closed_by_server(slow[-1], wait_s=0.3), "the newest slow client was cut"
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_at_the_cap_with_every_connection_answering_a_newcomer_is_closed_at_once() -> None:
    """A response being written is never cut for a newcomer: the newcomer is closed instead."""
    body = b"x" * (16 * 1024 * 1024)  # far more than the socket buffers hold

    def respond(request: Request) -> Reply:
        del request
        return Reply(status=HTTPStatus.OK, content_type="text/plain", body=body)

    listener = listen(HOST, 0)
    port = int(listener.getsockname()[1])
    server = HttpServer(
        listener, respond=respond, limits=Limits(max_connections=1, response_timeout_s=60)
    )
    server.start()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        reader.settimeout(10)
        reader.connect((HOST, port))
        reader.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert reader.recv(15) == b"HTTP/1.1 200 OK"  # answering, and now it stops reading
        with socket.create_connection((HOST, port), timeout=10) as newcomer:
            newcomer.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert closed_by_server(newcomer, wait_s=10)
    finally:
        reader.close()
        server.stop()


def test_a_client_that_trickles_its_request_is_cut_at_the_deadline(probes: Probes) -> None:
    """Slowloris: a byte every 0.1 s keeps no connection open past request_timeout_s."""
    server = make_server(probes, limits=Limits(request_timeout_s=0.5))
    server.start()
    sock = open_unfinished(server.port)
    try:
        cut = False
        for _ in range(200):  # 20 s of trickling, 40 times the deadline
            try:
                sock.sendall(b"a")
            except OSError:
                cut = True
                break
            if closed_by_server(sock, wait_s=0.1):
                cut = True
                break
        assert cut, "a client that sent a byte every 0.1 s was never cut"
    finally:
        sock.close()
        server.stop()


def test_connections_add_no_threads(server: HealthServer) -> None:
    """Twenty open connections run on the server's one thread, not a thread each."""
    before = threading.active_count()
    slow = [open_unfinished(server.port) for _ in range(20)]
    try:
        assert fetch(server, "/healthz").status == 200  # accepted after all twenty
        assert threading.active_count() == before
    finally:
        for sock in slow:
            sock.close()


def test_out_of_descriptors_accepting_pauses_instead_of_spinning_then_recovers(
    server: HealthServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE leaves the listener readable: retrying at once would spin a core, so it pauses.

    The connection waiting in the backlog is answered once descriptors are free again,
    and the condition is logged once, not per attempt.
    """
    failures = 0
    accept = socket.socket.accept

    def counting_accept(self: socket.socket) -> tuple[socket.socket, Any]:
        nonlocal failures
        try:
            return accept(self)
        except OSError as e:
            if e.errno == errno.EMFILE:
                failures += 1
            raise

    monkeypatch.setattr(socket.socket, "accept", counting_accept)
    client = socket.socket()
    client.settimeout(10)
    try:
        with descriptors_exhausted():
            client.connect((HOST, server.port))  # a connection needs no new descriptor here
            time.sleep(1.0)  # the window in which accept attempts are counted
            during = failures
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
    finally:
        client.close()
    # Spinning made many thousands of attempts a second; the pause allows about one.
    assert 1 <= during <= 5, f"{during} accept attempts failed with EMFILE in 1 s"
    assert reply.split(b"\r\n", 1)[0].endswith(b" 200 OK"), reply
    lines = [r for r in caplog.records if "cannot accept HTTP connections" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


@pytest.mark.parametrize(
    ("limit", "cap"),
    [
        (None, 64),
        (1_048_576, 64),
        (1024, 64),
        (256, 64),
        (98, 64),
        (97, 63),
        (40, 6),
        (10, 1),
    ],
)
def test_the_connection_cap_leaves_descriptors_to_the_broker(limit: int | None, cap: int) -> None:
    """However low RLIMIT_NOFILE is, the HTTP side leaves RESERVED_DESCRIPTORS free."""
    assert connection_budget(64, descriptor_limit=limit) == cap
    if limit is not None and cap > 1:
        assert cap + 2 + RESERVED_DESCRIPTORS <= limit


def test_stop_closes_open_connections(probes: Probes) -> None:
    """A stopped server holds no connection open, long before any deadline would cut it."""
    server = make_server(probes, limits=Limits(request_timeout_s=600))
    server.start()
    sock = open_unfinished(server.port)
    try:
        assert fetch(server, "/healthz").status == 200  # the slow one was accepted first
        server.stop()
        assert closed_by_server(sock, wait_s=5)
    finally:
        sock.close()
        server.stop()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NOT HTTP\r\n\r\n", b"400 Bad Request"),
        (UNFINISHED + b"a" * (64 * 1024), b"431 Request Header Fields Too Large"),
        (b"POST /readyz HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", b"501 Not Impl"),
        (b"GET /healthz HTTP/1.0\r\n\r\n", b"200 OK"),
    ],
)
def test_malformed_oversized_or_other_requests(
    server: HealthServer, raw: bytes, status: bytes
) -> None:
    """h11 parses: a bad or oversized head, another method, HTTP/1.0 each get their answer."""
    reply = exchange(server.port, raw)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
    assert b"\r\nConnection: close\r\n" in reply


def test_an_endpoint_that_raises_answers_500() -> None:
    """A bug in what answers is a 500 with its text, and the server goes on serving."""
    calls = 0

    def respond(request: Request) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise LookupError("no such thing")
        return Reply(status=HTTPStatus.OK, content_type="text/plain", body=request.target.encode())

    listener = listen(HOST, 0)
    server = HttpServer(listener, respond=respond)
    server.start()
    try:
        port = int(listener.getsockname()[1])
        first = exchange(port, b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 500 Internal Server Error"), first
        assert first.endswith(b"LookupError: no such thing\n")
        assert exchange(port, b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n").endswith(b"\r\n\r\n/b")
    finally:
        server.stop()


@pytest.mark.parametrize(
    "limits",
    [
        {"max_connections": 0},
        {"request_timeout_s": 0},
        {"response_timeout_s": -1},
        {"accept_retry_s": 0},
    ],
)
def test_limits_refuse_values_that_bound_nothing(limits: dict[str, float]) -> None:
    """A zero cap or deadline would refuse or cut everything: refused with its name."""
    with pytest.raises(ValueError, match=next(iter(limits))):
        Limits(**limits)  # type: ignore[arg-type]
