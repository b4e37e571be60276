"""The route map's broker section: one URL or several, parsed once, refused with FILE:LINE.

Every URL becomes a ``BrokerAddress`` at load, so what cannot be used (a bad URL, an
unknown query parameter, one that contradicts heartbeat_s) stops ``check``, start and a
reload alike, and no message, ``check`` summary or repr ever shows a password.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import cli
from sidecar.broker import BrokerAddress
from sidecar.errors import ConfigError
from sidecar.routemap import RouteMap, describe, parse_route_map

if TYPE_CHECKING:
    from pathlib import Path

ROUTE = ("routes:", "  - {name: a, from: q, to: {exchange: x}}")


def _yaml(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _parse(text: str, *, files: dict[str, str] | None = None) -> RouteMap:
    return parse_route_map(
        text, source="r.yaml", env={}, read_file=None if files is None else files.__getitem__
    )


def _error(text: str, *, files: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        _parse(text, files=files)
    return str(caught.value)


# --- several addresses ---------------------------------------------------------------------


def test_urls_become_addresses_in_the_files_order() -> None:
    """Each node with its own scheme and login; the TLS files apply to the amqps ones."""
    route_map = _parse(
        _yaml(
            "broker:",
            "  urls:",
            "    - amqp://relay:pw1@rabbit-0:5672/orders",
            "    - AMQPS://relay:pw2@rabbit-1/orders",
            *ROUTE,
        )
    )
    assert route_map.broker.addresses == (
        BrokerAddress.parse("amqp://relay:pw1@rabbit-0:5672/orders"),
        BrokerAddress.parse("amqps://relay:pw2@rabbit-1:5671/orders"),
    )


def test_check_lists_every_node_masked() -> None:
    """acemq-sidecar check names each node, never a password."""
    text = describe(
        _parse(_yaml("broker:", "  urls: [amqp://a:s3cret@n1/, amqp://b:s3cret@n2/]", *ROUTE))
    )
    assert "s3cret" not in text
    assert text.splitlines()[:3] == [
        (
            "broker: 2 nodes, tried in a shuffled order (prefetch 512, heartbeat 30 s,"
            " connect timeout 10 s):"
        ),
        "  amqp://a:***@n1:5672/ (login a)",
        "  amqp://b:***@n2:5672/ (login b)",
    ]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            ("broker:", "  url: amqp://h1/", "  urls: [amqp://h2/]"),
            "r.yaml:3: broker.urls: set broker.url (one address) or broker.urls (the nodes of"
            " a cluster), not both",
            id="url-and-urls",
        ),
        pytest.param(
            ("broker:", "  urls: []"),
            "r.yaml:2: broker.urls: expected at least one broker URL",
            id="empty-list",
        ),
        pytest.param(
            ("broker:", "  urls:", "    - amqp://h1/", "    - 5672"),
            "r.yaml:4: broker.urls[1]: expected a broker URL (a string), got 5672",
            id="not-a-string",
        ),
        pytest.param(
            ("broker:", "  urls: amqp://h1/"),
            "r.yaml:2: broker.urls: expected a list",
            id="not-a-list",
        ),
        pytest.param(
            ("broker:", "  urls:", "    - amqp://h1/", "    - amqp://h1:5672"),
            "r.yaml:4: broker.urls[1]: h1:5672 is listed twice (first as broker.urls[0])",
            id="twice",
        ),
        pytest.param(
            ("broker:", "  urls:", "    - amqp://h1/orders", "    - amqp://h2/billing"),
            'r.yaml:4: broker.urls[1]: the vhost "billing" differs from the first URL\'s "orders"',
            id="two-vhosts",
        ),
        pytest.param(
            ("broker:", "  urls:", "    - amqp://h1/", "    - amqp://h2/?heartbeet=5"),
            "r.yaml:4: broker.urls[1]: the broker URL's parameter heartbeet is not one the"
            " client knows; did you mean heartbeat?",
            id="unknown-parameter",
        ),
        pytest.param(
            ("broker:", "  url: amqp://h1/?cacertfile=/ca.pem"),
            "r.yaml:2: broker.url: the broker URL's parameter cacertfile is a TLS option; set it"
            " in the route map's broker.tls",
            id="tls-parameter",
        ),
        pytest.param(
            ("broker:", "  url: amqp://h1/?heartbeat=5", "  heartbeat_s: 30"),
            "r.yaml:2: broker.url: the URL's heartbeat=5 contradicts broker.heartbeat_s (30);"
            " set it in one place",
            id="heartbeat-contradicts",
        ),
        pytest.param(
            (
                "broker:",
                "  urls: [amqp://h1/, 'amqp://h2/?connection_timeout=2000']",
                "  connect_timeout_s: 5",
            ),
            "r.yaml:2: broker.urls[1]: the URL's connection_timeout=2000 (ms) contradicts"
            " broker.connect_timeout_s (5 s); set it in one place",
            id="timeout-contradicts",
        ),
        pytest.param(
            ("broker:", "  urls: [amqp://h1/, amqp://h2/]", "  tls: {ca_file: /ca.pem}"),
            "r.yaml:3: broker.tls: TLS files are set but no broker URL is amqps://",
            id="tls-files-without-amqps",
        ),
        pytest.param(
            ("broker:", "  url: null"),
            "r.yaml:2: broker.url: expected a broker URL",
            id="url-null",
        ),
    ],
)
def test_what_cannot_be_used_is_refused_at_its_line(lines: tuple[str, ...], expected: str) -> None:
    """check, start and a reload refuse it alike (exit 2; a reload keeps the old map)."""
    assert expected in _error(_yaml(*lines, *ROUTE))


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param(("broker:", "  url: amqp://h1/?heartbeat=5"), id="url-alone"),
        pytest.param(("broker:", "  url: amqp://h1/?heartbeat=5", "  heartbeat_s: 5"), id="same"),
        pytest.param(
            ("broker:", "  url: amqp://h1/?connection_timeout=2500", "  connect_timeout_s: 2.5"),
            id="same-timeout",
        ),
        pytest.param(
            ("broker:", "  urls: [amqp://h1/, amqps://h2/]", "  tls: {ca_file: /ca.pem}"),
            id="tls-for-the-amqps-one",
        ),
    ],
)
def test_a_query_parameter_that_agrees_or_stands_alone_is_taken(lines: tuple[str, ...]) -> None:
    """The URL's own value wins only where the map does not say otherwise."""
    _parse(_yaml(*lines, *ROUTE))


# --- url_file ------------------------------------------------------------------------------


URL_FILE = ("broker:", "  url_file: /run/secrets/amqp/urls")


def test_a_url_file_with_several_lines_lists_the_nodes() -> None:
    """One URL per line, blank lines and comments skipped: a Secret can hold the node list."""
    files = {"/run/secrets/amqp/urls": "# the cluster\namqp://r:pw@n1/\n\n  amqp://r:pw@n2/  \n"}
    route_map = _parse(_yaml(*URL_FILE, *ROUTE), files=files)
    assert [a.endpoint for a in route_map.broker.addresses] == ["n1:5672", "n2:5672"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("amqp://r:pw@n1/\nhttp://r:pw@n2/\n", "broker.urls[1]: the broker URL must"),
        pytest.param("# nothing\n\n", "broker.urls: expected at least one broker URL"),
        pytest.param("amqp://r:pw@n1/?frame_max=12", "broker.url: the broker URL's parameter"),
    ],
)
def test_a_bad_url_file_is_reported_on_the_url_file_line(content: str, expected: str) -> None:
    """The file's own line numbers mean nothing to the reader: the url_file line is the place."""
    message = _error(_yaml(*URL_FILE, *ROUTE), files={"/run/secrets/amqp/urls": content})
    assert message.startswith("r.yaml:2: "), message
    assert expected in message


def test_urls_and_url_file_together_are_refused() -> None:
    text = _yaml(*URL_FILE, "  urls: [amqp://h/]", *ROUTE)
    assert "r.yaml:2: broker.url_file: set broker.urls or broker.url_file, not both" in _error(
        text, files={"/run/secrets/amqp/urls": "amqp://h/"}
    )


# --- no password is ever shown ---------------------------------------------------------------

# A password as people type them, with the characters a URL reads as delimiters in the
# middle; its two ends are marks found nowhere else, so any part of it shown is caught.
_PASSWORDS = st.text(alphabet=st.sampled_from("ab9/#?@:%!$&'()*+,;=[]~-._"), max_size=12).map(
    lambda middle: f"Sx7{middle}Qz9"
)


@given(password=_PASSWORDS, where=st.sampled_from(["url", "urls", "url_file"]))
@settings(max_examples=300, deadline=None)
def test_no_password_is_shown_by_check_or_an_error(password: str, where: str) -> None:
    """A password with an unencoded /, # or ? is never printed.

    Written as typed (not percent-encoded), such a URL is either refused (with no part of
    the URL in the message) or parsed (and then shown masked).
    """
    url = f"amqp://relay:{password}@rabbit-0:5672/"
    lines = {
        "url": ("broker:", f"  url: {url!r}".replace("'", '"')),
        "urls": ("broker:", "  urls:", f"    - {url!r}".replace("'", '"'), "    - amqp://n2/"),
        "url_file": URL_FILE,
    }[where]
    files = {"/run/secrets/amqp/urls": url + "\n"}
    try:
        shown = describe(_parse(_yaml(*lines, *ROUTE), files=files))
    except ConfigError as e:
        shown = str(e)
    assert "Sx7" not in shown, shown
    assert "Qz9" not in shown, shown


def test_check_and_run_print_no_password_of_a_url_they_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The two commands that read a route map, on one an operator got wrong."""
    secret = tmp_path / "url"
    secret.write_text("amqp://relay:pa/ss#w?rd@rabbit-0/\n", encoding="utf-8")
    config = tmp_path / "routes.yaml"
    config.write_text(_yaml(f"broker: {{url_file: {secret}}}", *ROUTE), encoding="utf-8")
    assert cli.main(["check", str(config)]) == 2
    assert cli.main(["run", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert f"{config}:1: broker.url" in err
    for part in ("pa/ss", "ss#w", "w?rd", "rd@rabbit"):
        assert part not in out + err
