"""The route map parser fed arbitrary text: a map, or an error at FILE:LINE, never a traceback.

``acemq-sidecar check`` and ``run`` print a ``ConfigError`` and exit 2; anything else
would be a traceback. ``check`` parses the input (as UTF-8, invalid bytes replaced) as a
route map file, with secret files and a TLS check of its own, and requires a
``RouteMap`` or a ``ConfigError`` naming the file and a line of it, a few lines long.
"""

from __future__ import annotations

from sidecar.errors import ConfigError, TlsFileError
from sidecar.routemap import TlsConfig, parse_route_map

__all__ = ["check"]

SOURCE = "routes.yaml"
ERROR_MAX = 4096  # tests/faults/test_config_fuzz.py's bound on what stderr shows
_ENV = {"AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/", "ACEMQ_FUZZ": "fuzz"}
_FILES = {
    "/run/secrets/url": "amqp://app:secret@rabbit:5672/\n",
    "/run/secrets/urls": "# the cluster\namqp://a:s@r1/\n\namqp://a:s@r2/\n",
    "/run/secrets/username": "app\n",
    "/run/secrets/password": "p@ss:word\r\n",
    "/run/secrets/empty": "",
}


def _read_file(path: str) -> str:
    if path in _FILES:
        return _FILES[path]
    if path.endswith("/"):
        raise IsADirectoryError(21, "Is a directory", path)
    raise FileNotFoundError(2, "No such file or directory", path)


def _check_tls(tls: TlsConfig) -> None:
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(tls, key)
        if path is not None and path.endswith(".bad"):
            raise TlsFileError("not a PEM file", key=key, path=path)


def check(data: bytes) -> None:
    """Raise unless the text parses or fails as a short ConfigError at FILE:LINE."""
    text = data.decode("utf-8", "replace")
    try:
        parse_route_map(text, source=SOURCE, env=_ENV, read_file=_read_file, check_tls=_check_tls)
    except ConfigError as e:
        message = str(e)
        lines = len(text.splitlines())  # YAML breaks lines at \r and \x85 too, as this does
        if e.line is None or not 1 <= e.line <= lines + 1:
            raise AssertionError(f"no line of the {lines} in the file: {message!r}") from e
        if not message.startswith(f"{SOURCE}:{e.line}: ") or len(message) > ERROR_MAX:
            raise AssertionError(f"not a short FILE:LINE error: {message[:ERROR_MAX]!r}") from e
        return
