"""``python -m replication drill``: a failover drill, run end to end, measured by message-id.

Topology (embedded, the default)::

    producer --(failover: DNS alias or file)--> primary broker  --[pipeline]-->  secondary
        |  steady rate, one message a send                         replicate      broker
        '-------------- after the flip or kill --------------------------------------^

- Two embedded brokers, each ``python -m replication broker`` in a process of its own, on
  ports from the OS, with the pipeline's entities (the same Config.json on both: the
  namespaces of a failover set are structurally identical).
- The replication: the chosen pipeline of ``pipelines.yaml`` (default
  ``orders-to-secondary``: queue ``orders``, sessions, primary -> secondary), run in this
  process with the task library's pump, as the local host runs a pipeline.
- The producer: sends to the pipeline's source queue through a failover-resolved target
  (``failover.Failover`` + ``SenderPool``, the client the pipelines use), resolved through a
  DNS alias served in-process (CNAME -> ``_azure_servicebus._amqp.`` SRV, as in Azure) or a
  text file, mapped onto the local brokers as ``REPLICATION_FAILOVER_HOSTS`` maps them.
- At ``flip_after`` seconds the drill flips the alias (or rewrites the file): mode ``flip``,
  the primary stays up and the producer follows at its next re-check; or, mode ``kill``,
  kills the primary's process (SIGKILL) and flips, as an operator would after an outage:
  the producer re-resolves on its errors.

With connection strings (``--primary``, ``--secondary``) the same code runs against two
namespaces the caller has: the drill writes the failover file, or runs the operator's
command (``--flip-command``) to flip a real alias; ``kill`` needs processes of its own.

The figures (``figures.py``) come from what the producer was told (which namespace
accepted which message-id, when) and what the secondary holds at the end (read by peeking
everything, ``inventory.py``): the recovery time, the recovery point, duplicates and the
replication lag before and after the flip.
"""
