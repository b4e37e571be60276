"""Throwaway TLS files for the tests: one self-signed certificate for localhost, and bad files.

The certificate is its own CA (``openssl req -x509``), so one file serves as ``ca_file``,
as a trust store (``SSL_CERT_FILE``) and as the server's or client's certificate.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.support import needs_tool

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A certificate and its key, another pair's key, an encrypted key, and non-PEM files."""

    cert: Path
    key: Path
    other_key: Path  # a valid key that does not belong to ``cert``
    encrypted_key: Path  # ``key`` under a passphrase
    not_pem: Path  # text that is neither a certificate nor a key
    missing: Path  # a path where no file is
    directory: Path  # a path that is a directory: opening it fails like an unreadable file


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _self_signed(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        cwd=directory,
    )  # fmt: skip


def make_tls_files(directory: Path) -> TlsFiles:
    """Write the files into ``directory`` with the ``openssl`` command (skip without it)."""
    needs_tool("openssl", why="the test certificates are made with it")
    _self_signed(directory, "server")
    _self_signed(directory, "other")
    _openssl(
        "pkey", "-in", "server.key", "-aes256", "-passout", "pass:secret",
        "-out", "encrypted.key",
        cwd=directory,
    )  # fmt: skip
    (directory / "not-pem.txt").write_text("this is not a certificate\n", encoding="utf-8")
    (directory / "a-directory").mkdir()
    return TlsFiles(
        cert=directory / "server.crt",
        key=directory / "server.key",
        other_key=directory / "other.key",
        encrypted_key=directory / "encrypted.key",
        not_pem=directory / "not-pem.txt",
        missing=directory / "absent.crt",
        directory=directory / "a-directory",
    )
