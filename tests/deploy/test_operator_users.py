"""Operator users: a login-only Secret with the address from values or another Secret.

The Topology Operator's ``User`` Secret holds ``username`` and ``password`` only; the
Cluster Operator's ``<cluster>-default-user`` adds ``host``, ``port`` and
``connection_string``. Each shape renders strictly valid objects whose route map, read by
the sidecar with the files and variables the pod would have, logs in where the values say.
``tls.enabled`` with a scheme other than ``amqps`` is refused at render.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from sidecar.routemap import parse_route_map
from tests.deploy.conftest import (
    KUBE_VERSIONS,
    MINIMAL_VALUES,
    Manifest,
    only,
    read_values,
    render,
    render_notes,
    routes_yaml,
    sidecar_container,
)
from tests.deploy.crd_schema import validate_custom

KEDA_CRDS = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}
LOGIN_FILES = {
    "/etc/acemq-sidecar-broker/username": "orders-relay-7Qx",
    "/etc/acemq-sidecar-broker/password": "p/a?s#s@w%rd\n",
}


def _values(address: dict[str, Any] | None = None, **secret: Any) -> dict[str, Any]:
    values = read_values(MINIMAL_VALUES)
    values["broker"] = {
        "urlSecret": {"name": ""},
        "credentialsSecret": {"name": "orders-relay-user-credentials"} | secret,
    }
    if address is not None:
        values["broker"]["address"] = address
    return values


def _validate(manifests: list[Manifest]) -> None:
    for manifest in manifests:
        if manifest.kind in KEDA_CRDS:
            validate_custom(manifest.body, KEDA_CRDS[manifest.kind])
        elif manifest.kind not in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            for kube_version in KUBE_VERSIONS:
                kubernetes_validate.validate(manifest.body, kube_version, strict=True)


def _pod(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    return spec


def _env(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in sidecar_container(_pod(manifests)).get("env", [])}


def _address(manifests: list[Manifest], env: dict[str, str] | None = None) -> Any:
    route_map = parse_route_map(
        routes_yaml(manifests),
        source="routes.yaml",
        env=env or {},
        read_file=LOGIN_FILES.__getitem__,
    )
    [address] = route_map.broker.addresses
    return address


@pytest.mark.parametrize(
    ("address", "scheme", "expected"),
    [
        ({"host": "rabbit.messaging.svc", "port": 5673}, "amqp", ("rabbit.messaging.svc", 5673)),
        ({"host": "rabbit.messaging.svc"}, "amqp", ("rabbit.messaging.svc", 5672)),
        ({"host": "10.0.0.7"}, "amqps", ("10.0.0.7", 5671)),
    ],
    ids=["host and port", "amqp's port", "amqps' port"],
)
def test_a_login_only_secret_with_the_address_as_values(
    address: dict[str, Any], scheme: str, expected: tuple[str, int]
) -> None:
    """Only username and password are read from the Secret: no secretKeyRef to host or port."""
    values = _values(address, scheme=scheme, vhost="orders")
    if scheme == "amqps":
        values["tls"] = {"enabled": True}
    manifests = render(values)
    _validate(manifests)
    # No variable at all: the address is in the route map, the login in the files.
    assert "env" not in sidecar_container(_pod(manifests))
    [volume] = [v for v in _pod(manifests)["volumes"] if v["name"] == "acemq-sidecar-broker"]
    [source] = volume["projected"]["sources"]
    assert [item["key"] for item in source["secret"]["items"]] == ["username", "password"]
    parsed = _address(manifests)
    assert (parsed.host, parsed.port, parsed.vhost, parsed.tls) == (
        *expected,
        "orders",
        scheme == "amqps",
    )
    assert (parsed.login, parsed.password.reveal()) == ("orders-relay-7Qx", "p/a?s#s@w%rd")


def test_host_and_port_from_a_second_secret() -> None:
    """The Topology Operator's login with the Cluster Operator's default-user's host and port."""
    address = {"secretName": "rabbit-default-user", "hostKey": "host", "portKey": "port"}
    manifests = render(_values(address))
    _validate(manifests)
    env = _env(manifests)
    assert env["ACEMQ_BROKER_HOST"]["valueFrom"]["secretKeyRef"] == {
        "name": "rabbit-default-user",
        "key": "host",
    }
    assert env["ACEMQ_BROKER_PORT"]["valueFrom"]["secretKeyRef"] == {
        "name": "rabbit-default-user",
        "key": "port",
    }
    parsed = _address(
        manifests, {"ACEMQ_BROKER_HOST": "rabbit.messaging.svc", "ACEMQ_BROKER_PORT": "5672"}
    )
    assert (parsed.host, parsed.port, parsed.login) == (
        "rabbit.messaging.svc",
        5672,
        "orders-relay-7Qx",
    )
    notes = render_notes(_values(address))
    assert "amqp://<host>:<port>/%2F (host and port from Secret rabbit-default-user)" in notes


def test_the_address_changes_roll_the_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = only(render(values), "Deployment").body["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/acemq-broker-secret"])

    one = checksum(_values({"host": "rabbit-a.messaging.svc"}))
    assert one != checksum(_values({"host": "rabbit-b.messaging.svc"}))
    assert one != checksum(_values({"secretName": "rabbit-default-user"}))


def test_the_notes_show_the_vhost_percent_encoded() -> None:
    """The default vhost "/" is %2F in a URL; amqp://host:port// would be the vhost ""."""
    notes = render_notes(_values({"host": "rabbit.messaging.svc"}))
    assert "amqp://rabbit.messaging.svc:5672/%2F" in notes
    assert ":5672//" not in notes
    notes = render_notes(_values())
    assert "amqp://<host>:<port>/%2F" in notes


def test_the_cluster_operators_connection_string_works_as_a_url_secret() -> None:
    """urlSecret {name: <cluster>-default-user, key: connection_string}: AMQP_URL from it."""
    values = read_values(MINIMAL_VALUES)
    values["broker"] = {"urlSecret": {"name": "rabbit-default-user", "key": "connection_string"}}
    values["keda"] = {"enabled": True}
    manifests = render(values)
    _validate(manifests)
    assert _env(manifests)["AMQP_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "rabbit-default-user",
        "key": "connection_string",
    }
    # What the Cluster Operator writes: amqp://<user>:<password>@<service>.<ns>.svc:5672/
    url = "amqp://default_user_nYb3-x:Qz1_-w8RkVn2cT0a@rabbit.messaging.svc:5672/"
    route_map = parse_route_map(routes_yaml(manifests), source="routes.yaml", env={"AMQP_URL": url})
    [address] = route_map.broker.addresses
    assert (address.host, address.port, address.login) == (
        "rabbit.messaging.svc",
        5672,
        "default_user_nYb3-x",
    )
    auth = only(manifests, "TriggerAuthentication").body["spec"]
    assert auth["secretTargetRef"] == [
        {"parameter": "host", "name": "rabbit-default-user", "key": "connection_string"}
    ]


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ({"host": "rabbit", "secretName": "rabbit-default-user"}, "set one"),
        ({"port": 5672}, "a port needs broker.address.host"),
    ],
    ids=["host twice", "port without host"],
)
def test_an_address_that_cannot_work_is_refused(address: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(_values(address))


def test_an_address_with_a_url_secret_is_refused() -> None:
    values = read_values(MINIMAL_VALUES)
    values["broker"]["address"] = {"host": "rabbit.messaging.svc"}
    with pytest.raises(helm_python.HelmRenderError, match="the URL names them"):
        render(values)


def test_keda_reads_the_address_of_the_values() -> None:
    values = _values({"host": "rabbit.messaging.svc", "port": 5672}, vhost="orders")
    values["keda"] = {"enabled": True}
    manifests = render(values)
    _validate(manifests)
    assert _env(manifests)["ACEMQ_BROKER_ADDRESS"]["value"] == (
        "amqp://rabbit.messaging.svc:5672/orders"
    )
    auth = only(manifests, "TriggerAuthentication").body["spec"]
    assert [ref["parameter"] for ref in auth["secretTargetRef"]] == ["username", "password"]


# tls.enabled needs amqps: otherwise a crash loop (client certificate) or plaintext.
def test_tls_with_the_amqp_scheme_is_refused() -> None:
    values = _values({"host": "rabbit.messaging.svc"}, scheme="amqp")
    values["tls"] = {"enabled": True, "secretName": "broker-client"}
    with pytest.raises(helm_python.HelmRenderError) as refused:
        render(values)
    message = str(refused.value)
    assert 'tls.enabled: broker.credentialsSecret.scheme is "amqp"' in message
    assert "set broker.credentialsSecret.scheme: amqps" in message


def test_tls_with_amqps_renders_and_uses_the_tls_port() -> None:
    values = _values({"host": "rabbit.messaging.svc"}, scheme="amqps")
    values["tls"] = {"enabled": True, "secretName": "broker-client"}
    manifests = render(values)
    _validate(manifests)
    assert yaml.safe_load(routes_yaml(manifests))["broker"]["url"] == (
        "amqps://rabbit.messaging.svc:5671/%2F"
    )
