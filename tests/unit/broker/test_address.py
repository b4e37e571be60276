"""The broker URL, parsed once: parts, TLS, query parameters, and a password never shown."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.broker import BrokerAddress, Secret, host_port, mask_url
from sidecar.errors import BrokerAddressError


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "amqp://guest:guest@127.0.0.1:5672/",
            {"host": "127.0.0.1", "port": 5672, "vhost": "/", "login": "guest", "tls": False},
        ),
        (
            "amqp://rabbit",
            {"host": "rabbit", "port": 5672, "vhost": "/", "login": "guest", "tls": False},
        ),
        ("amqps://u:p@rabbit/", {"host": "rabbit", "port": 5671, "tls": True}),
        ("AMQPS://u:p@rabbit/", {"port": 5671, "tls": True}),  # the scheme in any case
        ("Amqp://u:p@rabbit/", {"port": 5672, "tls": False}),
        (
            "amqp://u%40corp:p@[::1]:5673/%2F",
            {"host": "::1", "port": 5673, "vhost": "/", "login": "u@corp"},
        ),
        ("amqp://u:p@rabbit/orders", {"vhost": "orders"}),
        ("amqp://u:p@rabbit/a%2Fb", {"vhost": "a/b"}),
    ],
)
def test_the_parts_are_read_by_rabbitmqs_uri_spec(url: str, expected: dict[str, object]) -> None:
    """Scheme, host, port by scheme, the percent-decoded login and vhost."""
    address = BrokerAddress.parse(url)
    for name, value in expected.items():
        assert getattr(address, name) == value, name


def test_the_password_is_decoded_and_defaults_to_guest() -> None:
    """aiormq's defaults: no user info means guest:guest, an empty password too."""
    assert BrokerAddress.parse("amqp://u:p%2F%3F%23w@h/").password.reveal() == "p/?#w"
    assert BrokerAddress.parse("amqp://h/").password.reveal() == "guest"
    assert BrokerAddress.parse("amqp://u:@h/").password.reveal() == "guest"
    assert BrokerAddress.parse("amqp://u:p@ss@h/").password.reveal() == "p@ss"


def test_the_query_parameters_the_client_honours_are_parsed() -> None:
    """heartbeat in seconds, connection_timeout in milliseconds, limits, mechanisms."""
    address = BrokerAddress.parse(
        "amqp://h/?heartbeat=5&connection_timeout=1500&channel_max=10&frame_max=8192"
        "&auth_mechanism=plain&auth_mechanism=PLAIN"
    )
    assert address.heartbeat_s == 5
    assert address.connect_timeout_s == 1.5
    assert address.channel_max == 10
    assert address.frame_max == 8192
    assert address.auth_mechanisms == ("PLAIN",)
    unset = BrokerAddress.parse("amqp://h/")
    assert (unset.heartbeat_s, unset.connect_timeout_s, unset.frame_max) == (None, None, None)


@pytest.mark.parametrize(
    ("query", "parameter", "says"),
    [
        ("hearbeat=5", "hearbeat", "did you mean heartbeat?"),
        ("prefetch=5", "prefetch", "not one the client knows"),
        ("heartbeat=soon", "heartbeat", "whole number of seconds from 0 to 65535"),
        ("heartbeat=70000", "heartbeat", "from 0 to 65535"),
        ("heartbeat=-1", "heartbeat", "whole number"),
        ("heartbeat=5&heartbeat=6", "heartbeat", "given twice"),
        ("connection_timeout=0", "connection_timeout", "milliseconds from 1"),
        ("frame_max=1024", "frame_max", "no less than 4096"),
        ("channel_max=65536", "channel_max", "from 0 to 65535"),
        ("auth_mechanism=rabbit-cr-demo", "auth_mechanism", "does not support"),
        ("auth_mechanism=external", "auth_mechanism", "needs amqps://"),
        ("auth_mechanism=kerberos", "auth_mechanism", "not a SASL mechanism"),
        ("certfile=/c.pem", "certfile", "broker.tls"),
        ("password=hunter2", "password", "TLS option"),
    ],
)
def test_an_unknown_or_bad_parameter_is_refused_by_name(
    query: str, parameter: str, says: str
) -> None:
    """Never silently ignored: the error names the parameter and what it takes."""
    with pytest.raises(BrokerAddressError) as e:
        BrokerAddress.parse(f"amqp://u:secret@h/?{query}")
    assert e.value.parameter == parameter
    assert parameter in str(e.value)
    assert says in str(e.value)
    assert "secret" not in str(e.value)
    assert "hunter2" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://u:secret@h/", "must start with amqp:// or amqps://"),
        ("amqp://u:secret@/", "no host"),
        ("amqp://u:secret@h:0/", "port is 0"),
        ("amqp://u:secret@h:99999/", "host or port does not parse"),
        ("amqp://u:secret@[::1/", "host or port does not parse"),
        ("amqp://u:secret@h/a/b", "write it as %2F"),
        ("amqp://u:s/ecret@h/", "percent-encode"),  # an un-encoded '/' in the password
        ("amqp://u:s?ecret@h/", "percent-encode"),  # '?'
        ("amqp://u:s#ecret@h/", "%23"),  # '#'
        ("amqp://u:12/secret@h/", "percent-encode"),  # a '/' after digits: not a port
        ("amqp://u:secret@h/?a", "query does not parse"),
    ],
)
def test_an_unusable_url_is_refused_without_showing_the_password(url: str, says: str) -> None:
    """The message says what to fix and quotes nothing of the URL."""
    with pytest.raises(BrokerAddressError) as e:
        BrokerAddress.parse(url)
    assert says in str(e.value)
    assert "secret" not in str(e.value)
    assert "ecret" not in str(e.value)
    assert e.value.__cause__ is None
    assert "secret" not in mask_url(url)


def test_masked_shows_everything_but_the_password() -> None:
    """What a log line and `check` print."""
    address = BrokerAddress.parse("AMQPS://al%3Aice:s3cret@[::1]/my%20vhost?heartbeat=5")
    assert address.masked() == "amqps://al%3Aice:***@[::1]:5671/my%20vhost?heartbeat=5"
    assert "s3cret" not in repr(address)
    assert str(address.password) == "***"
    assert repr(Secret("s3cret")) == "Secret('***')"
    assert Secret("a") == Secret("a")


def test_host_port_brackets_an_ipv6_host() -> None:
    """The one place a host and port are written together."""
    assert host_port("::1", 5672) == "[::1]:5672"
    assert host_port("rabbit", 5671) == "rabbit:5671"
    assert BrokerAddress.parse("amqp://[fe80::1]:5/").endpoint == "[fe80::1]:5"


# Names from lower-case letters and digits; a password always holds the upper-case marker,
# so that it cannot appear in a masked URL made of the other parts by chance. What comes
# before the marker may pass for a port ("12/PW...": digits, then a stray '/').
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~", min_size=1, max_size=12)
passwords = st.builds(
    lambda head, tail: f"{head}PW{tail}",
    st.text("0123456789/?#@:", max_size=6) | st.text(max_size=6),
    st.text(max_size=12),
)
ports = st.integers(1, 65535)


@given(login=names, password=passwords, host=names, port=ports, vhost=names)
def test_a_percent_encoded_url_round_trips_its_parts(
    login: str, password: str, host: str, port: int, vhost: str
) -> None:
    """Whatever the password holds, encoded it comes back exactly."""
    url = f"amqp://{quote(login, safe='')}:{quote(password, safe='')}@{host}:{port}/{vhost}"
    address = BrokerAddress.parse(url)
    assert (address.login, address.host, address.port, address.vhost) == (
        login,
        host,
        port,
        vhost,
    )
    assert address.password.reveal() == password
    assert BrokerAddress.parse(address.masked()).masked() == address.masked()


@given(
    login=names,
    password=passwords,
    host=names,
    vhost=names,
    scheme=st.sampled_from(["amqp", "AMQPS"]),
)
def test_no_url_shows_its_password_masked_or_refused_encoded_or_not(
    login: str, password: str, host: str, vhost: str, scheme: str
) -> None:
    """An un-encoded '/', '#' or '?' in the password must not leak it."""
    for written in (password, quote(password, safe="")):
        url = f"{scheme}://{login}:{written}@{host}/{vhost}"
        assert "PW" not in mask_url(url)
        assert "PW" not in shown(url)


def shown(url: str) -> str:
    """What a parse shows of a URL: its masked form and repr, or its error."""
    try:
        address = BrokerAddress.parse(url)
    except BrokerAddressError as e:
        return str(e)
    return address.masked() + repr(address)


@pytest.mark.parametrize(
    ("url", "mechanism", "user"),
    [
        ("amqps://broker", "EXTERNAL", None),  # the certificate's name: not known to us
        ("amqps://broker", "PLAIN", "guest"),
        ("amqps://svc@broker", "EXTERNAL", "svc"),  # named: taken to be the certificate's
        ("amqp://alice:pw@broker", "AMQPLAIN", "alice"),
        ("amqp://broker", None, "guest"),  # not logged in (a connection made by hand)
    ],
)
def test_the_name_the_broker_knows_us_by_follows_the_mechanism(
    url: str, mechanism: str | None, user: str | None
) -> None:
    assert BrokerAddress.parse(url).user_for(mechanism) == user
