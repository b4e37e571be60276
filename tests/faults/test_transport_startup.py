"""A SIGTERM while the sidecar starts is a clean stop, exit 0.

The imports and the route map's parsing take a few hundred milliseconds before the
service's handlers are in place, and Python's default for SIGTERM would end the process
then with -15 (the fault suite restarts the sidecar and stops it again at once). Each run
here sends SIGTERM at a different moment (5 ms steps) of the first 100 ms after the
interpreter has imported the first module of the ``sidecar`` package, seen through ``-X
importtime``: before that moment none of our code has run, and no Python program can hold a
signal while the interpreter itself starts.

The broker URL points at a port nobody listens on: the stop must come while the sidecar is
still loading or connecting, and no broker is touched.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.conftest import free_port

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.faults.conftest import FaultRecord

pytestmark = pytest.mark.timeout(300)

RUNS = 20
STEP_S = 0.005  # run i is stopped (i + 1) * 5 ms after the gate: 5 to 100 ms
EXIT_TIMEOUT_S = 30.0
GATE_TIMEOUT_S = 30.0


# -X importtime prints a line as each import ends. The first of a sidecar module (not the
# package) is where our own code begins to run: the start-up signal module, which holds the
# signals on its next line, or, without that module, the first the CLI imports.
_FIRST_MODULE = re.compile(r"import time:.*\|\s+sidecar\.\w+$")


class Started:
    """Reads the child's stderr to its end; notes when its first sidecar module is imported."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.imported = threading.Event()
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            if _FIRST_MODULE.match(line):
                self.imported.set()
        self.imported.set()  # the end of stderr: never wait past it

    def join(self) -> None:
        """Wait for the end of stderr (the child has exited by then)."""
        self._thread.join(timeout=GATE_TIMEOUT_S)

    def output(self) -> str:
        """What the child wrote to stderr, its import times left out."""
        return "\n".join(line for line in self.lines if not line.startswith("import time:"))


def write_route_map(tmp_path: Path) -> Path:
    config = tmp_path / "routes.yaml"
    route_map = {
        "broker": {"url": f"amqp://guest:guest@127.0.0.1:{free_port()}/", "connect_timeout_s": 5},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "quarantine": {"exchange": "acemq.quarantine"},
        "routes": [{"name": "orders", "from": "orders.staging", "to": {"exchange": "orders"}}],
    }
    config.write_text(yaml.safe_dump(route_map), encoding="utf-8")
    return config


def test_sigterm_in_the_first_100_ms_exits_0_every_time(
    tmp_path: Path, record: Callable[..., FaultRecord]
) -> None:
    """20 runs, SIGTERM 5, 10, ... 100 ms after our first module is imported: every exit is 0."""
    statuses: list[int] = []
    sent_ms: list[float] = []
    exit_s: list[float] = []
    for run in range(RUNS):
        config = write_route_map(tmp_path)
        spawned = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "sidecar", "run", "--config", str(config)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started = Started(process)
        try:
            assert started.imported.wait(GATE_TIMEOUT_S), "no sidecar module was ever imported"
            time.sleep((run + 1) * STEP_S)
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            status = process.wait(timeout=EXIT_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            started.join()
            assert process.stderr is not None
            process.stderr.close()
        sent_ms.append((sent - spawned) * 1000)
        exit_s.append(time.monotonic() - sent)
        statuses.append(status)
        assert status == 0, (
            f"run {run}: exit status {status} after a SIGTERM {sent_ms[-1]:.0f} ms after the"
            f" start ({(run + 1) * STEP_S * 1000:.0f} ms after our first module)"
            f"\n{started.output()}"
        )
    record(
        messages=0,
        faults=RUNS,
        duplicates=0,
        duplicate_bound=0,
        recovery_s=(min(exit_s), max(exit_s)),
        note=(
            f"{RUNS} SIGTERMs {min(sent_ms):.0f}-{max(sent_ms):.0f} ms after the spawn; exit"
            f" statuses {sorted(set(statuses))}; recovery is the fastest and slowest exit"
        ),
    )
