"""The AMQP properties of a relayed message (docs/contract.md section 2).

This module owns what normalise does to the properties: ``message_id`` and ``reply_to``
mirrored from their headers when they fit a short string, and a ``user_id`` the broker
would refuse moved to ``acemq-original-user-id`` (``move_user_id``, which the relay also applies
to an original it republishes as it was). It must not change any other property.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.contract.envelope import property_text
from sidecar.contract.names import ORIGINAL_USER_ID, REPLY_TO, SHORT_STRING_MAX
from sidecar.contract.readers import as_utf8, wire_bytes
from sidecar.contract.verdict import Kind, Violation

if TYPE_CHECKING:
    from sidecar.contract.envelope import Envelope
    from sidecar.wire import FieldValue, PropertyValue

__all__ = ["move_user_id", "normalise_properties"]


def normalise_properties(env: Envelope, msg_id: str, login: str | None) -> dict[str, PropertyValue]:
    """Mirror message_id and reply_to from the headers; move a foreign user_id."""
    found, headers = env.found, env.headers
    properties = dict(env.properties)
    if properties.get("message_id") != msg_id and _fits_short_string(msg_id):
        found.append(Violation(Kind.MIRROR, "message_id"))
        properties["message_id"] = msg_id

    reply_to = env.text(REPLY_TO)
    if reply_to is None:
        from_property = property_text(properties, "reply_to")
        if from_property is not None:
            reply_to = env.default(REPLY_TO, from_property)
    if reply_to is not None:
        headers[REPLY_TO] = reply_to
        if properties.get("reply_to") != reply_to and _fits_short_string(reply_to):
            found.append(Violation(Kind.MIRROR, "reply_to"))
            properties["reply_to"] = reply_to

    moved = move_user_id(properties, headers, login=login)
    if moved is not None:
        found.append(Violation(moved, "user_id"))
    return properties


def _fits_short_string(text: str) -> bool:
    """Whether text fits an AMQP short string property; a longer one stays in its header."""
    # Four bytes per character at most: only long text needs encoding to know.
    return len(text) * 4 <= SHORT_STRING_MAX or len(wire_bytes(text)) <= SHORT_STRING_MAX


def move_user_id(
    properties: dict[str, PropertyValue], headers: dict[str, FieldValue], *, login: str | None
) -> Kind | None:
    """Remove a user_id the broker would refuse from our login (section 2), in place.

    RabbitMQ refuses a publish whose user_id is not the publishing login, so any other
    value moves to ``acemq-original-user-id`` (``moved``) and an empty one is dropped
    (``empty_value``). ``login`` None: the name the broker knows us by is not known (an
    EXTERNAL login without a user), so every user_id moves. Return the kind, or None when
    user_id may stay.
    """
    user_id = properties.get("user_id")
    if user_id is None or (login is not None and user_id == login):
        return None
    del properties["user_id"]
    if user_id == "":
        return Kind.EMPTY_VALUE
    headers[ORIGINAL_USER_ID] = as_utf8(str(user_id))
    return Kind.MOVED
