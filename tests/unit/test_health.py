"""The HTTP endpoint: /metrics, /healthz and /readyz served from a thread on a real socket."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from sidecar.health import HealthBindError, HealthServer, Probe
from sidecar.metrics import Metrics

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


def make_server(probes: Probes, *, port: int = 0) -> HealthServer:
    registry = CollectorRegistry()
    Metrics(registry, version="1.2.3", contract="1").add_route("orders")
    return HealthServer(
        host=HOST, port=port, registry=registry, liveness=probes.live, readiness=probes.ready
    )


@pytest.fixture
def server(probes: Probes) -> Iterator[HealthServer]:
    server = make_server(probes)
    server.start()
    yield server
    server.stop()


def fetch(server: HealthServer, path: str, *, method: str = "GET") -> Response:
    request = urllib.request.Request(f"http://{HOST}:{server.port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310
            return _response(reply.status, reply.headers, reply.read())
    except urllib.error.HTTPError as e:
        with e:
            return _response(e.code, e.headers, e.read())


def _response(status: int, headers: Message, body: bytes) -> Response:
    return Response(status, headers["Content-Type"], int(headers["Content-Length"]), body.decode())


def test_metrics_serves_the_registry(server: HealthServer) -> None:
    """Prometheus gets the text exposition of the injected registry."""
    reply = fetch(server, "/metrics")
    assert reply.status == 200
    assert reply.content_type == CONTENT_TYPE_LATEST
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
    server.stop()
    server.stop()


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
