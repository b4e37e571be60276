"""Run the sidecar as ``python -m sidecar``: the same entry point as the console script."""

import sys

from sidecar.console import main  # holds the stop signals of `run` as it is imported

sys.exit(main())
