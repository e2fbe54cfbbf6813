"""What every part of the app that talks to a Service Bus namespace shares, between the AMQP
engine (``replication.amqp``) and its users (tasks, Spark, the local host, failover, the
broker): connection strings, SAS tokens, the Service Bus symbols.

Nothing here imports the task library, the broker or an SDK.
"""
