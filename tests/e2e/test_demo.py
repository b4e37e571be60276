"""The README's demo command keeps working: it is the first thing a newcomer runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_demo_accounts_for_every_sample(amqp_url: str) -> None:
    """./dev demo relays, repairs and quarantines its samples, then stops with status 0."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
        env={"AMQP_URL": amqp_url, "PATH": "/usr/bin:/bin"},
    )
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    assert "7/7 messages accounted for" in out
    assert "exit status 0" in out
    assert 'unroutable: exchange "demo.orders"' in out
    assert '"x-acemq-tenant" is in the reserved "x-acemq-" namespace' in out
    assert "acemq-replayed-at=2026-02-03T04:05:06.789Z" in out
