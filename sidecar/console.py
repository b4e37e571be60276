"""The ``acemq-sidecar`` console script's entry point: hold the stop signals, then import.

``acemq-sidecar run`` (the image's entrypoint) and ``python -m sidecar run`` both come here
first. For ``run`` this module holds SIGTERM, SIGINT and SIGHUP (:mod:`sidecar.startup_signals`)
as it is imported, before :mod:`sidecar.cli` and what it pulls in (about 0.1 s, more under
load), so that a stop sent meanwhile is a clean exit 0. It must import nothing else of the
package at module level; the other commands keep Python's defaults (Ctrl-C stops them).
"""

import sys

from sidecar import startup_signals

if sys.argv[1:2] == ["run"]:
    startup_signals.hold()


def main() -> int:
    """Run the command line (:func:`sidecar.cli.main`) on ``sys.argv``; return the exit code."""
    from sidecar.cli import main as cli_main  # noqa: PLC0415 - after the signals are held

    return cli_main()
