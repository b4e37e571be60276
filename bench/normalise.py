"""Cost of one normalise call: median over many timed batches, for three messages.

Usage: python bench/normalise.py [--batches N] [--per-batch N]
Prints `canonical <us> us`, `repaired <us> us`, `rejected <us> us`.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Mapping

from sidecar.contract import Policy, Publishers, normalise
from sidecar.wire import FieldValue, Float32, Int32, Int64

# A realistic AceMQ envelope as the Java library writes it, plus application headers.
CANONICAL: dict[str, FieldValue] = {
    "x-acemq-id": "ord-81",
    "x-acemq-type": "order.shipped",
    "x-acemq-version": Int32(2),
    "x-acemq-correlation": "corr-81",
    "x-acemq-attempt": Int32(1),
    "x-acemq-first-seen": Int64(1_767_323_045_678),
    "x-acemq-causation": "ord-80",
    "x-acemq-origin": "shipping@host-2",
    "acemq-reply-to": "amq.rabbitmq.reply-to.g1h2",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "x-tenant": "acme",
}
# What .NET 0.5.0 and Go write: empty strings, text numbers, a float first-seen, legacy stamps.
REPAIRED: dict[str, FieldValue] = {
    "x-acemq-id": "",
    "x-acemq-type": "order.shipped",
    "x-acemq-version": " 2 ",
    "x-acemq-correlation": "corr-81",
    "x-acemq-attempt": Int32(0),
    "x-acemq-first-seen": Float32(1.5e12),
    "x-acemq-causation": "",
    "x-acemq-replayed-from": "orders.dlq",
    "x-acemq-replayed-at": "2026-02-03T04:05:06.7891234+00:00",
    "x-acemq-replay-count": Int32(2),
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "x-tenant": "acme",
}
# An application on an `apps` route that set a header in the reserved namespace.
REJECTED: dict[str, FieldValue] = {**CANONICAL, "x-acemq-tenant": "acme"}

PROPERTIES = {"message_id": "ord-81", "reply_to": "amq.rabbitmq.reply-to.g1h2", "user_id": "svc"}
NOW_MS = 1_790_000_000_000


def _new_id() -> str:
    return str(uuid.uuid4())


def median_us(
    headers: Mapping[str, FieldValue], policy: Policy, *, batches: int, per_batch: int
) -> float:
    """Median over batches of the mean per-call time of normalise, in microseconds."""
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(per_batch):
            normalise("orders", PROPERTIES, headers, policy=policy, now_ms=NOW_MS, new_id=_new_id)
        samples.append((time.perf_counter_ns() - start) / per_batch / 1000)
    return statistics.median(samples)


def main() -> None:
    """Print the three figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=101)
    parser.add_argument("--per-batch", type=int, default=1000)
    args = parser.parse_args()
    acemq = Policy(publishers=Publishers.ACEMQ, origin="orders@sidecar", login="svc")
    apps = Policy(publishers=Publishers.APPS, origin=None, login="svc")
    for label, headers, policy in (
        ("canonical", CANONICAL, acemq),
        ("repaired", REPAIRED, acemq),
        ("rejected", REJECTED, apps),
    ):
        cost = median_us(headers, policy, batches=args.batches, per_batch=args.per_batch)
        print(f"{label} {cost:.2f} us")


if __name__ == "__main__":
    main()
