"""What every part of the app that talks to a Service Bus namespace shares, between the AMQP
engine (``replication.amqp``) and its users (tasks, Spark, the local host, failover, the
broker): connection strings, SAS tokens, the Service Bus symbols.

Nothing here imports the task library or the broker. The SDK appears only where it is
the chosen backend (``sdk_source``: ``backend: sdk``) or the thing being read
(``Endpoint.from_client``).
"""
