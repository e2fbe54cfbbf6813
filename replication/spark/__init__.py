"""Spark: the ``servicebus`` PySpark data source and the pipeline runner on Structured Streaming.

``register(spark)`` makes ``spark.read/readStream/write/writeStream.format("servicebus")``
available in that session (see ``source.py`` for options and guarantees),
``spark.read/readStream.format("eventhubs")`` (``eventhub_source.py``), and the pipeline
runner's ``readStream.format("servicebus-pipeline")`` (``pipeline_source.py``) and
``"eventhubs-pipeline"`` (``eventhub_pipeline.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    from .eventhub_pipeline import EventHubPipelineDataSource
    from .eventhub_source import EventHubsDataSource
    from .pipeline_source import PipelineDataSource
    from .source import ServiceBusDataSource

    spark.dataSource.register(ServiceBusDataSource)
    spark.dataSource.register(EventHubsDataSource)
    spark.dataSource.register(PipelineDataSource)
    spark.dataSource.register(EventHubPipelineDataSource)


__all__ = ["register"]
