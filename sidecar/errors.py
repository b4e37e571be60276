"""The one exception hierarchy of acemq-sidecar; data lives in attributes, not only in text."""

from __future__ import annotations


class SidecarError(Exception):
    """Base of every error the sidecar raises on purpose."""


class WireError(SidecarError, ValueError):
    """A field table could not be decoded or encoded; the message says which value and why."""


class VectorError(SidecarError, ValueError):
    """A conformance vector or message in the JSON notation is malformed; says where."""


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


# --- the transport: the broker's address, the connection and its channels -------------------


class BrokerAddressError(SidecarError, ValueError):
    """A broker URL that cannot be used; the message never holds the password.

    ``parameter`` names the query parameter at fault, when one is.
    """

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        self.parameter = parameter
        super().__init__(message)


class BrokerConnectionError(SidecarError, ConnectionError):
    """The connection to the broker ended or failed; the message says why, never the URL.

    A ``ConnectionError`` too, so that code written against the builtin keeps working.
    """


class ConnectFailedError(BrokerConnectionError):
    """No connection could be opened: refused, unreachable, TLS, login or timeout."""


class SidecarChannelError(SidecarError):
    """Base of the channel-level failures the relay reacts to."""


class ChannelLostError(SidecarChannelError):
    """The channel or its connection closed; unacked deliveries go back to the queue."""


class ChannelClosedError(ChannelLostError):
    """The broker closed the channel, with its reply code and text."""

    def __init__(self, code: int, text: str) -> None:
        self.code = code
        self.text = text
        super().__init__(f"channel closed by the broker: {code} {text}")


class MissingEntityError(SidecarChannelError):
    """A queue or exchange the route needs does not exist."""

    def __init__(self, *, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(
            f'{kind} "{name}" does not exist; create it (the sidecar does not declare topology)'
        )


# --- the HTTP side ---------------------------------------------------------------------


class HealthBindError(SidecarError, OSError):
    """The HTTP endpoint could not listen on ``host:port``; ``errno`` is the OS's."""

    def __init__(self, *, host: str, port: int, listen: str, cause: OSError) -> None:
        self.host = host
        self.port = port
        super().__init__(
            cause.errno,
            f"cannot listen for /metrics, /healthz and /readyz on {listen}: "
            f"{cause.strerror or cause}; choose a free port or another http.listen address",
        )

    def __str__(self) -> str:
        return str(self.strerror)
