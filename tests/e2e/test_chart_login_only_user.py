"""The chart's route map for a login-only Secret relays as a least-privilege user.

What the Topology Operator's ``User`` Secret holds (``username`` and ``password``, nothing
else) with the broker's host and port as values (``broker.address``): the chart renders
the route map, the sidecar reads it with the login files mounted where the chart mounts
them, and relays through the local broker logged in as a user made for the test with the
permissions docs/kubernetes.md gives (configure none, write on the target, the quarantine
exchange and ``amq.default``, read on the staging queue); the user is deleted at the end.
Then the chart's `helm test` command, run against that sidecar, passes (and fails against
a port where nothing answers).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import subprocess
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiormq
import pytest

from tests.deploy.conftest import MINIMAL_VALUES, only, read_values, render, routes_yaml
from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    free_port,
    make_ids,
    publish_ids,
    take_until,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.faults.conftest import RabbitCtl
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DELIVERY_TIMEOUT_S = 30.0
MOUNT = "/etc/acemq-sidecar-broker"  # where the chart mounts the Secret's login


def _only(*names: str) -> str:
    """A permission regex matching exactly these names."""
    return "^(" + "|".join(re.escape(name) for name in names) + ")$"


def _helm_test_command(manifests: list[Any], url: str) -> list[str]:
    """The test Pod's command, its URL replaced, run by this machine's Python."""
    [container] = only(manifests, "Pod").body["spec"]["containers"]
    command = [str(part) for part in container["command"]]
    assert command[0] == "python"
    assert command[-1].endswith("/readyz")
    return [sys.executable, *command[1:-1], url]


def _render_chart(
    sidecar: Sidecar,
    *,
    host: str,
    port: int,
    user: str,
    password: str,
    quarantine: str,
    route: dict[str, Any],
    tmp_path: Path,
) -> list[Any]:
    """Render the chart for a login-only Secret; write its route map and login files."""
    values = read_values(MINIMAL_VALUES)
    values["broker"] = {
        "urlSecret": {"name": ""},
        "credentialsSecret": {"name": f"{user}-user-credentials"},  # username, password only
        "address": {"host": host, "port": port},
    }
    values["routeMap"] = {
        "http": {"listen": f"0.0.0.0:{sidecar.port}"},
        "quarantine": {"exchange": quarantine},
        "shutdown_grace_s": 5,
        "routes": [route],
    }
    manifests = render(values)
    pod = only(manifests, "Deployment").body["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "acemq-sidecar-broker"]
    [source] = volume["projected"]["sources"]
    login = tmp_path / "login"
    login.mkdir()
    secret = {"username": user, "password": password}  # the User Secret's two keys
    for item in source["secret"]["items"]:
        (login / item["path"]).write_text(secret[item["key"]], encoding="utf-8")
    text = routes_yaml(manifests)
    assert MOUNT in text
    sidecar.write(text.replace(MOUNT, str(login)))
    return manifests


async def _helm_test(manifests: list[Any], port: int) -> subprocess.CompletedProcess[str]:
    """Run the test Pod's command against http://127.0.0.1:<port>/readyz."""
    return await asyncio.to_thread(
        subprocess.run,
        _helm_test_command(manifests, f"http://127.0.0.1:{port}/readyz"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.version_changed
@pytest.mark.e2e
async def test_a_login_only_secret_relays_as_a_user_with_write_and_read_only(
    amqp_url: str, broker: Broker, sidecar: Sidecar, rabbitmqctl: RabbitCtl, tmp_path: Path
) -> None:
    address = urlsplit(amqp_url)
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "chart-login")
    user = f"acemq-chart-{secrets.token_hex(4)}"
    # token_urlsafe may begin with '-', which rabbitmqctl reads as an option
    password = f"pw-{secrets.token_urlsafe(24)}"

    manifests = _render_chart(
        sidecar,
        host=address.hostname or "127.0.0.1",
        port=address.port or 5672,
        user=user,
        password=password,
        quarantine=quarantine,
        route=flow.route(),
        tmp_path=tmp_path,
    )

    await rabbitmqctl.run("add_user", user, password)
    try:
        await rabbitmqctl.run(
            "set_permissions",
            "-p",
            address.path.removeprefix("/") or "/",
            user,
            "",  # configure: none
            _only(flow.exchange, quarantine, "amq.default"),  # write
            _only(flow.staging),  # read
        )
        permissions = await rabbitmqctl.run("list_user_permissions", user, "--quiet")
        assert f"/\t\t{_only(flow.exchange, quarantine, 'amq.default')}" in permissions

        await sidecar.start()
        ids = make_ids("chart-login", 100)
        await publish_ids(broker, flow.staging, ids)
        relayed = await take_until(
            broker, flow.target, ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
        )
        assert set(relayed) == set(ids)
        connections = await rabbitmqctl.run("list_connections", "user", "--quiet")
        assert user in connections.split(), connections
        assert password not in sidecar.output()

        # The same user may not declare anything: configure is none.
        connection = await aiormq.connect(
            f"amqp://{user}:{password}@{address.hostname}:{address.port or 5672}/"
        )
        try:
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await channel.exchange_declare(f"{flow.exchange}.other", exchange_type="topic")
        finally:
            await connection.close()

        # `helm test`: the chart's command against this sidecar's /readyz passes...
        passing = await _helm_test(manifests, sidecar.port)
        assert passing.returncode == 0, passing.stdout + passing.stderr
        assert " 200 " in passing.stdout
        assert '"ready": true' in passing.stdout
        # ...and fails where no sidecar answers.
        assert (await _helm_test(manifests, free_port())).returncode != 0
    finally:
        await sidecar.kill()
        await rabbitmqctl.run("delete_user", user)
    users = await rabbitmqctl.run("list_users", "--quiet")
    assert user not in users.split()
