"""What runs together, put together above the layers that run it.

The broker knows nothing of the dashboard, and the dashboard only what a broker or a host
shows it: ``python -m replication broker --ui`` is composed here (``cli.py`` hands
``serve_dashboard`` to the broker's ``run`` as a service), so no layer imports the one that
composes it.
"""

from __future__ import annotations

import logging

from .broker.loopback import is_loopback_bind
from .broker.server import Broker
from .dashboard import Dashboard, Namespace

log = logging.getLogger("replication.broker")


def serve_dashboard(broker: Broker) -> Dashboard:
    """The dashboard on the broker's HTTP side (its paths answered before the management
    API's); off loopback every call needs a SAS token of the namespace (on loopback the
    listener takes only loopback Hosts and Origins instead: ``broker/loopback.py``)."""
    loopback = is_loopback_bind(broker.host)
    dashboard = Dashboard([Namespace.of_broker(broker)], require_token=not loopback)
    broker.http_app = dashboard.wrap(broker.http_app)
    where = "localhost" if broker.host in ("0.0.0.0", "::", "") else broker.host
    if broker.http_port is not None:
        log.info("dashboard on http://%s:%d/", where, broker.http_port)
    else:
        log.info("dashboard on https://%s:%d/ (no plain HTTP port)", where, broker.port)
    return dashboard
