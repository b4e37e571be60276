"""The client's TLS context, built from the files ``broker.tls`` names.

This module owns reading the TLS files and what a file that cannot be used says. It is
shell, not core: it reads files. It runs twice for a route map: when the map is loaded
(``check``, ``run`` and every reload), where a bad file is refused as a config error at
its line, and at every connect, so a renewed certificate applies at the next reconnect.
It never relaxes verification: the broker's certificate and host name are always checked.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.errors import TlsFileError

if TYPE_CHECKING:
    from sidecar.routemap import TlsConfig

__all__ = ["client_context"]

_DROP_CLIENT = "or drop cert_file and key_file to connect without a client certificate"
_REMEDY = {
    "ca_file": "mount the PEM certificate of the CA that signed the broker's there,"
    " or drop ca_file to verify the broker against the system's trusted CAs",
    "cert_file": f"mount the client certificate (PEM) there, {_DROP_CLIENT}",
    "key_file": f"mount the client certificate's private key (PEM) there, {_DROP_CLIENT}",
}


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """Return a context that verifies the broker and presents the client certificate, if set.

    Without ``ca_file`` the broker is verified against the system's trusted CAs (what
    OpenSSL finds by default; ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` move it); with it,
    against that file's CAs only. Raise ``TlsFileError`` naming the file that is missing,
    unreadable or not what its key says.
    """
    files = (("ca_file", tls.ca_file), ("cert_file", tls.cert_file), ("key_file", tls.key_file))
    for key, path in files:
        if path is not None:
            _check_readable(key, path)
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except ssl.SSLError as e:
        raise _wrong("ca_file", str(tls.ca_file), f"holds no PEM certificate ({_reason(e)})") from e
    except OSError as e:  # the file went away since it was checked
        raise _unreadable("ca_file", str(tls.ca_file), e) from e
    if tls.cert_file is not None:
        _load_client_certificate(context, cert_file=tls.cert_file, key_file=tls.key_file)
    return context


def _check_readable(key: str, path: str) -> None:
    try:
        with Path(path).open("rb"):
            pass
    except OSError as e:
        raise _unreadable(key, path, e) from e


def _unreadable(key: str, path: str, e: OSError) -> TlsFileError:
    return TlsFileError(
        f"cannot read {path}: {e.strerror or e}; {_REMEDY[key]}", key=key, path=path
    )


def _wrong(key: str, path: str, problem: str) -> TlsFileError:
    return TlsFileError(f"{path} {problem}; {_REMEDY[key]}", key=key, path=path)


def _load_client_certificate(
    context: ssl.SSLContext, *, cert_file: str, key_file: str | None
) -> None:
    # load_cert_chain reports a bad certificate and a bad key alike ("PEM lib"): read the
    # certificate alone first, so that the error names the file that is wrong.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert_file)
    except ssl.SSLError as e:
        raise _wrong("cert_file", cert_file, f"holds no PEM certificate ({_reason(e)})") from e
    except OSError as e:
        raise _unreadable("cert_file", cert_file, e) from e
    key, path = ("key_file", key_file) if key_file is not None else ("cert_file", cert_file)
    try:
        context.load_cert_chain(cert_file, key_file, password=_refuse_passphrase)
    except _EncryptedKeyError:
        raise _wrong(
            key,
            path,
            "is an encrypted private key and the route map has no passphrase; decrypt it"
            " (a Kubernetes TLS Secret holds it unencrypted)",
        ) from None
    except ssl.SSLError as e:
        problem = (
            f"is not the private key of {cert_file} ({_reason(e)})"
            if e.reason == "KEY_VALUES_MISMATCH"
            else "holds no PEM private key"
        )
        raise _wrong(key, path, problem) from e
    except OSError as e:
        raise _unreadable(key, path, e) from e


class _EncryptedKeyError(Exception):
    """OpenSSL asked for a passphrase: the key file is encrypted."""


def _refuse_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, and block a process that has one.
    raise _EncryptedKeyError


def _reason(e: ssl.SSLError) -> str:
    return (e.reason or "unreadable").replace("_", " ").lower()
