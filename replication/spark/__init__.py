"""Spark: the ``servicebus`` PySpark data source and the pipeline runner on Structured Streaming.

``register(spark)`` makes ``spark.read/readStream/write/writeStream.format("servicebus")``
available in that session (see ``source.py`` for options and guarantees), and the pipeline
runner's ``readStream.format("servicebus-pipeline")`` (``pipeline_source.py``).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    from .pipeline_source import PipelineDataSource
    from .source import ServiceBusDataSource

    spark.dataSource.register(ServiceBusDataSource)
    spark.dataSource.register(PipelineDataSource)


__all__ = ["register"]
