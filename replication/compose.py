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
from .dashboard.eventhubs_view import EventHubsView, catalog_of
from .dashboard.ui_token import fragment, problem, token_for

log = logging.getLogger("replication.broker")


def serve_dashboard(broker: Broker, ui_token: str | None = None) -> Dashboard:
    """The dashboard on the broker's HTTP side (its paths answered before the management
    API's), with the broker's event hubs; off loopback every call needs a SAS token of the
    namespace (on loopback the listener takes only loopback Hosts and Origins instead:
    ``broker/loopback.py``). ``ui_token``: ``--ui-token`` (``dashboard/ui_token.py``), put
    in the URL logged."""
    loopback = is_loopback_bind(broker.host)
    namespace = Namespace.of_broker(broker)
    hubs = EventHubsView({namespace.name: catalog_of(broker)})
    dashboard = Dashboard([namespace], require_token=not loopback, event_hubs=hubs)
    broker.http_app = dashboard.wrap(broker.http_app)
    where = "localhost" if broker.host in ("0.0.0.0", "::", "") else broker.host
    suffix = ""
    if ui_token is not None and loopback:
        log.warning("--ui-token: not needed on loopback (%s asks for no token)", broker.host)
    elif ui_token is not None:
        token = token_for(ui_token, namespace.host, broker.clock.time())
        why = problem(token, broker.authorizer, broker.clock.time())
        if why is not None:
            log.warning("--ui-token: this broker refuses it (%s); the page will ask", why)
        suffix = fragment(token)
    if broker.http_port is not None:
        log.info("dashboard on http://%s:%d/%s", where, broker.http_port, suffix)
    else:
        log.info("dashboard on https://%s:%d/%s (no plain HTTP port)", where, broker.port, suffix)
    return dashboard
