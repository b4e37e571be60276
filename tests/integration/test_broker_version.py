"""The matrix's broker is the one its ``broker_version`` names (tests/brokers.py).

The version the broker announces in its ``connection.start`` is the one ``rabbitmqctl
version`` reads from the node the ``rabbitmqctl`` fixture reaches: a 4.x parameter ran on a
4.x node (never the shared broker), and a fault made with rabbitmqctl lands on the broker the
test talks to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.brokers import LOCAL

if TYPE_CHECKING:
    from tests.faults.conftest import RabbitCtl
    from tests.support import Broker

pytestmark = pytest.mark.integration

SHARED_PORT = 5672  # the shared broker's (tests/support.py's LOCAL_URL)


def announced(broker: Broker) -> str:
    """The version the broker announced when the test client connected."""
    version = broker.connection.server_properties["version"]
    return version.decode() if isinstance(version, bytes) else str(version)


@pytest.mark.version_changed
async def test_the_broker_is_the_version_its_parameter_names(
    broker: Broker, rabbitmqctl: RabbitCtl, amqp_url: str, broker_version: str
) -> None:
    version = announced(broker)
    controlled = (await rabbitmqctl.run("version")).strip().splitlines()[-1]
    assert version == controlled, f"the client reached {version}, rabbitmqctl {controlled}"
    if broker_version != LOCAL:
        assert version.startswith(f"{broker_version}."), (version, broker_version)
        assert urlsplit(amqp_url).port != SHARED_PORT, amqp_url
        assert any("chroot" in part for part in rabbitmqctl.command), rabbitmqctl.command
