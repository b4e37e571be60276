"""Config fuzzing: a bad route map is a clear error and exit status 2, never a traceback.

``acemq-sidecar check FILE`` and ``run --config FILE`` run as subprocesses on malformed
YAML, wrong types, huge files and binary junk: each must exit 2 within seconds, with a
short message on stderr that names the file, and no Python traceback. Hypothesis then
throws thousands of generated maps at the parser in-process, where anything but a
``ConfigError`` would be a traceback at the command line.
"""

from __future__ import annotations

import random
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import ConfigError
from sidecar.routemap import RouteMap, parse_route_map
from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)

CLI_TIMEOUT_S = 10.0  # the slowest valid case (a 5 MB file) takes about 3 s
MAX_ERROR_BYTES = 4096  # a clear error is a few lines, whatever the input's size
HUGE = 5 * 1024 * 1024
VALID = b"""quarantine: {exchange: q}
routes:
  - name: a
    from: staging.a
    to: {exchange: a}
"""


def _junk(size: int) -> bytes:
    return random.Random(7).randbytes(size)


def _laughs(levels: int) -> bytes:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


CASES: dict[str, bytes | None] = {
    "binary junk": _junk(4096),
    "binary junk after a valid map": VALID + _junk(512),
    "not UTF-8": VALID.replace(b"staging.a", b"staging.\xff\xfe"),
    "NUL bytes": VALID.replace(b"staging.a", b"staging.\x00"),
    "UTF-16": VALID.decode().encode("utf-16"),
    "empty": b"",
    "only a comment": b"# nothing\n",
    "null document": b"~\n",
    "a list at the top": b"- a\n- b\n",
    "a scalar at the top": b"42\n",
    "two documents": VALID + b"---\n" + VALID,
    "unclosed bracket": b"broker: [\n",
    "bad indentation": VALID.replace(b"    from", b"  from"),
    "tab indentation": VALID.replace(b"    from", b"\tfrom"),
    "duplicate key": VALID + b"quarantine: {exchange: r}\n",
    "unknown key": VALID + b"retries: 3\n",
    "broker is a number": b"broker: 5\n" + VALID,
    "routes is a string": b"quarantine: {exchange: q}\nroutes: many\n",
    "routes are numbers": b"quarantine: {exchange: q}\nroutes: [1, 2]\n",
    "prefetch is text": b"broker: {prefetch: lots}\n" + VALID,
    "prefetch 1e400": b"broker: {prefetch: 1e400}\n" + VALID,
    "prefetch huge": b"broker: {prefetch: 99999999999999999999999999}\n" + VALID,
    "grace is NaN": b"shutdown_grace_s: .nan\n" + VALID,
    "listen without a port": b"http: {listen: '[::1'}\n" + VALID,
    "url does not parse": b"broker: {url: 'amqp://[::1'}\n" + VALID,
    "url port out of range": b"broker: {url: 'amqp://h:99999/'}\n" + VALID,
    "url of another scheme": b"broker: {url: 'http://h/'}\n" + VALID,
    "unset variable": b"broker: {url: '${ACEMQ_FUZZ_UNSET}'}\n" + VALID,
    "python tag": b"broker: !!python/object/apply:os.system [echo pwned]\n" + VALID,
    "alias in its own anchor": b"a: &a [*a]\n",
    "lone surrogate escape": b'quarantine: {exchange: "\\udcff"}\n' + VALID[26:],
    "a 5 MB comment and an unknown key": VALID + b"#" + b"x" * HUGE + b"\nretries: 3\n",
    "nested 200 deep": b"routes: " + b"[" * 200 + b"]" * 200 + b"\n",
    "nested 1000 deep": b"routes: " + b"[" * 1000 + b"]" * 1000 + b"\n",
    "a 5 MB string where a list belongs": b'quarantine: {exchange: q}\nroutes: "'
    + b"x" * HUGE
    + b'"\n',
    "alias bomb": _laughs(8),
    "missing file": None,
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_route_map_exits_2_with_a_clear_error_and_no_traceback(
    case: str, command: str, tmp_path: Path
) -> None:
    """A config error names the file in a few lines on stderr, exit 2, never a traceback."""
    path = tmp_path / "routes.yaml"
    content = CASES[case]
    if content is not None:
        path.write_bytes(content)
    args = ["check", str(path)] if command == "check" else ["run", "--config", str(path)]
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        check=False,
        cwd=REPO,
        timeout=CLI_TIMEOUT_S,
    )
    stderr = result.stderr.decode(errors="replace")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert result.returncode == 2, (result.returncode, stderr[:1000])
    assert stderr.startswith(f"{path}"), f"the error does not name the file first: {stderr[:500]}"
    assert len(result.stderr) <= MAX_ERROR_BYTES, f"{len(result.stderr)} bytes: {stderr[:300]}..."
    assert result.stdout == b""


# --- in-process: generated maps -----------------------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["keep", "acemq", "apps", "audit", "0.0.0.0:9090", "amqp://h/", "${X}"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_ROUTE_KEYS = ["name", "from", "to", "publishers", "origin", "mode", "prefetch", "exchange"]
_TOP_KEYS = ["broker", "http", "mode", "quarantine", "shutdown_grace_s", "routes", "extra"]
_ROUTES = st.lists(st.dictionaries(st.sampled_from(_ROUTE_KEYS), _VALUES, max_size=6), max_size=3)
_MAPS = st.dictionaries(st.sampled_from(_TOP_KEYS), st.one_of(_VALUES, _ROUTES), max_size=6).map(
    yaml.safe_dump
)
_TEXTS = st.one_of(_MAPS, st.text(max_size=200), st.just(VALID.decode()))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXTS)
def test_any_generated_route_map_parses_or_is_a_config_error(text: str) -> None:
    """Whatever the text, the parser returns a route map or raises ConfigError (exit 2)."""
    try:
        result = parse_route_map(text, source="fuzz.yaml", env={})
    except ConfigError as e:
        message = str(e)
        assert message.startswith("fuzz.yaml"), message
        assert len(message) <= MAX_ERROR_BYTES, message[:300]
    else:
        assert isinstance(result, RouteMap)
