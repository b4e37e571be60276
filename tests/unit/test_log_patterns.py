"""Positive controls: each broker log pattern the wire suites count matches its lines.

A pattern that can never match turns "the broker's timer never fired" into a check that
cannot fail. The lines are each version's format string (rabbit_channel), filled in.
"""

from __future__ import annotations

import pytest

from tests.brokers import CONSUMER_TIMED_OUT

TIMED_OUT_LINES = {
    "3.10.8": (
        "2026-12-07 10:00:00.000 [error] <0.1.0> Consumer acemq-sidecar.orders on channel 1"
        " has timed out waiting for delivery acknowledgement. Timeout used: 5000 ms. This"
        " timeout value can be configured, see consumers doc guide to learn more"
    ),
    "4.0.5": (
        "2026-12-07 10:00:00.000 [warning] <0.1.0> Consumer 'acemq-sidecar.orders' on"
        " channel 1 and queue 'staging' in vhost '/' has timed out waiting for a consumer"
        " acknowledgement of a delivery with delivery tag = 7. Timeout used: 5000 ms."
    ),
    "4.3.6": (
        "2026-12-07 10:00:00.000 [warning] <0.1.0> Consumer 'acemq-sidecar.orders' on"
        " channel 1 and queue 'staging' in vhost '/' has timed out waiting for a consumer"
        " acknowledgement of a delivery with delivery tag = 7. Timeout used: 5000 ms."
    ),
}


@pytest.mark.parametrize("version", sorted(TIMED_OUT_LINES))
def test_the_consumer_timeout_pattern_matches_each_versions_line(version: str) -> None:
    assert CONSUMER_TIMED_OUT.search(TIMED_OUT_LINES[version]) is not None


def test_the_consumer_timeout_pattern_ignores_the_channel_errors_words() -> None:
    """The 406 the channel closes with is the sidecar's to read, not the timer's log line."""
    close = (
        "operation none caused a channel exception precondition_failed: delivery"
        " acknowledgement on channel 1 timed out. Timeout value used: 5000 ms."
    )
    assert CONSUMER_TIMED_OUT.search(close) is None
