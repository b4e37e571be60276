"""broker.username_file and broker.password_file: a login from a Secret's keys, not a URL.

The RabbitMQ operators' Secrets hold ``username``, ``password``, ``host`` and ``port``; the
route map reads the two login files and puts them, percent-encoded, into every broker URL,
which names only the host. Every problem is refused with FILE:LINE, and neither file's
content is ever shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import cli
from sidecar.errors import ConfigError
from sidecar.routemap import RouteMap, describe, parse_route_map

if TYPE_CHECKING:
    from pathlib import Path

ROUTE = ("routes:", "  - {name: a, from: q, to: {exchange: x}}")
USER, PASSWORD = "/run/secrets/broker/username", "/run/secrets/broker/password"
LOGIN = (f"  username_file: {USER}", f"  password_file: {PASSWORD}")


def _yaml(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _parse(text: str, files: dict[str, str] | None) -> RouteMap:
    def read(path: str) -> str:
        assert files is not None
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    return parse_route_map(
        text,
        source="r.yaml",
        env={"AMQP_URL": "amqp://rabbit-env:5672/"},
        read_file=None if files is None else read,
    )


def _error(text: str, files: dict[str, str] | None) -> str:
    with pytest.raises(ConfigError) as caught:
        _parse(text, files)
    return str(caught.value)


def test_the_login_files_go_into_the_url_percent_encoded() -> None:
    """A password holding / ? # @ % and a space reaches the login exactly as written."""
    files = {USER: "relay@shop\n", PASSWORD: "p/a?s#s@w%rd 1\n"}
    route_map = _parse(_yaml("broker:", "  url: amqp://rabbit:5671/orders", *LOGIN, *ROUTE), files)
    [address] = route_map.broker.addresses
    assert (address.host, address.port, address.vhost) == ("rabbit", 5671, "orders")
    assert address.login == "relay@shop"
    assert address.password.reveal() == "p/a?s#s@w%rd 1"
    assert "p/a" not in describe(route_map)


def test_every_node_of_urls_gets_the_login() -> None:
    files = {USER: "relay", PASSWORD: "pw"}
    text = _yaml("broker:", "  urls: [amqp://n1/, amqps://n2/]", *LOGIN, *ROUTE)
    addresses = _parse(text, files).broker.addresses
    assert [(a.host, a.login, a.password.reveal()) for a in addresses] == [
        ("n1", "relay", "pw"),
        ("n2", "relay", "pw"),
    ]


def test_the_default_url_gets_the_login_too() -> None:
    """Without broker.url the map's default ${AMQP_URL} is the host."""
    [address] = _parse(
        _yaml("broker:", *LOGIN, *ROUTE), {USER: "u", PASSWORD: "p"}
    ).broker.addresses
    assert (address.host, address.login) == ("rabbit-env", "u")


@pytest.mark.parametrize(
    ("broker", "files", "expected"),
    [
        pytest.param(
            (LOGIN[0],),
            {USER: "u"},
            "r.yaml:2: broker.password_file: set broker.username_file and broker.password_file",
            id="one without the other",
        ),
        pytest.param(
            LOGIN, {USER: "u"}, f"r.yaml:3: broker.password_file: cannot read {PASSWORD}", id="gone"
        ),
        pytest.param(
            LOGIN,
            {USER: "\n", PASSWORD: "p"},
            f"r.yaml:2: broker.username_file: {USER} is empty",
            id="empty",
        ),
        pytest.param(
            ("  url: amqp://guest:guest@rabbit/", *LOGIN),
            {USER: "u", PASSWORD: "p"},
            "r.yaml:2: broker.url: the URL names a user",
            id="a user twice",
        ),
        pytest.param(
            ("  username_file: ''", LOGIN[1]),
            {PASSWORD: "p"},
            "r.yaml:2: broker.username_file: expected the path of a file",
            id="no path",
        ),
    ],
)
def test_a_bad_login_is_refused_at_its_line(
    broker: tuple[str, ...], files: dict[str, str], expected: str
) -> None:
    assert expected in _error(_yaml("broker:", *broker, *ROUTE), files)


def test_a_map_not_read_from_a_file_cannot_use_them() -> None:
    message = _error(_yaml("broker:", *LOGIN, *ROUTE), None)
    assert "broker.username_file: only a route map read from a file" in message


_PASSWORDS = st.text(alphabet=st.sampled_from("ab9/#?@:%!$&'()*+,;=[]~-._ "), max_size=12).map(
    lambda middle: f"Sx7{middle}Qz9"
)


@given(password=_PASSWORDS)
@settings(max_examples=200, deadline=None)
def test_any_password_logs_in_as_written_and_is_never_shown(password: str) -> None:
    route_map = _parse(
        _yaml("broker:", "  url: amqp://rabbit/", *LOGIN, *ROUTE), {USER: "u", PASSWORD: password}
    )
    [address] = route_map.broker.addresses
    assert address.password.reveal() == password
    shown = describe(route_map) + repr(route_map) + address.masked()
    assert "Sx7" not in shown
    assert "Qz9" not in shown


def test_check_reads_the_files_and_prints_no_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "username").write_text("relay", encoding="utf-8")
    (tmp_path / "password").write_text("pa/ss#w?rd@x%y", encoding="utf-8")
    config = tmp_path / "routes.yaml"
    login = (
        f"  username_file: {tmp_path / 'username'}",
        f"  password_file: {tmp_path / 'password'}",
    )
    config.write_text(_yaml("broker:", "  url: amqp://rabbit/", *login, *ROUTE), encoding="utf-8")
    assert cli.main(["check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "relay" in out
    for part in ("pa/ss", "ss#w", "w?rd", "rd@x", "x%y"):
        assert part not in out + err
    (tmp_path / "password").unlink()
    assert cli.main(["check", str(config)]) == 2
    _, err = capsys.readouterr()
    assert f"{config}:4: broker.password_file: cannot read" in err
