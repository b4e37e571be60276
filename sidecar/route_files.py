"""Loading the route map for ``check``, ``run`` and a reload: the file and the files it names.

The shell step around the pure parser (``sidecar.routemap.parse``): it passes the parser the one
check that reads more files, the TLS files, so that all three refuse a missing or wrong
certificate the same way, as a ``ConfigError`` at its key's line, before any message is
touched. ``RouteMapFile`` is the file as a reload sees it: read again, or noticed changed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.errors import ConfigError
from sidecar.relay import sleep_unless
from sidecar.routemap import parse_route_map
from sidecar.tls import client_context

if TYPE_CHECKING:
    import asyncio
    import os
    from collections.abc import Callable, Mapping

    from sidecar.routemap import RouteMap, TlsConfig

__all__ = ["RouteMapFile", "load_config", "load_route_map"]

log = logging.getLogger("sidecar.service")  # the process's lines, whichever module writes them


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str]) -> RouteMap:
    """Read, parse and check the route map at ``path``; raise ``ConfigError`` on a problem."""
    return load_route_map(path, env=env, check_tls=_check_tls)


def load_route_map(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str],
    check_tls: Callable[[TlsConfig], None] | None = None,
) -> RouteMap:
    """Read and parse the route map at ``path``; an unreadable file is a ``ConfigError``.

    ``check_tls`` is as for ``parse_route_map``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read the route map: {e}", source=str(path), line=None, key=None
        ) from e
    return parse_route_map(
        text,
        source=str(path),
        env=env,
        read_file=lambda p: Path(p).read_text(encoding="utf-8"),
        check_tls=check_tls,
    )


def _check_tls(tls: TlsConfig) -> None:
    client_context(tls)  # built to be thrown away: what fails here would fail at connect


class RouteMapFile:
    """The route map's file, or None for a map that came from elsewhere (nothing to reload)."""

    def __init__(self, path: Path | None, *, env: Mapping[str, str]) -> None:
        self._path = path
        self._env = env
        self._stamp = self._stat()  # what the last look or read saw: mtime and size

    def changed(self) -> bool:
        """Return True once for each change to the file since the last look or read."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    async def watch(self, changed: asyncio.Event, *, stop: asyncio.Event, poll_s: float) -> None:
        """Look every ``poll_s`` until ``stop``; set ``changed`` when the file changed."""
        while not stop.is_set():
            await sleep_unless(stop, poll_s)
            if self.changed():
                log.info("route map file changed; reloading")
                changed.set()

    def load(self) -> RouteMap | None:
        """Read the file again (None without one); raise ``ConfigError`` on a problem."""
        if self._path is None:
            return None
        # Stamp before reading: the poller then skips this version (one edit plus SIGHUP
        # is one reload) but still sees a write that lands while we read.
        self._stamp = self._stat()
        return load_config(self._path, env=self._env)

    def _stat(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            stat = self._path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)
