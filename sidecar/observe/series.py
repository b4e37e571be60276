"""The series every message moves, kept as plain numbers and read at scrape.

``sidecar.observe.metrics`` keeps here, rather than in prometheus_client's ``Counter`` and
``Histogram``, the series a delivery moves on the hot path: each route's settled messages
by outcome and its relay seconds (``SettledSeries``), and the drift counters of repaired
messages (``PlainCounters``). A message then costs a few additions (and a bisect) in the
event loop, their only writer, not locked updates and a walk over the buckets. A scrape,
from the HTTP thread, reads copies made under the GIL (a histogram's sum may be a message
ahead of its buckets, as with prometheus_client's own per-value locks) and exposes the
samples a ``Counter`` or ``Histogram`` of the same names and labels would, ``_created``
included. The names and help texts are ``sidecar.observe.metrics``'s.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sidecar.settle import Outcome

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["Cell", "PlainCounters", "SettledSeries", "Tally"]


# prometheus_client has setters for its ``_created`` setting (``disable_created_metrics``,
# the PROMETHEUS_DISABLE_CREATED_SERIES variable at import) and no getter: an unregistered
# counter's samples show it, read at each collect as its own counters do.
_CREATED_WITNESS = Counter("acemq_sidecar_created_witness", "", registry=None)


def _use_created() -> bool:
    """Whether prometheus_client exposes ``_created`` samples (its own setting)."""
    (family,) = _CREATED_WITNESS.collect()
    return any(sample.name.endswith("_created") for sample in family.samples)


class Cell:
    """One counter series: add to ``value`` (from the event loop only)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()


class PlainCounters:
    """A counter family whose series are ``Cell``s, one per label values."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
    ) -> None:
        self._name = name.removesuffix("_total")
        self._documentation = documentation
        self._labelnames = labelnames
        self._cells: dict[tuple[str, ...], Cell] = {}
        registry.register(self)

    def labels(self, *values: str) -> Cell:
        """Return the series of these label values, made at zero if it has none."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
        key = tuple(map(str, values))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        return cell

    def remove(self, *values: str) -> None:
        """Drop the series of these label values; unknown: no-op."""
        self._cells.pop(tuple(map(str, values)), None)

    def describe(self) -> Iterator[Metric]:
        """Return the family without samples: the registry checks the name is free."""
        return iter((self._family(),))

    def collect(self) -> Iterator[Metric]:
        """Return the family with every series."""
        family, created = self._family(), _use_created()
        for key, cell in list(self._cells.items()):
            family.add_metric(key, cell.value, created=cell.created if created else None)
        return iter((family,))

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)


class Tally:
    """One route's settled messages: a count per outcome, the seconds' buckets and sum."""

    __slots__ = ("bounds", "buckets", "created", "outcomes", "sum_s")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.outcomes = dict.fromkeys(Outcome, 0)
        # By bucket, not cumulative; the last one counts what is above every bound.
        self.buckets = [0] * (len(bounds) + 1)
        self.sum_s = 0.0
        self.created = time.time()

    def observe(self, outcome: Outcome, seconds: float) -> None:
        """Count one settled message and the seconds it took."""
        self.outcomes[outcome] += 1
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds


class SettledSeries:
    """A registry's collector of every route's ``Tally``, as a counter and a histogram."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        messages: tuple[str, str],
        seconds: tuple[str, str],
        buckets: tuple[float, ...],
    ) -> None:
        self._messages = messages  # the counter's name (without _total) and help
        self._seconds = seconds  # the histogram's name and help
        self._bounds = buckets
        self._le = [*map(floatToGoString, buckets), "+Inf"]
        self._routes: dict[str, Tally] = {}
        registry.register(self)

    def add_route(self, route: str) -> Tally:
        """Return the route's tally, made at zero if it has none."""
        tally = self._routes.get(route)
        if tally is None:
            tally = self._routes[route] = Tally(self._bounds)
        return tally

    def remove_route(self, route: str) -> None:
        """Drop the route's series; unknown: no-op."""
        self._routes.pop(route, None)

    def describe(self) -> Iterator[Metric]:
        """Return the two families without samples: the registry checks the names are free."""
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        """Return the two families with every route's series."""
        messages, seconds = self._families()
        created = _use_created()
        created_name = f"{self._seconds[0]}_created"
        for route, tally in list(self._routes.items()):
            for outcome, count in list(tally.outcomes.items()):
                messages.add_metric(
                    [route, outcome.value], count, created=tally.created if created else None
                )
            buckets = list(accumulate(list(tally.buckets)))
            seconds.add_metric([route], list(zip(self._le, buckets, strict=True)), tally.sum_s)
            if created:
                seconds.samples.append(Sample(created_name, {"route": route}, tally.created))
        return iter((messages, seconds))

    def _families(self) -> tuple[CounterMetricFamily, HistogramMetricFamily]:
        name, documentation = self._messages
        messages = CounterMetricFamily(name, documentation, labels=["route", "outcome"])
        name, documentation = self._seconds
        return messages, HistogramMetricFamily(name, documentation, labels=["route"])
