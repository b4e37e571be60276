"""Where the broker is, and which address to try next: pure, no I/O.

The broker's URL parsed once into a ``BrokerAddress`` (host, port, vhost, login, secret,
TLS, query parameters; the name the broker knows a login by), masked for logs
(``mask_url``), the order in which a failover ring of addresses is tried
(``Failover``), and what a broker's release changes for its clients (``nack_is_free``).
The dialer and the AMQP client carry these out.
"""

from __future__ import annotations

from sidecar.broker.address import BrokerAddress, Secret, host_port, mask_url
from sidecar.broker.failover import Failover
from sidecar.broker.release import nack_is_free

__all__ = ["BrokerAddress", "Failover", "Secret", "host_port", "mask_url", "nack_is_free"]
