"""Backoff: exponential steps with jitter, never zero, capped, and reset by progress."""

from __future__ import annotations

import random

from sidecar.flow.backoff import Backoff


def test_each_delay_is_half_fixed_half_random_within_its_step() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0, rng=random.Random(3))
    for step in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0):
        assert step / 2 <= backoff.next_delay() <= step


def test_backoff_starts_again_from_the_base_after_a_reset() -> None:
    """Progress resets the backoff: the next delay is back within the first step."""
    backoff = Backoff(base_s=1.0, cap_s=60.0, rng=random.Random(3))
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert 0.5 <= backoff.next_delay() <= 1.0


def test_the_step_count_is_bounded_so_a_long_outage_cannot_overflow() -> None:
    backoff = Backoff(base_s=0.5, cap_s=30.0, rng=random.Random(1))
    for _ in range(10_000):
        assert 15.0 <= backoff.next_delay() <= 30.0 or backoff.attempt < 8
    assert backoff.attempt == 32
