"""Run the sidecar as ``python -m sidecar``."""

import sys

from sidecar import startup_signals

if sys.argv[1:2] == ["run"]:
    startup_signals.hold()  # before the slow imports: a SIGTERM meanwhile is a clean stop

from sidecar.cli import main  # after the signals are held

sys.exit(main())
