"""``python -m fuzz TARGET [libFuzzer flags] [corpus dirs]``: fuzz one target until stopped."""

from __future__ import annotations

import sys

from fuzz import TARGETS
from fuzz.engine import fuzz

if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
    sys.stderr.write(f"usage: python -m fuzz {{{','.join(TARGETS)}}} [libFuzzer flags] [dirs]\n")
    sys.exit(2)
fuzz(sys.argv[1], [sys.argv[0], *sys.argv[2:]])
