"""What a broker's release changes for its clients: sidecar.broker.release."""

from __future__ import annotations

import pytest

from sidecar.broker import nack_is_free


@pytest.mark.parametrize(
    ("version", "free"),
    [
        ("4.3.6", True),
        (b"4.3.0", True),
        ("4.10.1", True),
        ("5.0.0", True),
        ("4.2.4", False),
        ("4.0.5", False),
        ("3.10.8", False),
        ("3.13.7+1.g1a2b3c4", False),
        (None, False),  # a broker that says nothing
        ("unknown", False),
    ],
)
def test_a_nack_is_free_from_rabbitmq_4_3(version: object, *, free: bool) -> None:
    assert nack_is_free(version) is free
