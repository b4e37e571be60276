"""A route map whose login comes from files, as a RabbitMQ operator's Secret mounts them.

A user made for the test with ``rabbitmqctl add_user`` (deleted afterwards) whose password
holds ``/ ? # @ %`` and a space: the sidecar reads ``username_file`` and ``password_file``,
percent-encodes both into the URL that names only the host, logs in and relays; a
changed password file is read again at a reload, as ``url_file`` is.
"""

from __future__ import annotations

import secrets
import signal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import (
    Sidecar,
    declare_flow,
    declare_quarantine,
    eventually,
    make_ids,
    publish_ids,
    take_until,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.faults.conftest import RabbitCtl
    from tests.support import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

DELIVERY_TIMEOUT_S = 30.0
PASSWORD = "p/a?s#s@w%rd 1"  # noqa: S105 - a test user's; every character a URL reads as a delimiter, and a space


@pytest.fixture
async def login(rabbitmqctl: RabbitCtl) -> AsyncIterator[str]:
    """A user of the test's own, with every permission on the broker's vhost; deleted after."""
    user = f"acemq-login-{secrets.token_hex(4)}"
    await rabbitmqctl.run("add_user", user, PASSWORD)
    try:
        await rabbitmqctl.run("set_permissions", "-p", "/", user, ".*", ".*", ".*")
        yield user
    finally:
        await rabbitmqctl.run("delete_user", user)


@pytest.mark.e2e
async def test_a_login_from_files_relays_through_the_broker(
    broker: Broker, sidecar: Sidecar, login: str, rabbitmqctl: RabbitCtl, tmp_path: Path
) -> None:
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "login")
    username, password = tmp_path / "username", tmp_path / "password"
    username.write_text(login, encoding="utf-8")
    password.write_text(PASSWORD, encoding="utf-8")
    address = urlsplit(sidecar.amqp_url)
    route_map = sidecar.route_map(quarantine=quarantine, flows=[flow])
    route_map["broker"].update(
        url=f"amqp://{address.hostname}:{address.port or 5672}/",
        username_file=str(username),
        password_file=str(password),
    )
    sidecar.write(route_map)
    await sidecar.start()
    ids = make_ids("login", 50)
    await publish_ids(broker, flow.staging, ids)
    relayed = await take_until(
        broker, flow.target, ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    assert set(relayed) == set(ids)
    users = await rabbitmqctl.run("list_connections", "user", "--quiet")
    assert login in users.split(), users
    for part in ("p/a", "s#s", "w%rd"):
        assert part not in sidecar.output()

    # A rotated password: the broker's and the file's; a reload reads the file again, and
    # the next connection logs in with it.
    rotated = "n3w/p?ss#@%"
    await rabbitmqctl.run("change_password", login, rotated)
    password.write_text(rotated + "\n", encoding="utf-8")
    sidecar.send(signal.SIGHUP)

    async def reloaded() -> bool:
        return await sidecar.metric("acemq_sidecar_config_reloads_total", result="applied") >= 1

    await eventually(
        reloaded, timeout_s=DELIVERY_TIMEOUT_S, what="the reload", context=sidecar.output
    )
    for line in (await rabbitmqctl.run("list_connections", "pid", "user", "--quiet")).splitlines():
        pid, _, user = line.partition("\t")
        if user.strip() == login:
            await rabbitmqctl.run("close_connection", pid.strip(), "password rotated")
    later = make_ids("login-rotated", 50)
    await publish_ids(broker, flow.staging, later)
    relayed = await take_until(
        broker, flow.target, later, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    assert set(later) <= set(relayed)
    assert await sidecar.metric("acemq_sidecar_reconnects_total") >= 1
    for part in ("n3w/", "p?ss", "#@%"):
        assert part not in sidecar.output()
