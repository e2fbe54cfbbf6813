"""Replication and federation for Azure Service Bus, with an embedded AMQP 1.0 core."""

__version__ = "0.1.0"
