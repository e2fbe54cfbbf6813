"""The replication task library: stamping, editor steps, routers, session-ordered sending.

Runner-independent: the same code runs in Azure Functions, the local host and Spark. It
imports ``replication.messages`` and ``replication.sqlfilter`` and nothing of a runner.
"""
