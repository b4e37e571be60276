"""Count the skipped tests of a run's output by reason: ``python scripts/skip_summary.py LOG``.

pytest's short summary (``-ra``) writes ``SKIPPED [N] path:line: reason`` for each group of
skips; the same reason from several places or runs (each broker version's) is summed.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$")


def main(argv: list[str]) -> int:
    """Print the counts, most first; return 2 without a readable log."""
    if len(argv) != 1:
        sys.stderr.write("usage: python scripts/skip_summary.py LOG\n")
        return 2
    try:
        text = Path(argv[0]).read_text(errors="replace")
    except OSError as e:
        sys.stderr.write(f"skip_summary: cannot read {argv[0]}: {e}\n")
        return 2
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if (match := _SKIPPED.match(line.strip())) is not None:
            counts[match.group(2)] += int(match.group(1))
    sys.stdout.write(f"--- skipped: {sum(counts.values())} test(s) ---\n")
    for reason, count in counts.most_common():
        sys.stdout.write(f"{count:6d}  {reason}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
