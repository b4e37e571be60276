"""How route-map values are shown to people: in error messages and in ``check``'s summary.

Pure: takes values, returns text.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.broker import BrokerAddress
    from sidecar.routemap.model import RouteMap

__all__ = ["describe", "masked_url", "show"]

_SHOW_MAX = 60  # characters of a value quoted in an error
_MASK = "***"  # a secret's place, as the broker URL's password is shown (BrokerAddress.masked)
_NOT_USER = frozenset("/?#")  # a user info with one of these is not a user's name alone


def show(value: object) -> str:  # noqa: PLR0911 - a case per YAML scalar kind
    """Render a value from the file the way YAML would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    if isinstance(value, str) and len(value) > _SHOW_MAX:
        return f'{json.dumps(value[:_SHOW_MAX])[:-1]}..." ({len(value):,} characters)'
    if isinstance(value, str | int | float):
        shown = json.dumps(value)
        return (
            shown if len(shown) <= _SHOW_MAX else f"{shown[:_SHOW_MAX]}... ({len(shown):,} digits)"
        )
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return json.dumps(str(value))


def masked_url(text: str) -> str:
    """Return a URL, or what was meant as one, with its secrets as ``***``.

    Hidden: the user info's password, each query value and the fragment. It is read
    loosely, since it may not parse: the user info runs to the last ``@``, so a password
    with an unencoded ``/``, ``?``, ``#`` or ``@`` is hidden whole, and one that cannot
    be told from a path is hidden with its user name.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    userinfo, at, rest = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        if _NOT_USER.isdisjoint(user) and (colon or _NOT_USER.isdisjoint(userinfo)):
            userinfo = f"{user}:{_MASK}@" if colon else f"{user}@"
        else:
            userinfo = f"{_MASK}@"
    rest, hash_, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    if question:
        items = (item.partition("=") for item in query.split("&"))
        query = "&".join(
            f"{name}={_MASK}" if eq else _MASK if name else "" for name, eq, _ in items
        )
    return f"{scheme}{sep}{userinfo}{rest}{question}{query}{hash_}{_MASK if fragment else ''}"


def _login(address: BrokerAddress) -> str:
    """Say who the sidecar logs in as: its client certificate when EXTERNAL comes first."""
    first, *others = address.mechanisms()
    if first != "EXTERNAL" or address.user_for(first) is not None:
        return f"login {address.login}"
    text = "login by client certificate (EXTERNAL)"
    return f"{text} where offered, else {address.login}" if others else text


def describe(route_map: RouteMap) -> str:
    """Return a multi-line summary for ``acemq-sidecar check``; the password is masked."""
    broker = route_map.broker
    settings = (
        f"prefetch {broker.prefetch}, heartbeat {broker.heartbeat_s} s,"
        f" connect timeout {broker.connect_timeout_s:g} s"
    )
    (first, *more) = broker.addresses
    if more:
        head = [f"broker: {len(broker.addresses)} nodes, tried in a shuffled order ({settings}):"]
        head += [f"  {a.masked()} ({_login(a)})" for a in broker.addresses]
    else:
        head = [f"broker: {first.masked()} ({_login(first)}, {settings})"]
    lines = [
        *head,
        f"mode: {route_map.mode}",
        f"quarantine exchange: {route_map.quarantine_exchange}",
        f"http: {route_map.http.listen}",
        f"shutdown grace: {route_map.shutdown_grace_s:g} s",
        f"routes ({len(route_map.routes)}):",
    ]
    for route in route_map.routes:
        exchange = route.exchange or "(default exchange)"
        key = "(original routing key)" if route.routing_key is None else show(route.routing_key)
        lines.append(
            f"  {route.name}: {route.queue} -> {exchange} / {key};"
            f" publishers {route.publishers}, origin {route.origin or '-'},"
            f" mode {route.mode}, prefetch {route.prefetch}"
        )
    return "\n".join(lines)
