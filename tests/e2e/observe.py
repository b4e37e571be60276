"""Helpers for the observability tests: read a running sidecar's /metrics, /readyz and log.

The process fixture and its HTTP helpers live in tests/e2e/conftest.py; this module adds
what only these tests need: the whole scrape as a mapping, the JSON log lines, scripted
messages with the violations the contract says they carry, and a sidecar whose violation
log interval is short enough to see a suppressed count within a test.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from sidecar.contract import Policy, Publishers, Reject, normalise
from tests.e2e.conftest import Sidecar

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from tests.support import Broker

# What a sample's labels are keyed by: the sample name and its sorted label pairs.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
LOGIN = "guest"  # the sidecar's login in tests.support's broker URL


def samples(text: str) -> dict[SampleKey, float]:
    """Return every sample of a Prometheus text exposition, keyed by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(
    scrape: Mapping[SampleKey, float], name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """Return the samples of one name from ``samples()``, keyed by their labels."""
    return {labels: value for (sample, labels), value in scrape.items() if sample == name}


def labelled(
    scrape: Mapping[SampleKey, float], name: str, *keys: str
) -> dict[tuple[str, ...], float]:
    """Return one metric's samples keyed by the values of ``keys`` (all its label names)."""
    result: dict[tuple[str, ...], float] = {}
    for labels, value in series(scrape, name).items():
        as_dict = dict(labels)
        assert set(as_dict) == set(keys), f"{name} has labels {sorted(as_dict)}, not {keys}"
        result[tuple(as_dict[key] for key in keys)] = value
    return result


def json_lines(text: str) -> list[dict[str, Any]]:
    """Parse a log in which every line must be one JSON object (the off-terminal format)."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as e:
            raise AssertionError(f"log line {number} is not JSON: {line!r}") from e
        assert isinstance(record, dict), f"log line {number} is not an object: {line!r}"
        records.append(record)
    return records


# --- scripted messages ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One kind of message in the script, sent ``count`` times with distinct ids."""

    name: str
    routing_key: str
    headers: Mapping[str, Any]
    properties: Mapping[str, str] = field(default_factory=dict)  # contract (vector) names
    count: int = 1

    def messages(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """Return (properties, headers) per copy; ``{id}`` in a value becomes the copy's id."""
        copies = []
        for index in range(self.count):
            id_ = f"{self.name}-{index}"
            properties = {k: v.replace("{id}", id_) for k, v in self.properties.items()}
            headers = {
                k: v.replace("{id}", id_) if isinstance(v, str) else v
                for k, v in self.headers.items()
            }
            copies.append((properties, headers))
        return copies


async def publish_sample(broker: Broker, sample: Sample, *, exchange: str) -> None:
    """Publish every copy of a sample, confirmed, through ``exchange`` with its routing key."""
    await asyncio.gather(
        *(
            broker.publish(
                "",
                exchange=exchange,
                routing_key=sample.routing_key,
                headers=headers,
                # pamqp calls the AMQP "type" property message_type.
                **{("message_type" if k == "type" else k): v for k, v in properties.items()},  # type: ignore[arg-type]
            )
            for properties, headers in sample.messages()
        )
    )


def seen_properties(properties: Mapping[str, str]) -> dict[str, str | int]:
    """Return the properties the sidecar reads for a message tests.support published."""
    return {"delivery_mode": 2, **properties}  # Broker.publish makes every message persistent


def expected_violations(
    samples: Iterable[Sample], *, route: str, publishers: Publishers, origin: str | None
) -> tuple[Counter[tuple[str, str, str]], int]:
    """Count the contract's violations for the script: {(route, kind, header): n}, rejects.

    Computed from ``sidecar.contract.normalise`` per message, the contract's reference
    function, independently of the relay, the metrics module and the HTTP endpoint.
    """
    policy = Policy(publishers=publishers, origin=origin, login=LOGIN)
    counts: Counter[tuple[str, str, str]] = Counter()
    rejects = 0
    for sample in samples:
        for properties, headers in sample.messages():
            verdict = normalise(
                sample.routing_key,
                seen_properties(properties),
                headers,
                policy=policy,
                now_ms=1_790_000_000_000,
                new_id=lambda: "00000000-0000-4000-8000-000000000000",
            )
            rejects += isinstance(verdict, Reject)
            counts.update((route, str(kind), header) for kind, header in verdict.violations)
    return counts, rejects


# --- a sidecar with a short violation log interval ----------------------------------------

# The one change from `python -m sidecar run`: route_log.py's log interval (60 s)
# made short, so that a flood's suppressed count shows within a test. Everything else
# (argument parsing, logging set-up, the service) is the real command line.
_LAUNCH = (
    "import sys, runpy, sidecar.observe.route_log as route_log\n"
    "assert hasattr(route_log, 'LOG_INTERVAL_S'), 'route_log.py renamed the interval'\n"
    "route_log.LOG_INTERVAL_S = float(sys.argv.pop(1))\n"
    "runpy.run_module('sidecar', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class ShortLogIntervalSidecar(Sidecar):
    """The conftest's Sidecar, started with a violation log interval of ``interval_s``."""

    interval_s: float = 2.0

    def launcher(self) -> list[str]:
        """Start the command line through a launcher that sets the interval first."""
        return [sys.executable, "-c", _LAUNCH, str(self.interval_s)]


def stdout_of(sidecar: Sidecar) -> str:
    """What the sidecar's latest run wrote to stdout (logs go to stderr: nothing, for run)."""
    return (sidecar.workdir / f"stdout.{sidecar.runs}.log").read_text(errors="replace")
