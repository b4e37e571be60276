"""The sidecar's own CPU per message, without a broker: one route against a fake one.

Usage: python bench/pipeline.py [--n N] [--repeat R] [--trace-ratio R]

Runs a route's ``RouteWorker`` (the settler, the publish lane, the AMQP client's link and
channels, the metrics: everything a delivery crosses but the socket) in this process,
against a fake broker that stands in for the socket: it answers the channel and consume
methods, delivers N prebuilt messages (bench/harness.py's mix) up to the prefetch in reads
of at most 64 KiB, confirms every publish in the read that carried it, and counts the
sidecar's acks. It prints the process CPU µs per message of each drain, less what the
fake broker itself spent (measured around its own work), then one JSON line.

Run it with the Python of the build to measure (``/other/worktree/.venv/bin/python
bench/pipeline.py``): it imports whichever ``sidecar`` that interpreter has.
bench/ab.py --pipeline alternates two builds of it. On a busy machine the minimum over
the drains is the figure to compare: contention only ever adds time. ``--trace-ratio R``
turns tracing on with R of the deliveries sampled (``OTEL_TRACES_SAMPLER=traceidratio``:
R of the producers' traces, each message of a trace of its own), the spans encoded as
OTLP protobuf and dropped, not sent: the cost of the spans and their encoding, without a
collector. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from itertools import takewhile
from typing import Any, TypeVar

from harness import BODY, headers_for
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from prometheus_client import CollectorRegistry

from sidecar.amqp import install_codec
from sidecar.amqp.connection import Connection
from sidecar.amqp.handshake import Control
from sidecar.amqp.link import Link
from sidecar.clock import Clock
from sidecar.contract import ID
from sidecar.observe.metrics import Metrics
from sidecar.relay.worker import RouteWorker
from sidecar.routemap import Mode, Publishers, Route

_T = TypeVar("_T")
READ_BYTES = 65_536  # what one read from the socket hands the link at most
PREFETCH = 512  # the route map's default
HEADER = struct.Struct(">BHI")
FRAME_END = b"\xce"


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    """One frame's bytes."""
    return HEADER.pack(kind, channel, len(payload)) + payload + FRAME_END


def deliveries(n: int, channel: int) -> list[bytes]:
    """The frames of n deliveries on a channel, delivery tags 1..n.

    Traced (``--trace-ratio``), each message is of a trace of its own, as producers make
    them, so that a ratio samples that share of them.
    """
    out = []
    traces = random.Random(7)
    for i in range(n):
        headers = headers_for(i)
        if TRACE_RATIO:
            trace_id, span_id = traces.getrandbits(128), traces.getrandbits(64)
            headers["traceparent"] = f"00-{trace_id:032x}-{span_id:016x}-01"
        properties = spec.Basic.Properties(  # type: ignore[arg-type]
            headers=headers, delivery_mode=2, message_id=f"m-{i}"
        )
        header = pamqp_header.ContentHeader(0, len(BODY), properties)
        deliver = spec.Basic.Deliver("acemq-sidecar.bench", i + 1, False, "", "staging")
        out.append(
            pamqp_frame.marshal(deliver, channel)
            + pamqp_frame.marshal(header, channel)
            + frame(3, channel, BODY)
        )
    return out


class FakeBroker:
    """The socket's stand-in: reads the sidecar's frames, answers them in the next turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, link: Link, n: int) -> None:
        self.loop = loop
        self.link = link
        self.n = n
        self._messages: list[bytes] = []
        self._consumer = 0
        self._prefetch = PREFETCH
        self._qos: dict[int, int] = {}
        self._next = 0
        self._unacked: dict[int, None] = {}
        self._published: dict[int, int] = {}  # the last tag published in this read
        self._tags: dict[int, int] = {}  # the last publish tag of each channel
        self._inbox: list[bytes] = []
        self._due = False
        self._closing = False
        self.acked = 0
        self.started: float | None = None
        self.own_cpu_s = 0.0
        self.done = loop.create_future()

    def prepare(self, consumer_channel: int) -> None:
        """Build the deliveries for the channel the consumer will be on."""
        self._messages = deliveries(self.n, consumer_channel)

    # --- what asyncio's transport offers the link ---

    def write(self, data: bytes) -> None:
        """Take what the sidecar writes; it is read at the end of this turn."""
        self._inbox.append(data)
        if not self._due:
            self._due = True
            self.loop.call_soon(self._read)

    def is_closing(self) -> bool:
        """Whether the link closed us."""
        return self._closing

    def set_write_buffer_limits(self, **_: int) -> None:
        """Nothing is buffered."""

    def pause_reading(self) -> None:
        """Nothing to pause."""

    def resume_reading(self) -> None:
        """Nothing to resume."""

    def close(self) -> None:
        """The link is done."""
        self._closing = True

    def abort(self) -> None:
        """The link is done."""
        self._closing = True

    # --- the broker ---

    def _read(self) -> None:
        t0 = time.process_time()
        self._due = False
        data = b"".join(self._inbox)
        self._inbox.clear()
        out: list[bytes] = []
        at = 0
        if data.startswith(b"AMQP"):
            at = 8
        while at < len(data):
            kind, channel, size = HEADER.unpack_from(data, at)
            payload = data[at + 7 : at + 7 + size]
            at += 8 + size
            if kind == 1:
                self._method(channel, payload, out)
        for channel, tag in self._published.items():
            out.append(frame(1, channel, struct.pack(">HHQB", 60, 80, tag, 1)))
        self._deliver(out)
        self._send(out)
        self.own_cpu_s += time.process_time() - t0
        if self.acked == self.n and not self.done.done():
            self.done.set_result(None)

    def _method(self, channel: int, payload: bytes, out: list[bytes]) -> None:  # noqa: C901, PLR0912 - a case per method
        ids = struct.unpack_from(">HH", payload, 0)
        if ids == (60, 40):  # basic.publish: confirmed in this read
            self._tags[channel] = self._published[channel] = self._tags.get(channel, 0) + 1
            return
        if ids == (60, 80):  # basic.ack
            tag, bits = struct.unpack_from(">QB", payload, 4)
            if bits & 1:  # tags are delivered in order: the dict's order is theirs
                for t in list(takewhile(tag.__ge__, self._unacked)):
                    del self._unacked[t]
                    self.acked += 1
            elif tag in self._unacked:
                del self._unacked[tag]
                self.acked += 1
            return
        if ids == (60, 90):  # basic.reject
            (tag,) = struct.unpack_from(">Q", payload, 4)
            if tag in self._unacked:
                del self._unacked[tag]
                self.acked += 1
            return
        method: Any = pamqp_frame.unmarshal(frame(1, channel, payload))[2]
        reply: Any = None
        match method:
            case spec.Channel.Open():
                reply = spec.Channel.OpenOk()
            case spec.Confirm.Select():
                reply = spec.Confirm.SelectOk()
            case spec.Basic.Qos():
                self._qos[channel] = method.prefetch_count
                reply = spec.Basic.QosOk()
            case spec.Queue.Declare():
                reply = spec.Queue.DeclareOk(method.queue, self.n - self._next, 0)
            case spec.Exchange.Declare():
                reply = spec.Exchange.DeclareOk()
            case spec.Basic.Consume():
                if self.started is None:  # the route's first consumer: the drain starts
                    self.started = time.process_time()
                if channel != self._consumer:  # a re-consume on the same channel reuses them
                    self.prepare(channel)
                self._consumer = channel
                self._prefetch = self._qos.get(channel, PREFETCH) or PREFETCH
                reply = spec.Basic.ConsumeOk(method.consumer_tag)
            case spec.Basic.Cancel():
                reply = spec.Basic.CancelOk(method.consumer_tag)
            case spec.Channel.Close():
                reply = spec.Channel.CloseOk()
            case spec.Channel.CloseOk():
                reply = None
            case _:
                raise RuntimeError(f"the fake broker cannot answer {method!r}")
        if reply is not None:
            out.append(pamqp_frame.marshal(reply, channel))

    def _deliver(self, out: list[bytes]) -> None:
        if not self._consumer:
            return
        while len(self._unacked) < self._prefetch and self._next < self.n:
            out.append(self._messages[self._next])
            self._next += 1
            self._unacked[self._next] = None

    def _send(self, out: list[bytes]) -> None:
        """Hand the replies to the link in reads of at most READ_BYTES, one per turn."""
        self._published = {}
        data = b"".join(out)
        for start in range(0, len(data), READ_BYTES):
            self.loop.call_soon(self.link.data_received, data[start : start + READ_BYTES])


def route_worker(route: Route, **context: object) -> RouteWorker:
    """Make a RouteWorker as this build does: from a RouteContext, or (older builds) keywords."""
    try:
        from sidecar.relay.context import RouteContext  # noqa: PLC0415 - not in older builds
    except ImportError:
        return RouteWorker(route, **context)  # type: ignore[arg-type]
    return RouteWorker(RouteContext(route=route, **context))  # type: ignore[call-arg]


class _Encoded:
    """An exporter that encodes each batch as OTLP protobuf, as OTLP's do, and drops it."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import (  # noqa: PLC0415
            encode_spans,
        )
        from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: PLC0415

        self._encode = encode_spans
        self._success = SpanExportResult.SUCCESS
        self.spans = 0

    def export(self, spans: list[object]) -> object:
        self.spans += len(spans)
        self._encode(spans).SerializeToString()
        return self._success

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:  # noqa: ARG002
        return True


TRACE_RATIO: list[float] = []  # set by --trace-ratio: tracing on, this share sampled
TRACE_EXPORTER: list[Any] = []  # the drain's exporter, which counts the spans


def _tracer(route: Route, metrics: Metrics) -> tuple[Any, Any]:
    """Return the route's tracer and the tracing it belongs to, or (None, None) when off."""
    if not TRACE_RATIO:
        return None, None
    from opentelemetry.sdk.trace.export import SpanExporter  # noqa: PLC0415

    from sidecar.observe import start_tracing  # noqa: PLC0415
    from sidecar.routemap import TracingConfig  # noqa: PLC0415

    exporter = type("Encoded", (_Encoded, SpanExporter), {})()
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(TRACE_RATIO[0])}
    # A queue that never fills: every span is encoded and counted in the drain's CPU.
    config = TracingConfig(max_queue_size=1_000_000)
    tracing = start_tracing(config, env=env, metrics=metrics, version="bench", exporter=exporter)
    assert tracing is not None  # noqa: S101
    TRACE_EXPORTER[:] = [exporter]
    return tracing.for_route(route, quarantine_exchange="quarantine"), tracing


async def drain(n: int) -> dict[str, float]:
    """Drain n messages through one route; return the CPU per message, ours and the fake's."""
    install_codec()
    loop = asyncio.get_running_loop()
    link = Link(loop, match_header=ID)  # as the relay's
    link.control = control = Control(link)
    broker = FakeBroker(loop, link, n)
    link.connection_made(broker)  # type: ignore[arg-type]
    connection = Connection(link, control)
    route = Route(
        name="bench",
        queue="staging",
        exchange="target",
        routing_key=None,
        publishers=Publishers.ACEMQ,
        origin=None,
        mode=Mode.ENFORCE,
        prefetch=PREFETCH,
    )
    metrics = Metrics(CollectorRegistry(), version="bench", contract="1.1")
    metrics.add_route(route.name)
    tracer, tracing = _tracer(route, metrics)
    traced = {} if tracer is None else {"tracer": tracer}
    worker = route_worker(
        route,
        **traced,
        quarantine_exchange="quarantine",
        login="guest",
        metrics=metrics,
        clock=Clock.system(),
        new_id=lambda: str(uuid.uuid4()),
        rng=random.Random(1),
    )
    task = asyncio.create_task(worker.run(connection, grace_s=5.0), name="route:bench")  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.shield(broker.done), timeout=600)
    if tracing is not None:
        tracing.provider.force_flush()  # every span encoded before the clock is read
    end = time.process_time()
    assert broker.started is not None  # noqa: S101
    worker.request_stop()
    await asyncio.wait_for(task, timeout=30)
    total = end - broker.started
    spans = {"spans": TRACE_EXPORTER[0].spans} if tracing is not None else {}
    return {
        "sidecar_us_per_msg": (total - broker.own_cpu_s) / n * 1e6,
        "fake_broker_us_per_msg": broker.own_cpu_s / n * 1e6,
        **spans,
    }


async def serve() -> None:
    """Drain as many messages as each line of stdin says; print each drain's JSON line."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        print(json.dumps(await drain(int(line))), flush=True)


def compare(a: str, b: str, *, n: int, pairs: int) -> None:
    """Alternate drains of two builds, each a Python that serves them; print the ratios."""
    command = [sys.argv[0], "--serve"]
    workers = {
        name: subprocess.Popen(
            [python, *command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for name, python in (("a", a), ("b", b))
    }
    runs: dict[str, list[float]] = {"a": [], "b": []}
    try:
        for pair in range(pairs + 1):
            for name in ("a", "b") if pair % 2 == 0 else ("b", "a"):
                worker = workers[name]
                assert worker.stdin is not None  # noqa: S101
                assert worker.stdout is not None  # noqa: S101
                worker.stdin.write(f"{n}\n")
                worker.stdin.flush()
                result = json.loads(worker.stdout.readline())
                if pair:  # the first pair warms both up (imports, caches): not counted
                    runs[name].append(result["sidecar_us_per_msg"])
    finally:
        for worker in workers.values():
            if worker.stdin is not None:
                worker.stdin.close()
            worker.wait(timeout=60)
    ratios = [y / x for x, y in zip(runs["a"], runs["b"], strict=True)]
    summary = {
        "n": n,
        "pairs": pairs,
        "a": a,
        "b": b,
        "a_us_per_msg": {
            "min": round(min(runs["a"]), 1),
            "median": round(statistics.median(runs["a"]), 1),
        },
        "b_us_per_msg": {
            "min": round(min(runs["b"]), 1),
            "median": round(statistics.median(runs["b"]), 1),
        },
        "b/a": {
            "median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        },
    }
    print(json.dumps(summary))


def instructions(python: str, n: int) -> int:
    """Return the instructions one drain of n messages takes in a process, start-up included."""
    out = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            python,
            sys.argv[0],
            "--n",
            str(n),
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    refs = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if refs is None:
        sys.exit(f"no instruction count from valgrind: {out.stderr[-500:]}")
    return int(refs.group(1).replace(",", ""))


def count(a: str, b: str, *, n: int) -> None:
    """Print the instructions per message of two builds: a drain of 5n less one of n."""
    per_message: dict[str, float] = {}
    for name, python in (("a", a), ("b", b)):
        small, large = instructions(python, n), instructions(python, 5 * n)
        per_message[name] = (large - small) / (4 * n)
    summary = {
        "n": n,
        "a": a,
        "b": b,
        "a_instructions_per_msg": round(per_message["a"]),
        "b_instructions_per_msg": round(per_message["b"]),
        "b/a": round(per_message["b"] / per_message["a"], 3),
    }
    print(json.dumps(summary))


def main() -> None:
    """Drain, serve drains, or compare two builds (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help="drain N for each line of stdin")
    parser.add_argument("--a", help="compare: the baseline build's python")
    parser.add_argument("--b", default=sys.executable, help="compare: the other build's python")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--trace-ratio", type=float, help="tracing on, this share sampled")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="compare: count instructions under valgrind (drains of N and 5N) instead",
    )
    args = parser.parse_args()
    if args.a and args.instructions:
        count(args.a, args.b, n=args.n)
        return
    if args.a:
        compare(args.a, args.b, n=args.n, pairs=args.pairs)
        return
    if args.trace_ratio is not None:
        TRACE_RATIO.append(args.trace_ratio)
    run = _loop_runner()
    _tune_collector()
    if args.serve:
        run(serve())
        return
    results = [run(drain(args.n)) for _ in range(args.repeat)]
    ours = [r["sidecar_us_per_msg"] for r in results]
    summary = {
        "n": args.n,
        "sidecar_us_per_msg_min": round(min(ours), 2),
        "sidecar_us_per_msg_median": round(statistics.median(ours), 2),
        "fake_broker_us_per_msg_min": round(min(r["fake_broker_us_per_msg"] for r in results), 2),
        "runs": [round(x, 2) for x in ours],
        **({"spans": [r["spans"] for r in results]} if TRACE_RATIO else {}),
    }
    print(json.dumps(summary))


def _tune_collector() -> None:
    """The garbage collector as ``acemq-sidecar run`` sets it, where the build has it."""
    try:
        from sidecar.cli import tune_collector  # noqa: PLC0415
    except ImportError:  # an older build (--a): it ran with the interpreter's defaults
        return
    tune_collector()


def _loop_runner() -> Callable[[Coroutine[Any, Any, _T]], _T]:
    """The sidecar runs on uvloop where it is installed; so does this."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run
    return uvloop.run


if __name__ == "__main__":
    main()
