"""The ``servicebus`` data source's options, read once and checked with clear errors.

Names follow Spark connector conventions (camelCase, like the Kafka and Event Hubs sources);
values arrive as strings. ``connection`` names an app setting / environment variable holding
the connection string (as pipelines and Functions bindings name connections), so a secret
never has to be written into a notebook; ``connectionString`` gives it directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class OptionError(ValueError):
    """A missing or malformed option (the message names it)."""


def connection_option(options: Mapping[str, str]) -> str:
    """The connection string of lower-cased ``options``: ``connectionString``, or the
    environment setting ``connection`` names (as Functions bindings name app settings)."""
    connection_string = options.get("connectionstring")
    if not connection_string and options.get("connection"):
        name = options["connection"]
        connection_string = os.environ.get(name)
        if not connection_string:
            raise OptionError(
                f"option 'connection' names the setting {name!r}, which is not set in the "
                "environment (or give 'connectionString')"
            )
    if not connection_string:
        raise OptionError("give option 'connectionString' (or 'connection': a setting name)")
    return connection_string


@dataclass(frozen=True, slots=True)
class Options:
    connection_string: str
    queue: str | None = None
    topic: str | None = None
    subscription: str | None = None
    sessions: bool = False
    max_messages_per_trigger: int = 5000
    receive_wait: float = 1.0
    prefetch: int = 500
    num_partitions: int = 2
    max_concurrent_sessions: int = 8
    lock_renew_interval: float = 20.0
    mode: str = "peek"
    max_messages: int = 10_000
    batch_size: int = 100
    receive_on: str = "executors"
    """Streaming: ``executors`` (each task receives its share and holds it until Spark has
    committed the micro-batch) or ``driver`` (the driver receives and ships the rows in the
    tasks: for networks where executors cannot reach the driver's commit service)."""
    commit_service_host: str | None = None
    """The address executors reach the driver's commit service at (default: see
    ``commits.service_host``)."""
    pipeline: tuple[str, str, str, str | None] | None = None
    """Writing a pipeline's planned rows: (file text, pipeline name, settings JSON, folder);
    each row's ``target`` column names the pipeline target it goes to."""

    @property
    def path(self) -> str:
        """What a receiver reads: the queue, or ``topic/Subscriptions/sub``."""
        if self.queue:
            return self.queue
        return f"{self.topic}/Subscriptions/{self.subscription}"

    @property
    def entity(self) -> str:
        """What a sender sends to: the queue or the topic."""
        return self.queue or self.topic or ""

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, reading: bool) -> Options:
        options = {str(k).lower(): v for k, v in raw.items()}
        if not reading and options.get("pipeline"):
            return cls._for_pipeline(options)
        connection_string = connection_option(options)
        if "endpoint=" not in connection_string.lower():
            raise OptionError("'connectionString' is not a Service Bus connection string")
        queue, topic, subscription = (
            options.get("queue"),
            options.get("topic"),
            options.get("subscription"),
        )
        if bool(queue) == bool(topic):
            raise OptionError("give option 'queue' or 'topic' (one of them)")
        if reading and topic and not subscription:
            raise OptionError(f"reading topic {topic!r} needs option 'subscription'")
        if not reading and subscription:
            raise OptionError("'subscription' is for reading: messages are sent to the topic")
        mode = options.get("mode", "peek").lower()
        if mode not in ("peek", "receive"):
            raise OptionError(f"option 'mode' is 'peek' or 'receive', not {mode!r}")
        receive_on = options.get("receiveon", "executors").lower()
        if receive_on not in ("executors", "driver"):
            raise OptionError(f"option 'receiveOn' is 'executors' or 'driver', not {receive_on!r}")
        return cls(
            connection_string=connection_string,
            queue=queue,
            topic=topic,
            subscription=subscription,
            sessions=_bool(options, "sessions"),
            max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", 5000),
            receive_wait=_float(options, "receiveWait", 1.0),
            prefetch=_int(options, "prefetch", 500),
            num_partitions=_int(options, "numPartitions", 2),
            max_concurrent_sessions=_int(options, "maxConcurrentSessions", 8),
            lock_renew_interval=_float(options, "lockRenewInterval", 20.0),
            mode=mode,
            max_messages=_int(options, "maxMessages", 10_000),
            batch_size=_int(options, "batchSize", 100),
            receive_on=receive_on,
            commit_service_host=options.get("commitservicehost") or None,
        )

    @classmethod
    def _for_pipeline(cls, options: Mapping[str, str]) -> Options:
        name = options.get("pipelinename")
        if not name:
            raise OptionError("option 'pipeline' needs 'pipelineName'")
        return cls(
            connection_string="",
            batch_size=_int(options, "batchSize", 100),
            pipeline=(
                options["pipeline"],
                name,
                options.get("settings", "{}"),
                options.get("pipelinedir"),
            ),
        )


def _bool(options: Mapping[str, str], key: str) -> bool:
    value = str(options.get(key.lower(), "false")).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {key!r} is true or false, not {value!r}")
    return value == "true"


def _int(options: Mapping[str, str], key: str, default: int) -> int:
    try:
        value = int(options.get(key.lower(), default))
    except ValueError:
        raise OptionError(f"option {key!r} must be a whole number") from None
    if value < 1:
        raise OptionError(f"option {key!r} must be at least 1")
    return value


def _float(options: Mapping[str, str], key: str, default: float) -> float:
    try:
        value = float(options.get(key.lower(), default))
    except ValueError:
        raise OptionError(f"option {key!r} must be a number of seconds") from None
    if value <= 0:
        raise OptionError(f"option {key!r} must be more than 0")
    return value
