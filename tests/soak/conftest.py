"""The 20,000-message soak of the transport conditions: opt-in, on private nodes.

Every test here is skipped unless ``ACEMQ_SOAK=1`` (the suite takes minutes; CI's budget is
30). A private node of each broker version the run selects (``--broker-versions``,
tests/brokers.py) serves the package, with ``frame_max`` 1 MiB (for the large header
tables) and the consumer timer checked every second (``channel_tick_interval``; the
held-deliveries test lowers ``consumer_timeout`` for its own run); each test puts back
what it changed on the node, whatever happened, and the node is stopped after the
package's last test. ``ACEMQ_SOAK_STAGING=quorum`` makes every staging queue a quorum
queue at the broker's defaults (on 4.x, a delivery limit of 20) where a test names no
type. The flow and its books are in tests/soak/soak_flow.py.

Every test's numbers are printed, summarised at the end of the run, and written as JSON
lines to ``ACEMQ_SOAK_REPORT`` when that is set, for docs/reliability.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from tests.brokers import module_node
from tests.conftest import nb, sidecar_on_node
from tests.faults.conftest import FaultRecord, recorder, summarise

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.faults.private_node import PrivateNode

# Per route: two routes of 10,000 make the soak's flow of 20,000.
PER_LANE = int(os.environ.get("ACEMQ_SOAK_PER_LANE", "10000"))
STAGING_TYPE = os.environ.get("ACEMQ_SOAK_STAGING", "classic")
"""The staging queues' type where a test names none: ``classic`` or ``quorum``."""
if STAGING_TYPE not in {"classic", "quorum"}:
    raise pytest.UsageError(f"ACEMQ_SOAK_STAGING={STAGING_TYPE!r}: classic or quorum")
FRAME_MAX = 1_048_576
NODE_CONF = f"frame_max = {FRAME_MAX}\n"
NODE_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."


@pytest.fixture(scope="package", autouse=True)
def _opt_in() -> None:
    """Skip the package unless ACEMQ_SOAK=1."""
    if os.environ.get("ACEMQ_SOAK") != "1":
        pytest.skip("the 20,000-message soak runs only with ACEMQ_SOAK=1 (docs/reliability.md)")


@pytest.fixture(scope="package")
def node(_opt_in: None, broker_version: str) -> Iterator[PrivateNode]:
    """The package's private node of the version (frame_max 1 MiB), stopped after its last test."""
    with module_node(broker_version, "soak", conf=NODE_CONF, advanced=NODE_ADVANCED) as started:
        yield started


# The fault suite's client and sidecar on a private node, here on the package's ``node``.
client = nb
sidecar = sidecar_on_node


RECORDS = pytest.StashKey[list[FaultRecord]]()


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., FaultRecord]:
    """Record (print, keep for the summary, append to ACEMQ_SOAK_REPORT) a test's numbers."""
    return recorder(request, RECORDS, report="ACEMQ_SOAK_REPORT")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print every soak test's numbers at the end of the run."""
    summarise(terminalreporter, config, RECORDS, title="soak test numbers")
