"""Each route's settled messages, by outcome, and its relay seconds: plain numbers, scraped.

Every settled message moves both series, so ``sidecar.metrics`` keeps them here rather
than in prometheus_client's ``Counter`` and ``Histogram``: a message costs a bisect and
three additions in the event loop (their only writer), not two locked updates and a walk
over the buckets. A scrape, from the HTTP thread, reads copies made under the GIL (the sum
may be a message ahead of the buckets, as with prometheus_client's own per-value locks)
and exposes the samples a ``Counter`` (``route``, ``outcome``) and a ``Histogram``
(``route``) of the same names would, ``_created`` included. The names and help texts are
``sidecar.metrics``'s.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

import prometheus_client.metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sidecar.settlement import Outcome

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["SettledSeries", "Tally"]


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
        created = prometheus_client.metrics._use_created  # noqa: SLF001 - as its Counter reads it
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
