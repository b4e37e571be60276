"""broker.credentialsSecret: the Secret a RabbitMQ operator makes, read as the sidecar reads it.

The login is mounted as two files (the route map's username_file and password_file), host
and port come as variables, and the route map's URL is built of them; the rendered route
map, parsed by the sidecar with those files and variables, logs in as the Secret says.
"""

from __future__ import annotations

from typing import Any

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


def _values(**secret: Any) -> dict[str, Any]:
    values = read_values(MINIMAL_VALUES)
    values["broker"] = {
        "urlSecret": {"name": ""},
        "credentialsSecret": {"name": "rabbit-default-user"} | secret,
    }
    return values


def _pod(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    return spec


def test_the_secret_is_mounted_and_its_host_and_port_are_variables() -> None:
    manifests = render(_values())
    for manifest in manifests:
        for kube_version in KUBE_VERSIONS:
            kubernetes_validate.validate(manifest.body, kube_version, strict=True)
    pod = _pod(manifests)
    container = sidecar_container(pod)
    env = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in container["env"]}
    assert env == {
        "ACEMQ_BROKER_HOST": {"name": "rabbit-default-user", "key": "host"},
        "ACEMQ_BROKER_PORT": {"name": "rabbit-default-user", "key": "port"},
    }
    [volume] = [v for v in pod["volumes"] if v["name"] == "acemq-sidecar-broker"]
    [source] = volume["projected"]["sources"]
    assert source["secret"] == {
        "name": "rabbit-default-user",
        "items": [{"key": "username", "path": "username"}, {"key": "password", "path": "password"}],
    }
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "acemq-sidecar-broker"]
    assert mount == {
        "name": "acemq-sidecar-broker",
        "mountPath": "/etc/acemq-sidecar-broker",
        "readOnly": True,
    }
    broker = yaml.safe_load(routes_yaml(manifests))["broker"]
    assert broker["url"] == "amqp://${ACEMQ_BROKER_HOST}:${ACEMQ_BROKER_PORT}/%2F"
    assert broker["username_file"] == "/etc/acemq-sidecar-broker/username"
    assert broker["password_file"] == "/etc/acemq-sidecar-broker/password"  # noqa: S105
    assert "Secret rabbit-default-user" in render_notes(_values())


@pytest.mark.parametrize(("vhost", "expected"), [("/", "/"), ("orders eu/1", "orders eu/1")])
def test_the_sidecar_reads_the_rendered_map_as_the_secret_says(vhost: str, expected: str) -> None:
    """The rendered route map, with the Secret's files and variables: that login, that host."""
    manifests = render(_values(scheme="amqps", vhost=vhost, usernameKey="user"))
    files = {
        "/etc/acemq-sidecar-broker/username": "default_user_Xy@z",
        "/etc/acemq-sidecar-broker/password": "p/a?s#s@w%rd\n",
    }
    route_map = parse_route_map(
        routes_yaml(manifests),
        source="routes.yaml",
        env={"ACEMQ_BROKER_HOST": "rabbit.messaging.svc", "ACEMQ_BROKER_PORT": "5671"},
        read_file=files.__getitem__,
    )
    [address] = route_map.broker.addresses
    assert (address.host, address.port, address.tls) == ("rabbit.messaging.svc", 5671, True)
    assert address.vhost == expected
    assert (address.login, address.password.reveal()) == ("default_user_Xy@z", "p/a?s#s@w%rd")
    items = _pod(manifests)["volumes"][-1]["projected"]["sources"][0]["secret"]["items"]
    assert items[0] == {"key": "user", "path": "username"}


def test_a_rotation_rolls_the_pods_as_for_the_url_secret() -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = only(render(values), "Deployment").body["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/acemq-broker-secret"])

    assert checksum(_values(revision="1")) != checksum(_values(revision="2"))
    assert checksum(_values(revision="1")) != checksum(_values(revision="1", passwordKey="pw"))
