"""The seed corpora, made afresh from the contract's vectors and the wire tests' frames.

``write_seeds(root)`` writes ``root/TARGET/NAME`` for every target, in each target's input
layout (see its module): the header tables, properties and routing keys of
tests/contract/vectors.json as tables, content headers, messages for ``normalise`` and
whole deliveries on the wire; the frames the wire tests build with pamqp (a delivery with
a heartbeat between its frames, control frames of channels 0 and 1); the example route
map and variants of it using each way of naming the broker; the requests Prometheus and
a kubelet send. Nothing here is committed: a run makes them (``python -m fuzz.seeds DIR``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import install_codec
from sidecar.contract import Publishers, message_from_json
from sidecar.errors import WireError
from sidecar.wire import (
    BASIC_DELIVER,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    HEADER,
    HEARTBEAT,
    METHOD,
    content_header,
    encode_table,
    put_shortstr,
)

if TYPE_CHECKING:
    from sidecar.contract import Policy

__all__ = ["REPO", "write_seeds"]

REPO = Path(__file__).resolve().parents[1]
VECTORS = REPO / "tests" / "contract" / "vectors.json"
_BODY = b'{"order": 42}'
_ROUTES = (
    "quarantine: {exchange: q}\n"
    "routes:\n"
    "  - name: orders\n"
    "    from: staging.orders\n"
    "    to: {exchange: orders, routing_key: keep}\n"
    "    publishers: acemq\n"
    "    origin: orders@sidecar\n"
    "  - name: invoices\n"
    "    from: staging.invoices\n"
    "    to: {exchange: '', routing_key: invoices}\n"
    "    publishers: apps\n"
    "    prefetch: 64\n"
)
_BROKERS = (
    "broker: {url: '${AMQP_URL}', prefetch: 256, heartbeat_s: 30}\n",
    "broker:\n  urls: ['amqp://a:b@r1:5672/', 'amqp://a:b@r2:5673/?heartbeat=10']\n",
    "broker: {url_file: /run/secrets/url, max_body_bytes: 2097152}\n",
    "broker: {url_file: /run/secrets/urls, nack_retry: {max_attempts: 3, max_s: 60}}\n",
    (
        "broker:\n  url: amqps://rabbit/\n  username_file: /run/secrets/username\n"
        "  password_file: /run/secrets/password\n"
        "  tls: {ca_file: ca.pem, cert_file: c.bad, key_file: k.pem}\n"
    ),
    (
        "broker: {url: 'amqp://${ACEMQ_FUZZ:-x}@h/', consumer_timeout_s: 1800}\n"
        "http: {listen: '[::1]:9090'}\nmetrics: {producers_per_route: 20}\n"
        "mode: audit\nshutdown_grace_s: 10\nlog_level: debug\n"
    ),
)
_REQUESTS = (
    (
        b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:9090\r\nUser-Agent: Prometheus/2.51.0\r\n"
        b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
        b"Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
    ),
    (
        b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.7:9090\r\nUser-Agent: kube-probe/1.30\r\n"
        b"Accept: */*\r\nConnection: close\r\n\r\n"
    ),
    b"HEAD /readyz?verbose=1 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET /readyz HTTP/1.0\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody",
    b"GET http://localhost:9090/metrics#x HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
)


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return HEADER.pack(kind, channel, len(payload)) + payload + bytes((FRAME_END,))


def _deliver(routing_key: str, tag: int) -> bytes:
    out = [METHOD.pack(BASIC_DELIVER)]
    put_shortstr("acemq-sidecar.orders#1", out, "consumer tag")
    out.append(tag.to_bytes(8, "big") + b"\x00")
    put_shortstr("staging", out, "exchange")
    put_shortstr(routing_key, out, "routing key")
    return b"".join(out)


def _wire_test_frames() -> list[bytes]:
    """Return the frames tests/unit/amqp builds with pamqp: a delivery, control frames."""
    deliver = spec.Basic.Deliver("c", 7, False, "", "staging")
    header = pamqp_header.ContentHeader(0, 8, spec.Basic.Properties(message_id="m"))
    delivery = [
        pamqp_frame.marshal(deliver, 1),
        pamqp_frame.marshal(header, 1),
        HEARTBEAT,
        pamqp_frame.marshal(pamqp_body.ContentBody(b"the body"), 1),
    ]
    controls = [
        pamqp_frame.marshal(spec.Basic.QosOk(), 1),
        pamqp_frame.marshal(spec.Basic.Ack(3, multiple=True), 1),
        pamqp_frame.marshal(spec.Basic.Nack(4), 1),
        pamqp_frame.marshal(spec.Basic.Return(312, "NO_ROUTE", "x", "k"), 1),
        pamqp_frame.marshal(spec.Basic.Cancel("c"), 1),
        pamqp_frame.marshal(spec.Channel.Close(406, "PRECONDITION_FAILED", 60, 40), 1),
        pamqp_frame.marshal(spec.Connection.Blocked("low on memory"), 0),
        pamqp_frame.marshal(spec.Connection.Unblocked(), 0),
    ]
    return [b"".join(delivery), *controls, b"".join(delivery + controls)]


def _policy_byte(policy: Policy) -> int:
    apps = policy.publishers is Publishers.APPS
    return int(apps) | (2 if policy.origin else 0) | (4 if policy.login == "guest" else 0)


def _vector_seeds(vector: dict[str, Any]) -> dict[str, bytes]:
    """One vector's message in the layout of each target that reads headers."""
    routing_key, properties, headers, policy, _ = message_from_json(vector)
    try:
        table = encode_table(headers)
        payload = content_header(properties, headers, body_size=len(_BODY), frame_max=2**20)
        key = routing_key.encode("utf-8", "surrogateescape")[:255]
    except (WireError, ValueError):
        return {}  # a vector of values the wire cannot carry: the hypothesis tests have it
    seeds = {"tables": b"\x00" + table}
    if len(payload) < 1 << 16:
        seeds["content"] = b"\x3f" + len(payload).to_bytes(2, "big") + payload + _BODY
    seeds["normalise"] = bytes((_policy_byte(policy), len(key))) + key + payload
    seeds["frames"] = b"\x02\x06\x0c" + b"".join(
        [
            _frame(FRAME_METHOD, 1, _deliver(routing_key[:200], 1)),
            _frame(FRAME_HEADER, 1, payload),
            _frame(FRAME_BODY, 1, _BODY[:5]),
            HEARTBEAT,
            _frame(FRAME_BODY, 1, _BODY[5:]),
        ]
    )
    return seeds


def _all_seeds() -> dict[str, list[bytes]]:
    install_codec()  # pamqp writes tables with our codec, as the wire tests do
    seeds: dict[str, list[bytes]] = {
        "frames": [b"\x00" + frames for frames in _wire_test_frames()],
        "tables": [],
        "content": [],
        "normalise": [],
        "routemap": [(REPO / "config" / "example.yaml").read_bytes()]
        + [(broker + _ROUTES).encode() for broker in _BROKERS],
        "http_request": list(_REQUESTS),
    }
    for vector in json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]:
        for target, seed in _vector_seeds(vector).items():
            seeds[target].append(seed)
    return seeds


def write_seeds(root: Path) -> dict[str, int]:
    """Write each target's seeds under ``root/TARGET/``; return how many each has."""
    counts = {}
    for target, inputs in _all_seeds().items():
        folder = root / target
        folder.mkdir(parents=True, exist_ok=True)
        for data in inputs:
            (folder / hashlib.sha1(data, usedforsecurity=False).hexdigest()).write_bytes(data)
        counts[target] = len(inputs)
    return counts


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m fuzz.seeds DIR\n")
        sys.exit(2)
    for name, n in write_seeds(Path(sys.argv[1])).items():
        sys.stdout.write(f"{name}: {n} seeds\n")
