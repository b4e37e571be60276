"""The broker's address: a URL parsed once into a frozen value. Pure: no I/O, no logging.

It owns the reading of an ``amqp://`` or ``amqps://`` URL by RabbitMQ's URI spec (the
scheme matched in any case, the user info and vhost percent-decoded, the port defaulting
by scheme) and of the query parameters of RabbitMQ's URI query spec that the client
honours. Anything else in the query is refused by name, never ignored.

It must never show a password: the password is a :class:`Secret`, the display form is
:meth:`BrokerAddress.masked`, rebuilt from the parsed parts, and an error names the part
at fault without quoting the URL. A password with an ``/``, ``?`` or ``#`` left
un-percent-encoded is refused with that advice rather than read as a host or a vhost.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Final, TypedDict
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from sidecar.errors import BrokerAddressError

__all__ = ["BrokerAddress", "Secret", "host_port", "mask_url"]

DEFAULT_PORTS: Final = {"amqp": 5672, "amqps": 5671}
FRAME_MIN: Final = 4096  # AMQP 0-9-1's frame-min-size: the least a peer may ask for
_U16: Final = 0xFFFF
_U32: Final = 0xFFFF_FFFF
_SUPPORTED_MECHANISMS: Final = frozenset({"PLAIN", "AMQPLAIN", "EXTERNAL"})
_KNOWN_MECHANISMS: Final = frozenset({"PLAIN", "AMQPLAIN", "EXTERNAL", "RABBIT-CR-DEMO"})
# RabbitMQ's TLS query parameters: the route map's broker.tls carries these instead.
_TLS_PARAMETERS: Final = frozenset(
    {
        "cacertfile",
        "certfile",
        "keyfile",
        "verify",
        "fail_if_no_peer_cert",
        "password",
        "depth",
        "server_name_indication",
    }
)
_PARAMETERS: Final = (
    "heartbeat",
    "connection_timeout",
    "channel_max",
    "frame_max",
    "auth_mechanism",
)
_HOST_PORT_PROBLEM: Final = (
    "the broker URL's host or port does not parse: the port must be a number from 1 to 65535,"
    " an IPv6 host goes in brackets ([::1]), and a '/' or '?' in the password must be"
    " percent-encoded (%2F, %3F)"
)
_NOT_SHOWN: Final = "<a URL that does not parse, not shown: it may hold a password>"


@dataclass(frozen=True, slots=True)
class Secret:
    """A password: equal by value, shown as ``***`` by ``repr`` and ``str``."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        """Return the password itself, for the login and nothing else."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerAddress:
    """Where the broker is and how to log in and tune, as a URL said it once.

    ``None`` for a query parameter means the URL did not set it. ``frame_max`` and
    ``channel_max`` are ceilings (0: none of the URL's own); the connection takes the
    least of the URL's, the client's and the broker's. ``auth_mechanisms`` empty: the
    client picks from the broker's list; ``login_given`` false: the URL named no user
    (``login`` is then guest).
    """

    host: str
    port: int
    vhost: str
    login: str
    password: Secret
    tls: bool
    heartbeat_s: int | None = None
    connect_timeout_s: float | None = None
    channel_max: int | None = None
    frame_max: int | None = None
    auth_mechanisms: tuple[str, ...] = ()
    login_given: bool = True

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """Parse a broker URL; raise :class:`BrokerAddressError` naming the part at fault.

        The user and password default to ``guest`` (an empty password too, as aiormq
        does); an empty path or ``/`` is the vhost ``/``.
        """
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in DEFAULT_PORTS:
            raise BrokerAddressError(
                "the broker URL must start with amqp:// or amqps://"
                " (amqp://user:password@host:port/vhost)"
            )
        if "#" in rest:
            raise BrokerAddressError(
                "the broker URL holds a '#', which an AMQP URL has no use for; if the password"
                " holds one, write it as %23"
            )
        try:
            parts = urlsplit(f"{scheme}://{rest}")
        except ValueError:  # its message may quote what a stray character made the host
            raise BrokerAddressError(_HOST_PORT_PROBLEM) from None
        if "@" in parts.path or "@" in parts.query:
            raise BrokerAddressError(
                "the broker URL has an '@' after its host: if the password holds '/' or '?',"
                " percent-encode them (%2F, %3F); an '@' in the vhost is written %40"
            )
        host, port = _host_and_port(parts.netloc.rpartition("@")[2], scheme)
        userinfo, at, _ = parts.netloc.rpartition("@")
        login, _, password = userinfo.partition(":") if at else ("", "", "")
        query = _query(parts.query)
        if "EXTERNAL" in query.get("auth_mechanisms", ()) and scheme != "amqps":
            raise _refuse(
                "auth_mechanism",
                "is external, which logs in with the client certificate: it needs amqps://",
            )
        return cls(
            host=host,
            port=port,
            vhost=_vhost(parts.path),
            login=unquote(login) or "guest",
            password=Secret(unquote(password) or "guest"),
            tls=scheme == "amqps",
            login_given=bool(unquote(login)),
            **query,
        )

    def mechanisms(self) -> tuple[str, ...]:
        """Return our SASL mechanisms in the order the client tries them.

        The URL's ``auth_mechanism`` values when it gives any, in its order; else PLAIN then
        AMQPLAIN, with EXTERNAL first over amqps:// when the URL names no user.
        """
        if self.auth_mechanisms:
            return self.auth_mechanisms
        if self.tls and not self.login_given:
            return ("EXTERNAL", "PLAIN", "AMQPLAIN")
        return ("PLAIN", "AMQPLAIN")

    def user_for(self, mechanism: str | None) -> str | None:
        """Return the name the broker knows a login with ``mechanism`` by; None if unknown.

        The URL's user (guest when it names none), except for EXTERNAL without a user: the
        broker then takes the name from the client certificate (RabbitMQ's
        ``ssl_cert_login_from``), which the client does not know. With a user, EXTERNAL
        takes it to be the certificate's: name it in the URL to keep user_ids that match.
        """
        if mechanism == "EXTERNAL" and not self.login_given:
            return None
        return self.login

    @property
    def endpoint(self) -> str:
        """Return ``host:port``, the host in brackets when it is an IPv6 address."""
        return host_port(self.host, self.port)

    def masked(self) -> str:
        """Return the URL to show: the password as ``***``, whatever the URL held."""
        scheme = "amqps" if self.tls else "amqp"
        login = quote(self.login, safe="")
        vhost = "" if self.vhost == "/" else quote(self.vhost, safe="")
        query = "&".join(f"{name}={value}" for name, value in self._query_items())
        return f"{scheme}://{login}:***@{self.endpoint}/{vhost}" + (f"?{query}" if query else "")

    def _query_items(self) -> list[tuple[str, str]]:
        items: list[tuple[str, str]] = []
        if self.heartbeat_s is not None:
            items.append(("heartbeat", str(self.heartbeat_s)))
        if self.connect_timeout_s is not None:
            items.append(("connection_timeout", str(round(self.connect_timeout_s * 1000))))
        if self.channel_max is not None:
            items.append(("channel_max", str(self.channel_max)))
        if self.frame_max is not None:
            items.append(("frame_max", str(self.frame_max)))
        if self.auth_mechanisms:
            items += [("auth_mechanism", m.lower()) for m in self.auth_mechanisms]
        return items


def host_port(host: str, port: int) -> str:
    """Return ``host:port`` as a URL or a log line writes it: ``[::1]:5672`` for IPv6."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def mask_url(url: str) -> str:
    """Return a broker URL fit to show: masked when it parses, a placeholder otherwise."""
    try:
        return BrokerAddress.parse(url).masked()
    except BrokerAddressError:
        return _NOT_SHOWN


def _host_and_port(hostport: str, scheme: str) -> tuple[str, int]:
    try:
        parts = urlsplit(f"//{hostport}")
        host, port = parts.hostname, parts.port
    except ValueError:
        # urlsplit's own message may quote the port, which a stray '/' can make a password.
        raise BrokerAddressError(_HOST_PORT_PROBLEM) from None
    if not host:
        raise BrokerAddressError("the broker URL has no host (amqp://user:password@host/)")
    if port == 0:
        raise BrokerAddressError("the broker URL's port is 0, which is not a broker's port")
    return host, port or DEFAULT_PORTS[scheme]


def _vhost(path: str) -> str:
    if path in ("", "/"):
        return "/"
    name = path[1:]
    if "/" in name:
        raise BrokerAddressError(
            "the broker URL's vhost has a '/' in it; write it as %2F (amqp://host/%2Fname)"
        )
    return unquote(name)


class _Query(TypedDict, total=False):
    heartbeat_s: int
    connect_timeout_s: float
    channel_max: int
    frame_max: int
    auth_mechanisms: tuple[str, ...]


def _query(query: str) -> _Query:  # noqa: C901 - one case per query parameter
    """Read the query parameters the client honours; refuse any other by its name."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise BrokerAddressError(
            "the broker URL's query does not parse; write it as ?name=value&name=value"
        ) from None
    seen: set[str] = set()
    mechanisms: list[str] = []
    values: _Query = {}
    for name, value in pairs:
        if name != "auth_mechanism" and name in seen:
            raise _refuse(name, "is given twice; give it once")
        seen.add(name)
        match name:
            case "heartbeat":
                values["heartbeat_s"] = _integer(name, value, low=0, high=_U16, unit="seconds")
            case "connection_timeout":
                ms = _integer(name, value, low=1, high=_U32, unit="milliseconds")
                values["connect_timeout_s"] = ms / 1000
            case "channel_max":
                values["channel_max"] = _integer(name, value, low=0, high=_U16, unit="channels")
            case "frame_max":
                frame_max = _integer(name, value, low=0, high=_U32, unit="bytes")
                if 0 < frame_max < FRAME_MIN:
                    raise _refuse(name, f"is {frame_max}; AMQP 0-9-1 allows no less than 4096")
                values["frame_max"] = frame_max
            case "auth_mechanism":
                mechanisms.append(_mechanism(value))
            case _ if name in _TLS_PARAMETERS:
                raise _refuse(
                    name,
                    "is a TLS option; set it in the route map's broker.tls (ca_file,"
                    " cert_file, key_file) instead",
                )
            case _:
                close = difflib.get_close_matches(name, _PARAMETERS, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                known = ", ".join(_PARAMETERS)
                raise _refuse(name, f"is not one the client knows{hint} (it knows {known})")
    if mechanisms:
        values["auth_mechanisms"] = tuple(dict.fromkeys(mechanisms))
    return values


def _integer(name: str, value: str, *, low: int, high: int, unit: str) -> int:
    if not value.isdigit() or not value.isascii() or not low <= int(value) <= high:
        raise _refuse(name, f"must be a whole number of {unit} from {low} to {high}, got {value!r}")
    return int(value)


def _mechanism(value: str) -> str:
    mechanism = value.upper()
    if mechanism in _SUPPORTED_MECHANISMS:
        return mechanism
    if mechanism in _KNOWN_MECHANISMS:
        raise _refuse(
            "auth_mechanism",
            f"is {value!r}, which the client does not support; it speaks plain, amqplain"
            " and external",
        )
    raise _refuse("auth_mechanism", f"is {value!r}, not a SASL mechanism the client knows")


def _refuse(name: str, problem: str) -> BrokerAddressError:
    return BrokerAddressError(f"the broker URL's parameter {name} {problem}", parameter=name)
