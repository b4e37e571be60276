"""The one exception hierarchy of acemq-sidecar; data lives in attributes, not only in text."""

from __future__ import annotations


class SidecarError(Exception):
    """Base of every error the sidecar raises on purpose."""


class WireError(SidecarError, ValueError):
    """A field table could not be decoded or encoded; the message says which value and why."""


class ConfigError(SidecarError):
    """The route map is invalid: names the file, line and key, and says what is allowed."""

    def __init__(self, message: str, *, source: str, line: int | None, key: str | None) -> None:
        self.source = source
        self.line = line
        self.key = key
        self.detail = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class TlsFileError(SidecarError):
    """A TLS file the route map names cannot be used; ``key`` is which one (``ca_file``...).

    The route map's parser reports it as a ``ConfigError`` at that key's line.
    """

    def __init__(self, message: str, *, key: str, path: str) -> None:
        self.key = key
        self.path = path
        self.detail = message
        super().__init__(f"broker.tls.{key}: {message}")
