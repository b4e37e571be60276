"""TLS values: the defaults fit a kubernetes.io/tls Secret; each file the route map names exists."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.conftest import (
    MINIMAL_VALUES,
    Manifest,
    only,
    read_values,
    render,
    routes_yaml,
    sidecar_container,
)

# What `kubectl create secret tls NAME --cert=... --key=...` writes (type kubernetes.io/tls).
KUBERNETES_TLS = frozenset({"tls.crt", "tls.key"})
# What cert-manager writes for a Certificate (its issuer's CA as well).
CERT_MANAGER = frozenset({"tls.crt", "tls.key", "ca.crt"})


def _mounted_files(pod: dict[str, Any], secrets: dict[str, frozenset[str]]) -> set[str]:
    """The files the kubelet puts in the sidecar's mounts, given each Secret's keys.

    A ``secret`` volume without ``items`` holds every key; with ``items`` it holds the
    listed paths, and the pod does not start (an event names the key) when a listed key is
    missing. A ``projected`` volume is the union of its sources.
    """
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: set[str] = set()
    for mount in sidecar_container(pod)["volumeMounts"]:
        volume = volumes[mount["name"]]
        sources = [volume] if "secret" in volume else volume.get("projected", {}).get("sources", [])
        for source in sources:
            if "secret" not in source:
                continue
            secret = source["secret"]
            name = secret.get("secretName", secret.get("name"))
            keys = secrets[name]
            items = secret.get("items")
            if items is None:
                files |= {str(PurePosixPath(mount["mountPath"]) / key) for key in keys}
                continue
            for item in items:
                assert item["key"] in keys, (
                    f"Secret {name} has no key {item['key']}: the pod would not start"
                )
                files.add(str(PurePosixPath(mount["mountPath"]) / item["path"]))
    return files


def _tls_files(manifests: list[Manifest]) -> dict[str, str | None]:
    tls: dict[str, str | None] = yaml.safe_load(routes_yaml(manifests))["broker"].get("tls") or {}
    return tls


def _pod(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    return spec


def _values(tls: dict[str, Any]) -> dict[str, Any]:
    values = read_values(MINIMAL_VALUES)
    values["tls"] = tls
    return values


def test_a_kubernetes_tls_secret_fits_the_defaults() -> None:
    """`kubectl create secret tls`: client certificate and key; the CA is the system's."""
    manifests = render(_values({"enabled": True, "secretName": "broker-client"}))
    tls = _tls_files(manifests)
    files = _mounted_files(_pod(manifests), {"broker-client": KUBERNETES_TLS})
    named = {path for path in tls.values() if path}
    assert named <= files, f"the route map names {named - files}, the pod has {files}"
    assert tls.get("ca_file") is None  # system trust store, verification on
    assert tls["cert_file"]
    assert tls["key_file"]


def test_ca_from_a_key_of_the_same_secret() -> None:
    """A cert-manager Secret carries ca.crt: caKey names it."""
    manifests = render(_values({"enabled": True, "secretName": "broker-client", "caKey": "ca.crt"}))
    tls = _tls_files(manifests)
    files = _mounted_files(_pod(manifests), {"broker-client": CERT_MANAGER})
    assert {tls["ca_file"], tls["cert_file"], tls["key_file"]} <= files


def test_ca_from_a_separate_secret() -> None:
    """The CA bundle in its own Secret (or under another key), next to a kubernetes.io/tls one."""
    manifests = render(
        _values(
            {
                "enabled": True,
                "secretName": "broker-client",
                "caSecretName": "broker-ca",
                "caKey": "bundle.pem",
            }
        )
    )
    tls = _tls_files(manifests)
    files = _mounted_files(
        _pod(manifests), {"broker-client": KUBERNETES_TLS, "broker-ca": frozenset({"bundle.pem"})}
    )
    assert {tls["ca_file"], tls["cert_file"], tls["key_file"]} <= files
    assert len(files) == 3


def test_server_verification_only_with_a_ca_secret() -> None:
    """No client certificate: only the CA Secret is mounted."""
    manifests = render(_values({"enabled": True, "caSecretName": "broker-ca", "caKey": "ca.crt"}))
    tls = _tls_files(manifests)
    files = _mounted_files(_pod(manifests), {"broker-ca": frozenset({"ca.crt"})})
    assert tls.get("cert_file") is None
    assert tls.get("key_file") is None
    assert {tls["ca_file"]} == files


def test_system_trust_store_only_mounts_nothing() -> None:
    """amqps:// against a broker with a publicly trusted certificate needs no Secret at all."""
    manifests = render(_values({"enabled": True}))
    pod = _pod(manifests)
    assert _tls_files(manifests) == {"ca_file": None, "cert_file": None, "key_file": None}
    assert all("tls" not in m["name"] for m in sidecar_container(pod)["volumeMounts"])


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"enabled": True, "caKey": "ca.crt"}, "caKey"),
        ({"enabled": True, "secretName": "client", "keyKey": ""}, "certKey and keyKey"),
    ],
    ids=["ca key without a secret", "half a client certificate"],
)
def test_tls_values_that_cannot_work_are_refused(tls: dict[str, Any], message: str) -> None:
    """Rendering stops with what to set, instead of a pod that crash-loops."""
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(_values(tls))
