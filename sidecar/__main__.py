"""Run the sidecar as ``python -m sidecar``."""

import sys

from sidecar.cli import main

sys.exit(main())
