"""TLS files as config: a file that cannot be used is a ConfigError at its key's line.

``client_context`` (the shell) reads the files and names the one that is wrong; the parser
turns that into ``FILE:LINE: broker.tls.KEY: ...``; ``load_config`` joins the two for
``check``, ``run`` and reloads. No ``ca_file`` means the system's CAs, verification on.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import pytest

from sidecar.errors import ConfigError, TlsFileError
from sidecar.route_files import load_config
from sidecar.routemap import parse_route_map
from sidecar.routemap.model import TlsConfig
from sidecar.tls import client_context
from tests.tls_files import TlsFiles, make_tls_files

if TYPE_CHECKING:
    from pathlib import Path

ROUTE = ("routes:", "  - name: a", "    from: q", "    to: {exchange: x}")


def _yaml(*lines: str) -> str:
    """Join lines, so that a line's position in the call is its line number in the file."""
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Generate the certificate, keys and bad files once for the module."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# --- the parser: a TlsFileError becomes FILE:LINE --------------------------------------------


BLOCK = _yaml(
    "broker:",
    "  url: amqps://h/",
    "  tls:",
    "    ca_file: /tls/ca.crt",
    "    cert_file: /tls/tls.crt",
    "    key_file: /tls/tls.key",
    *ROUTE,
)
FLOW = _yaml(
    "broker:",
    "  url: amqps://h/",
    "  tls: {ca_file: /tls/ca.crt,",
    "        cert_file: /tls/tls.crt,",
    "        key_file: /tls/tls.key}",
    *ROUTE,
)


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        pytest.param(BLOCK, "ca_file", 4, id="block-ca"),
        pytest.param(BLOCK, "cert_file", 5, id="block-cert"),
        pytest.param(BLOCK, "key_file", 6, id="block-key"),
        pytest.param(FLOW, "ca_file", 3, id="flow-ca"),
        pytest.param(FLOW, "key_file", 5, id="flow-key"),
    ],
)
def test_a_tls_file_problem_is_reported_at_its_keys_line(text: str, key: str, line: int) -> None:
    """The message points at the line to fix, like every other config error."""

    def check_tls(tls: TlsConfig) -> None:
        raise TlsFileError("cannot read it: No such file or directory", key=key, path="/p")

    with pytest.raises(ConfigError) as raised:
        parse_route_map(text, source="routes.yaml", env={}, check_tls=check_tls)
    assert str(raised.value) == (
        f"routes.yaml:{line}: broker.tls.{key}: cannot read it: No such file or directory"
    )
    assert (raised.value.line, raised.value.key) == (line, f"broker.tls.{key}")


def test_check_tls_sees_the_parsed_files_and_only_when_a_file_is_named() -> None:
    """The check gets the map's TLS files; a map without TLS files reads nothing."""
    seen: list[TlsConfig] = []
    parse_route_map(BLOCK, source="routes.yaml", env={}, check_tls=seen.append)
    assert seen == [
        TlsConfig(ca_file="/tls/ca.crt", cert_file="/tls/tls.crt", key_file="/tls/tls.key")
    ]
    for text in (_yaml(*ROUTE), _yaml("broker: {url: amqps://h/}", *ROUTE)):
        parse_route_map(text, source="routes.yaml", env={}, check_tls=seen.append)
    assert len(seen) == 1


def test_without_check_tls_the_pure_parser_reads_no_tls_file() -> None:
    """parse_route_map alone stays pure: files that do not exist pass (the shell checks)."""
    route_map = parse_route_map(BLOCK, source="routes.yaml", env={})
    assert route_map.broker.tls.ca_file == "/tls/ca.crt"


# --- client_context: which file, and what is wrong with it ------------------------------------


BAD = {
    "ca missing": ("missing", None, None, "ca_file", "cannot read {ca}: No such file or directory"),
    "ca a directory": ("directory", None, None, "ca_file", "cannot read {ca}: Is a directory"),
    "ca not a certificate": ("not_pem", None, None, "ca_file", "{ca} holds no PEM certificate"),
    "ca is a key": ("key", None, None, "ca_file", "{ca} holds no PEM certificate"),
    "cert missing": (None, "missing", "key", "cert_file", "cannot read {cert}: No such file"),
    "cert not a certificate": (None, "not_pem", "key", "cert_file", "{cert} holds no PEM cert"),
    "cert is a key": (None, "key", "key", "cert_file", "{cert} holds no PEM certificate"),
    "key missing": (None, "cert", "missing", "key_file", "cannot read {key}: No such file"),
    "key a directory": (None, "cert", "directory", "key_file", "cannot read {key}: Is a direc"),
    "key not a key": (None, "cert", "not_pem", "key_file", "{key} holds no PEM private key"),
    "key is a certificate": (None, "cert", "cert", "key_file", "{key} holds no PEM private key"),
    "key of another cert": (
        None,
        "cert",
        "other_key",
        "key_file",
        "{key} is not the private key of {cert} (key values mismatch)",
    ),
    "key encrypted": (None, "cert", "encrypted_key", "key_file", "{key} is an encrypted private"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_client_context_names_the_file_that_cannot_be_used(files: TlsFiles, case: str) -> None:
    """Missing, unreadable, or not what its key says: the error names the key and the file."""
    ca, cert, key, expected_key, expected = BAD[case]
    paths = {
        name: None if attribute is None else str(getattr(files, attribute))
        for name, attribute in (("ca", ca), ("cert", cert), ("key", key))
    }
    tls = TlsConfig(ca_file=paths["ca"], cert_file=paths["cert"], key_file=paths["key"])
    with pytest.raises(TlsFileError) as raised:
        client_context(tls)
    assert raised.value.key == expected_key
    assert raised.value.path == paths[expected_key.removesuffix("_file")]
    assert expected.format(**paths) in raised.value.detail


def test_every_tls_file_message_says_what_to_do(files: TlsFiles) -> None:
    """A reader learns the fix: mount the file, or drop the key (the system CAs for ca_file)."""
    with pytest.raises(TlsFileError) as ca:
        client_context(TlsConfig(ca_file=str(files.missing)))
    assert "or drop ca_file to verify the broker against the system's trusted CAs" in str(ca.value)
    with pytest.raises(TlsFileError) as key:
        client_context(TlsConfig(cert_file=str(files.cert), key_file=str(files.not_pem)))
    assert "drop cert_file and key_file" in str(key.value)


def test_no_ca_file_verifies_against_the_system_cas() -> None:
    """A kubernetes.io/tls Secret has no ca.crt: the broker is checked against the system's CAs."""
    context = client_context(TlsConfig())
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    system = ssl.create_default_context().cert_store_stats()
    assert context.cert_store_stats() == system


def test_a_ca_file_replaces_the_system_cas(files: TlsFiles) -> None:
    """With ca_file the broker must chain to that CA alone, verification still on."""
    context = client_context(TlsConfig(ca_file=str(files.cert)))
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 1


def test_a_client_certificate_without_ca_file_is_accepted(files: TlsFiles) -> None:
    """tls.crt and tls.key alone (a standard TLS Secret) make a working context."""
    context = client_context(TlsConfig(cert_file=str(files.cert), key_file=str(files.key)))
    assert context.verify_mode == ssl.CERT_REQUIRED


# --- load_config: the shell step check, run and reload share ---------------------------------


def test_load_config_refuses_a_missing_ca_file_at_its_line(files: TlsFiles, tmp_path: Path) -> None:
    """What check, run and a reload see for a TLS Secret without ca.crt mounted as ca_file."""
    path = tmp_path / "routes.yaml"
    path.write_text(
        _yaml("broker:", "  url: amqps://h/", "  tls:", f"    ca_file: {files.missing}", *ROUTE),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path, env={})
    assert str(raised.value).startswith(
        f"{path}:4: broker.tls.ca_file: cannot read {files.missing}: No such file or directory;"
    )


def test_load_config_accepts_good_files(files: TlsFiles, tmp_path: Path) -> None:
    """Files that make a context pass, and the map is returned as parsed."""
    path = tmp_path / "routes.yaml"
    path.write_text(
        _yaml(
            "broker:",
            "  url: amqps://h/",
            f"  tls: {{ca_file: {files.cert}, cert_file: {files.cert}, key_file: {files.key}}}",
            *ROUTE,
        ),
        encoding="utf-8",
    )
    assert load_config(path, env={}).broker.tls.key_file == str(files.key)
