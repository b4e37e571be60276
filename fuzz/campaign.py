"""``./dev fuzz [TARGET|all] [SECONDS]``: fresh seeds, then each target fuzzed for a while.

Every target runs in a process of its own (``python -m fuzz TARGET``) for SECONDS (30 by
default; CI gives each 10), from three corpora: the one kept in ``.fuzz/corpus/TARGET``
by earlier runs (new inputs go there), the seeds made afresh (``fuzz.seeds``) and the
crash inputs committed under tests/unit/fuzz/crashes/TARGET. A line per target tells the
executions, their rate and the coverage reached (atheris's ``cov``: edges, ``ft``:
features). A crash (an exception ``check`` lets out, a time-out, memory past the limit) is
written to ``.fuzz/crashes/TARGET/`` and the campaign exits 1: copy the file into
tests/unit/fuzz/crashes/TARGET/ (a regression test from then on) and fix the code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from fuzz import TARGETS
from fuzz.seeds import REPO, write_seeds

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["main"]

WORK = REPO / ".fuzz"
CRASH_CORPUS = REPO / "tests" / "unit" / "fuzz" / "crashes"
DEFAULT_SECONDS = 30
_SLACK_S = 180  # for instrumenting the imports and reading the corpora, on a loaded machine
_FLAGS = ["-timeout=10", "-rss_limit_mb=1024", "-print_final_stats=1"]
_MAX_LEN = {"http_request": 20_000, "routemap": 8_192}  # past h11's 16 KiB head; a real map
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+ .*exec/s: (\d+)")
_LAST = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+ .*exec/s: (\d+)")


def _usage() -> int:
    sys.stderr.write(f"usage: ./dev fuzz [{'|'.join(('all', *TARGETS))}] [SECONDS]\n")
    return 2


def _run(target: str, seconds: int, seeds: Path) -> tuple[bool, str]:
    """Fuzz one target; return whether it found nothing, and its line for the summary."""
    corpus, crashes = WORK / "corpus" / target, WORK / "crashes" / target
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    log = WORK / "logs" / f"{target}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    flags = [*_FLAGS, f"-max_total_time={seconds}", f"-artifact_prefix={crashes}/"]
    if target in _MAX_LEN:
        flags.append(f"-max_len={_MAX_LEN[target]}")
    dirs = [corpus, seeds / target]
    if (CRASH_CORPUS / target).is_dir():
        dirs.append(CRASH_CORPUS / target)
    command = [sys.executable, "-m", "fuzz", target, *flags, *map(str, dirs)]
    started = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(  # noqa: S603 - our own interpreter and module
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                timeout=seconds + _SLACK_S,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
    text = log.read_text(errors="replace")
    stats = _DONE.findall(text) or _LAST.findall(text)
    took = time.monotonic() - started
    if code != 0:
        found = re.findall(r"Test unit written to (\S+)", text)
        where = ", ".join(found) or f"no input written (exit {code}); see {log}"
        return False, f"{target}: FAILED after {took:.0f} s: {where}\n{_tail(text)}"
    if not stats:
        return False, f"{target}: no statistics in {log}"
    runs, cov, ft, corp, rate = stats[-1]
    return True, (
        f"{target}: {int(runs):,} executions in {seconds} s ({int(rate):,}/s),"
        f" cov {cov}, ft {ft}, corpus {corp}"
    )


def _tail(text: str) -> str:
    """Return the exception's lines of a failed run's log, for the summary."""
    lines = [line for line in text.splitlines() if not line.startswith(("#", "INFO:"))]
    return "\n".join(lines[-25:])


def main(argv: list[str]) -> int:
    """Run the campaign ``argv`` asks for; return the exit status (1: a target failed)."""
    targets, seconds = list(TARGETS), DEFAULT_SECONDS
    if argv and argv[0] in (*TARGETS, "all"):
        targets = list(TARGETS) if argv[0] == "all" else [argv[0]]
        argv = argv[1:]
    if argv and argv[0].isdigit() and int(argv[0]) > 0:
        seconds, argv = int(argv[0]), argv[1:]
    if argv:
        return _usage()
    seeds = WORK / "seeds"
    shutil.rmtree(seeds, ignore_errors=True)
    write_seeds(seeds)
    failed = False
    for target in targets:
        ok, line = _run(target, seconds, seeds)
        failed = failed or not ok
        sys.stdout.write(f"fuzz {line}\n")
        sys.stdout.flush()
    if failed:
        sys.stdout.write(
            "fuzz: a target failed. Copy its input into tests/unit/fuzz/crashes/TARGET/"
            " (a regression test from then on), fix the code, run ./dev fuzz TARGET again.\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
