"""Loading the route map for ``check``, ``run`` and a reload: the file and the files it names.

The shell step around the pure parser (``route_parse``): it passes the parser the one
check that reads more files, the TLS files, so that all three refuse a missing or wrong
certificate the same way, as a ``ConfigError`` at its key's line, before any message is
touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.route_parse import load_route_map
from sidecar.tls import client_context

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from sidecar.route_map import RouteMap, TlsConfig

__all__ = ["load_config"]


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str]) -> RouteMap:
    """Read, parse and check the route map at ``path``; raise ``ConfigError`` on a problem."""
    return load_route_map(path, env=env, check_tls=_check_tls)


def _check_tls(tls: TlsConfig) -> None:
    client_context(tls)  # built to be thrown away: what fails here would fail at connect
