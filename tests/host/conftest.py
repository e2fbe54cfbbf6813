"""Host tests start their own brokers through ``python -m replication start``."""
