"""Every input a fuzz target crashed on, run through that target's check again.

``crashes/TARGET/NAME`` is an input that made ``fuzz.TARGET``'s check fail before its fix
(a ``./dev fuzz`` run writes it to .fuzz/crashes/TARGET/; copy it here). ``./dev fuzz``
also starts from them, so the fuzzer mutates what once broke. The HTTP target answers with
a responder of its own, so its inputs also go through the sidecar's endpoints here, and
the content headers cut short are refused as the frame errors they are. The seeds of every
target pass its check too: the oracles and the code agree on the inputs we know.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from fuzz import TARGETS, http_request
from fuzz.seeds import write_seeds
from sidecar.errors import WireError
from sidecar.wire import parse_content_header

HERE = Path(__file__).resolve().parent
CRASHES = sorted((HERE / "crashes").glob("*/*"))
CUT_SHORT = sorted(
    path
    for path in (HERE / "crashes" / "content").glob("*")
    if "-past-" in path.name or path.name.endswith("-cut-short")
)


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_the_crash_corpus_is_there_and_named_by_target() -> None:
    assert len(CRASHES) >= 2
    assert {path.parent.name for path in CRASHES} <= set(TARGETS)


@pytest.mark.parametrize("path", CRASHES, ids=_name)
def test_a_crash_found_by_fuzzing_stays_fixed(path: Path) -> None:
    importlib.import_module(f"fuzz.{path.parent.name}").check(path.read_bytes())


@pytest.mark.parametrize("path", sorted((HERE / "crashes" / "http_request").glob("*")), ids=_name)
def test_the_sidecars_endpoints_answer_what_broke_the_http_side(path: Path) -> None:
    """The target answers with a responder of its own; the endpoints get the inputs too."""
    data = path.read_bytes()
    http_request.verify(data, http_request.response(data, http_request.ENDPOINTS.respond))


def test_every_seed_passes_its_targets_check(tmp_path: Path) -> None:
    counts = write_seeds(tmp_path)
    assert set(counts) == set(TARGETS)
    assert counts["normalise"] >= 90, counts  # one per contract vector the wire can carry
    for target in TARGETS:
        check = importlib.import_module(f"fuzz.{target}").check
        for path in sorted((tmp_path / target).iterdir()):
            check(path.read_bytes())


@pytest.mark.parametrize("path", CUT_SHORT, ids=_name)
def test_a_content_header_cut_short_is_refused(path: Path) -> None:
    """In fuzz.content's layout: a step byte, the payload's length (2 bytes), the payload."""
    data = path.read_bytes()
    payload = data[3 : 3 + int.from_bytes(data[1:3], "big")]
    try:
        header = parse_content_header(payload)
    except WireError:
        return
    raise AssertionError(f"{len(payload)} bytes read as {header!r}")
