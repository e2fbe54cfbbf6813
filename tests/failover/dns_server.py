"""The Service Bus federation guidance's zones on the in-process DNS server
(``replication.drill.dns_server``, which the drill serves its alias with too)."""

from __future__ import annotations

from replication.drill.dns_server import DnsServer

__all__ = ["ALIAS", "SB_ZONES", "DnsServer", "seed_zone"]

SB_ZONES = {
    "sb1": "sb1-test-example-com.servicebus.windows.net",
    "sb2": "sb2-test-example-com.servicebus.windows.net",
}
ALIAS = "servicebus.test.example.com"


def seed_zone(server: DnsServer, ttl: int = 60) -> DnsServer:
    """The zones of the Service Bus federation guidance: sb1 and sb2 with SRV records for
    5671 (AMQP over TLS) and 443 (WebSockets), and the alias pointing at sb1."""
    for zone, host in SB_ZONES.items():
        records = [(1, 1, 5671, host), (2, 2, 443, host)]
        server.set_srv(f"_azure_servicebus._amqp.{zone}.test.example.com", records, ttl)
    server.set_cname(ALIAS, "sb1.test.example.com", ttl)
    return server
