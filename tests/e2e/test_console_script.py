"""``acemq-sidecar run``, the installed console script the image runs, stopped as it starts.

A SIGTERM while it imports and loads its route map must be a clean stop, exit 0, as it is
for ``python -m sidecar run`` (tests/faults/test_transport_startup.py). The moments: a few
milliseconds after the interpreter has imported the first module of the package (seen
through ``PYTHONPROFILEIMPORTTIME``: before it none of our code has run, and nothing in a
Python program can hold a signal), and 0.3 s after the spawn, as the fault flow sends it.
The broker is the real one, with a backlog on the route: a stop that comes once the route
consumes must still lose nothing and copy nothing.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    duplicates,
    make_ids,
    publish_ids,
    take_ids,
)
from tests.support import Broker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.timeout(90)

CONSOLE_SCRIPT = Path(sys.executable).with_name("acemq-sidecar")
BACKLOG = 500
GATE_TIMEOUT_S = 30.0
GATE_POLL_S = 0.0005
EXIT_TIMEOUT_S = 20.0
# The line PYTHONPROFILEIMPORTTIME writes as the import of a module of the package ends.
_FIRST_MODULE = re.compile(r"^import time:.*\|\s+sidecar\.\w+$", re.MULTILINE)


@dataclass
class ConsoleScript(Sidecar):
    """The sidecar started by its console script, as the image's entrypoint starts it."""

    def launcher(self) -> list[str]:
        """The installed ``acemq-sidecar`` script of this interpreter's environment."""
        return [str(CONSOLE_SCRIPT)]


@pytest.fixture
async def console_script(
    amqp_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ConsoleScript]:
    """The console script on a route map in tmp_path, its imports timed, killed at teardown."""
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT} missing: pip install -e '.[test]'"
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    process = ConsoleScript(amqp_url=amqp_url, workdir=tmp_path)
    try:
        yield process
    finally:
        await process.kill()


async def first_module_imported(sidecar: Sidecar) -> None:
    """Wait until the process has imported its first module of the package."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not _FIRST_MODULE.search(sidecar.stderr()):
        assert sidecar.is_running(), f"exited before any module was imported\n{sidecar.output()}"
        assert time.monotonic() < deadline, f"no sidecar module imported\n{sidecar.output()}"
        await asyncio.sleep(GATE_POLL_S)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("after_first_module_s", "after_spawn_s"),
    [(0.002, 0.0), (0.010, 0.0), (0.0, 0.3)],
    ids=["2ms-after-first-module", "10ms-after-first-module", "300ms-after-spawn"],
)
async def test_sigterm_while_the_console_script_starts_exits_0(
    broker: Broker,
    console_script: ConsoleScript,
    after_first_module_s: float,
    after_spawn_s: float,
) -> None:
    """SIGTERM while ``acemq-sidecar run`` starts: exit 0, nothing lost, nothing copied."""
    sidecar = console_script
    quarantine, quarantined = await declare_quarantine(broker)
    flow = await declare_flow(broker, "console")
    ids = make_ids("console", BACKLOG)
    await publish_ids(broker, flow.staging, ids)
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flow]))
    spawned = time.monotonic()
    await sidecar.start(wait_ready=False)
    await first_module_imported(sidecar)
    await asyncio.sleep(max(after_first_module_s, after_spawn_s - (time.monotonic() - spawned)))
    sent_s = time.monotonic() - spawned
    sidecar.send(signal.SIGTERM)
    status = await sidecar.wait_exit(timeout_s=EXIT_TIMEOUT_S)

    relayed = await take_ids(broker, flow.target)
    left = await take_ids(broker, flow.staging)
    print(  # noqa: T201 - the measurement the test reports
        f"SIGTERM {sent_s * 1000:.0f} ms after the spawn: exit {status},"
        f" {len(relayed)} relayed, {len(left)} left in staging"
    )
    assert status == 0, f"exit status {status} after SIGTERM\n{sidecar.output()}"
    assert sorted(set(relayed) | set(left)) == ids, "messages lost"
    assert duplicates(relayed + left) == 0, "a message copied"
    assert await take_ids(broker, quarantined) == []
