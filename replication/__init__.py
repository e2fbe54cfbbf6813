"""Replication and federation for Azure Service Bus, with an embedded AMQP 1.0 core."""

from . import native as native  # first: picks the compiled hot path or its sources

__version__ = "0.1.0"
