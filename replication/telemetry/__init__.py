"""What the app reports about itself: instruments that keep their values (``instruments``),
replication lag aggregated where it is measured (``lag``), and where it all goes
(``export``: Azure Monitor, OTLP; ``prometheus``: ``/metrics``; ``producer``: the lag
histogram for each exporter; ``tracing``: a span per replicated batch). ``replication.metrics``
holds the app's instruments themselves."""
