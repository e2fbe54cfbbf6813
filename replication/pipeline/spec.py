"""The pipeline file as written: its pydantic models, value rules and target names.

See ``replication/pipeline/README.md`` for the file format. In short::

    pipelines:
      - name: orders-to-secondary
        source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
        steps:
          - filter: {condition: "region = 'eu'"}
        target: {connection: SecondaryServiceBus, queue: orders}

These models check each value and the shape of an item; ``check.py`` checks what spans
items and fields (and the steps' options) and turns a valid item into a ``Pipeline``
(``model.py``); ``schema.py`` exports the JSON Schema from the same models.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..failover import FailoverSpec
from ..tasks.facts import compile_condition

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
MAX_NAME_LENGTH = 100
MAX_ENTITY_NAME_LENGTH = 260
MAX_SUBSCRIPTION_NAME_LENGTH = 50
MAX_EVENT_HUB_NAME_LENGTH = 256
MAX_CONSUMER_GROUP_NAME_LENGTH = 50
DEFAULT_CONSUMER_GROUP = "$Default"

# ---------------------------------------------------------------------- target names

TARGET_KEY = None
DEFAULT_KEY = "default"
ERROR_TARGET_KEY = "error_target"


def route_key(index: int) -> str:
    return f"route:{index}"


def step_error_target_key(index: int) -> str:
    return f"error_target:{index}"


# ---------------------------------------------------------------------- value checks

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def _entity_name(name: str) -> str:
    """Queue and topic names: up to 260 characters, '/'-separated segments of letters,
    digits, '.', '-' and '_' (Service Bus's rules)."""
    if not name:
        raise ValueError("must not be empty")
    if len(name) > MAX_ENTITY_NAME_LENGTH:
        raise ValueError(f"{name[:40]!r}... is {len(name)} characters; at most 260 are allowed")
    segments = name.split("/")
    if any(not s for s in segments):
        raise ValueError(f"{name!r} has an empty path segment (or starts or ends with '/')")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"{name!r} has characters other than letters, digits, '.', '-', '_' and '/'"
            )
    return name


def _subscription_name(name: str) -> str:
    if not name:
        raise ValueError("must not be empty")
    if len(name) > MAX_SUBSCRIPTION_NAME_LENGTH or not _SEGMENT.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a subscription name: 1-50 letters, digits, '.', '-' and '_'"
        )
    return name


_HUB_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _event_hub_name(name: str) -> str:
    """Event hub names: 1-256 letters, digits, '.', '-' and '_', starting and ending with a
    letter or digit (Event Hubs' rules)."""
    if len(name) > MAX_EVENT_HUB_NAME_LENGTH or not _HUB_NAME.fullmatch(name):
        raise ValueError(
            f"{name[:60]!r} is not an event hub name: 1-256 letters, digits, '.', '-' and '_', "
            "starting and ending with a letter or digit"
        )
    return name


def _consumer_group_name(name: str) -> str:
    if name == DEFAULT_CONSUMER_GROUP:
        return name
    if len(name) > MAX_CONSUMER_GROUP_NAME_LENGTH or not _HUB_NAME.fullmatch(name):
        raise ValueError(
            f"{name[:60]!r} is not a consumer group name: '$Default', or 1-50 letters, digits, "
            "'.', '-' and '_', starting and ending with a letter or digit"
        )
    return name


def _setting_name(name: str) -> str:
    if not name.strip():
        raise ValueError("must name the app setting that holds the connection string")
    if "endpoint=" in name.lower() or ";" in name:
        raise ValueError(
            "give the NAME of the app setting that holds the connection string, not the "
            "connection string itself (keep secrets out of this file)"
        )
    if any(c.isspace() for c in name):
        raise ValueError(f"{name!r} is not an app setting name (it contains whitespace)")
    return name


def _pipeline_name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name) or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{name!r} is not a valid pipeline name: a letter, then letters, digits, '-' or "
            f"'_', at most {MAX_NAME_LENGTH} characters"
        )
    return name


def _condition(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    try:
        compile_condition(text)
    except (ValueError, TypeError) as exc:  # SqlSyntaxError is a ValueError
        raise ValueError(f"invalid condition: {exc}") from None
    return text


EntityName = Annotated[str, AfterValidator(_entity_name)]
SubscriptionName = Annotated[str, AfterValidator(_subscription_name)]
EventHubName = Annotated[str, AfterValidator(_event_hub_name)]
ConsumerGroupName = Annotated[str, AfterValidator(_consumer_group_name)]
SettingName = Annotated[str, AfterValidator(_setting_name)]
PipelineName = Annotated[
    str,
    AfterValidator(_pipeline_name),
    Field(json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}),
]
Condition = Annotated[str, AfterValidator(_condition)]


# ---------------------------------------------------------------------- endpoints


class Endpoint(BaseModel):
    """A queue, or a topic (+ subscription when read from), or an event hub (+ consumer
    group when read from), in the namespace whose connection string the app setting
    ``connection`` holds."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "anyOf": [
                {"required": ["queue"]},
                {"required": ["topic"]},
                {"required": ["eventhub"]},
            ]
        },
    )

    connection: SettingName = Field(
        description="Name of the app setting holding the namespace's connection string "
        "(as Functions bindings name connections)."
    )
    queue: EntityName | None = None
    topic: EntityName | None = None
    subscription: SubscriptionName | None = Field(
        None, description="The subscription of `topic` to read (sources only)."
    )
    sessions: bool = Field(
        False,
        description="Service Bus sources only: the entity requires sessions (session trigger).",
    )
    eventhub: EventHubName | None = Field(
        None,
        description="An event hub (Event Hubs) instead of a queue or topic; the "
        "connection is then an Event Hubs namespace's connection string.",
    )
    consumer_group: ConsumerGroupName | None = Field(
        None,
        description="Event hub sources only: the consumer group read (default "
        "`$Default`), as the Event Hubs trigger's consumerGroup.",
    )
    session_id_from: Literal["partition_key"] | None = Field(
        None,
        description="Event hub sources only: `partition_key` gives each event its "
        "partition key as its session id, so a session-enabled Service Bus target gets each "
        "key's events as one session, in order.",
    )
    failover: FailoverSpec | None = Field(
        None,
        description="Resolve the namespace at run time (DNS alias, file or URL) and "
        "switch when it changes; the connection's keys are used on every namespace.",
    )

    @property
    def entity(self) -> str:
        """The queue, topic or event hub: what a target sends to, what a source reads (with
        the subscription, for a topic; with the consumer group, for an event hub)."""
        return self.queue or self.topic or self.eventhub or ""

    @property
    def is_subscription(self) -> bool:
        return self.subscription is not None

    @property
    def is_event_hub(self) -> bool:
        return self.eventhub is not None

    @property
    def group(self) -> str:
        """The consumer group an event hub source reads (``$Default`` unless given)."""
        return self.consumer_group or DEFAULT_CONSUMER_GROUP

    def describe(self) -> str:
        if self.queue:
            what = f"queue {self.queue}"
        elif self.eventhub:
            what = f"event hub {self.eventhub}"
            if self.consumer_group:
                what += f" consumer group {self.consumer_group}"
        else:
            what = f"topic {self.topic}"
            if self.subscription:
                what += f" subscription {self.subscription}"
        flags = ", sessions" if self.sessions else ""
        if self.failover is not None:
            flags += f", failover {self.failover.describe()}"
        return f"{what} ({self.connection}{flags})"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouteSpec(_Spec):
    when: Condition = Field(description="SQL filter condition; `body.` names read JSON fields.")
    target: Endpoint


class PipelineSpec(_Spec):
    """One pipeline as written in the file (before normalisation)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["source"]}, {"required": ["sources"]}]},
                {"oneOf": [{"required": ["target"]}, {"required": ["routes"]}]},
            ]
        }
    )

    name: PipelineName
    description: str | None = None
    source: Endpoint | None = None
    sources: Annotated[list[Endpoint], Field(min_length=1)] | None = Field(
        None, description="Several sources (merge), one target."
    )
    steps: list[Any] = Field(
        default_factory=list,
        description="Editor steps in order; each a one-key mapping: step name -> options.",
    )
    target: Endpoint | None = None
    routes: Annotated[list[RouteSpec], Field(min_length=1)] | None = None
    default: Endpoint | None = Field(None, description="Where messages no route takes go.")
    unmatched: Literal["drop", "dead-letter"] | None = Field(
        None, description="What happens to messages no route takes (no default); dead-letter."
    )
    route_mode: Literal["first", "all"] | None = Field(
        None, description="first: the first matching route (default); all: every match."
    )
    error_target: Endpoint | None = Field(
        None, description="Where steps with `on_error: route` send failed messages."
    )
    loop_guard: bool = Field(
        False, description="Drop messages that already passed the target namespace (merge)."
    )
    batch_size: int = Field(100, ge=1, description="maxMessageBatchSize of the trigger.")
    concurrency: int | None = Field(
        None,
        ge=1,
        description="Batches the local host handles at once: maxConcurrentCalls (at most 4), or "
        "maxConcurrentSessions with sessions. In Azure the Service Bus extension runs a batch "
        "function, as every generated one is, one batch (one session) at a time per instance, "
        "and scales out by instances ([The local host](local-host.md#concurrency)).",
    )
    backend: Literal["amqp", "sdk"] = Field(
        "amqp",
        description="How the app talks to Service Bus: amqp, its own AMQP client (the "
        "default, faster), or sdk, azure-servicebus (azure-eventhub for event hub targets). It "
        "picks how the targets are sent to, "
        "and how the local host (`python -m replication start`) receives from the sources; "
        "in Azure the Functions host receives. sdk keeps the same semantics, except that "
        "each message is settled with its own call (no ranged settlement), a message given "
        "back without a delivery counted goes back with its session when the receiver "
        "closes but a plain (not session) receiver can only abandon it (a delivery counted), "
        "abandon and defer cannot change properties (dropped, with a warning), and locks of "
        "prefetched messages are not renewed (a session lock covers them).",
    )
    transactional: bool = Field(
        False,
        description="Send each batch's copies and complete its source messages in one "
        "Service Bus transaction: a crash between the sends and the completes leaves "
        "neither (no duplicate at a target), and a batch whose copy a target refused is "
        "rolled back whole (the failed message abandoned, the others released). The copies "
        "go via the source queue (send-via), so the source must be a queue and every "
        "target (routes, default and error targets too) an entity of the source's "
        "namespace, without failover, and no event hub anywhere; backend amqp only. Runs "
        "where the app receives "
        "itself: the local host (`python -m replication start`) runs its sources with the "
        "task pump (`replication.tasks.pump`) instead of as functions. Azure Functions "
        "cannot run it (the Functions host settles on its own connection, outside the "
        "transaction): `register_pipelines` and `python -m replication package` refuse it, "
        "and `validate` warns.",
    )


class FileSpec(_Spec):
    """The whole file (used for the JSON Schema; loading validates item by item)."""

    schema_: str | None = Field(None, alias="$schema")
    pipelines: Annotated[list[PipelineSpec], Field(min_length=1)]
