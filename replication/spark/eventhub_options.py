"""The ``eventhubs`` data source's options, read once and checked with clear errors.

Names and values follow the Azure Event Hubs Spark connector (azure-event-hubs-spark,
docs/PySpark/structured-streaming-pyspark.md) where they fit, without its ``eventhubs.``
prefix (which is accepted too): ``consumerGroup`` (default ``$Default``),
``startingPosition`` / ``startingPositions`` (per partition), ``endingPosition`` /
``endingPositions`` (batch reads), ``maxEventsPerTrigger`` (default 1,000 per partition),
``receiverTimeout``. A position is the connector's JSON, one of ``offset`` (``"-1"``: the
start of the stream, ``"@latest"``: its end), ``seqNo`` or ``enqueuedTime`` in use, with
``isInclusive``::

    {"offset": null, "seqNo": 100, "enqueuedTime": null, "isInclusive": true}

or, shorter, ``earliest`` / ``latest`` (as Spark's Kafka source says). ``startingPositions``
maps partitions to positions, keyed by the connector's ``{"ehName": ..., "partitionId": n}``
JSON or by the partition id. The connection is given as the ``servicebus`` source takes it:
``connection`` names an app setting / environment variable, ``connectionString`` (or the
connector's ``eventhubs.connectionString``) gives it; the event hub is ``eventHub`` or the
connection string's ``EntityPath``. From Spark's Kafka source: ``minPartitions`` (split
ranges so a micro-batch has at least that many tasks) and ``failOnDataLoss``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from .options import OptionError, _bool, _int, connection_option

PREFIX = "eventhubs."
PositionKind = Literal["earliest", "latest", "sequence", "enqueued", "offset"]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a read starts (or, for a batch read, ends)."""

    kind: PositionKind
    value: int | str | datetime | None = None
    inclusive: bool = True

    def describe(self) -> str:
        if self.kind in ("earliest", "latest"):
            return self.kind
        return f"{self.kind} {'>=' if self.inclusive else '>'} {self.value}"


EARLIEST = Position("earliest")
LATEST = Position("latest")


def parse_position(text: str, option: str) -> Position:
    """``earliest``, ``latest`` or the connector's JSON position."""
    word = text.strip()
    if word.lower() in ("earliest", "start"):
        return EARLIEST
    if word.lower() in ("latest", "end", "@latest"):
        return LATEST
    try:
        value = json.loads(word)
    except ValueError:
        raise OptionError(
            f"option {option!r} is 'earliest', 'latest' or a JSON position such as "
            '{"seqNo": 100, "isInclusive": true}, not ' + repr(text)
        ) from None
    return _position(value, option)


def _position(value: Any, option: str) -> Position:
    if not isinstance(value, dict):
        raise OptionError(f"option {option!r}: a position is a JSON object, not {value!r}")
    inclusive = value.get("isInclusive", True)
    if not isinstance(inclusive, bool):
        raise OptionError(f"option {option!r}: 'isInclusive' is true or false")
    offset, seq, enqueued = value.get("offset"), value.get("seqNo", -1), value.get("enqueuedTime")
    used = [
        name
        for name, given in (
            ("offset", offset is not None),
            ("seqNo", seq not in (None, -1)),
            ("enqueuedTime", enqueued is not None),
        )
        if given
    ]
    if len(used) != 1:
        raise OptionError(
            f"option {option!r}: give one of 'offset', 'seqNo' and 'enqueuedTime' "
            f"(the others null, seqNo -1), not {', '.join(used) or 'none'}"
        )
    if used == ["seqNo"]:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise OptionError(f"option {option!r}: 'seqNo' is a sequence number (0 or more)")
        return Position("sequence", seq, inclusive)
    if used == ["enqueuedTime"]:
        return Position("enqueued", _time(str(enqueued), option), inclusive)
    offset = str(offset).strip()
    if offset == "-1":
        return EARLIEST
    if offset.lower() == "@latest":
        return LATEST
    if not re.fullmatch(r"\d+", offset):
        raise OptionError(f"option {option!r}: 'offset' is a number, '-1' or '@latest'")
    return Position("offset", offset, inclusive)


def _time(text: str, option: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"option {option!r}: 'enqueuedTime' is a time such as 2026-01-31T12:00:00.000Z, "
            f"not {text!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_positions(text: str, option: str) -> dict[str, Position]:
    """The connector's per-partition map: keys ``{"ehName": ..., "partitionId": n}`` (as
    JSON text) or partition ids, values positions."""
    try:
        value = json.loads(text)
    except ValueError:
        raise OptionError(f"option {option!r} is a JSON object of positions") from None
    if not isinstance(value, dict):
        raise OptionError(f"option {option!r} is a JSON object of positions")
    out: dict[str, Position] = {}
    for key, position in value.items():
        partition = str(key)
        if partition.lstrip().startswith("{"):
            try:
                partition = str(json.loads(partition)["partitionId"])
            except (ValueError, KeyError, TypeError):
                raise OptionError(
                    f"option {option!r}: a key is a partition id or "
                    f'{{"ehName": ..., "partitionId": n}}, not {key!r}'
                ) from None
        out[partition] = (
            parse_position(position, option)
            if isinstance(position, str)
            else _position(position, option)
        )
    return out


def _seconds(options: Mapping[str, str], key: str, default: float) -> float:
    """Seconds, or an ISO 8601 duration (``PT60S``, ``PT1M``) as the connector takes it."""
    raw = str(options.get(key.lower(), default)).strip()
    match = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?", raw, re.IGNORECASE)
    try:
        if match and raw.upper() != "PT":
            hours, minutes, seconds = match.groups()
            value = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)
        else:
            value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise OptionError(f"option {key!r} is a number of seconds or a duration such as PT60S")
    return value


@dataclass(frozen=True, slots=True)
class EventHubOptions:
    connection_string: str
    event_hub: str
    consumer_group: str = "$Default"
    starting: Position = EARLIEST
    starting_per_partition: dict[str, Position] = field(default_factory=dict)
    ending: Position = LATEST
    ending_per_partition: dict[str, Position] = field(default_factory=dict)
    max_events_per_trigger: int | None = None
    """None: 1,000 per partition (the connector's default)."""
    min_partitions: int | None = None
    receiver_timeout: float = 60.0
    fail_on_data_loss: bool = True
    prefetch: int = 500

    @property
    def max_messages_per_trigger(self) -> int:
        return self.max_events_per_trigger or 1000

    def start_of(self, partition: str) -> Position:
        return self.starting_per_partition.get(partition, self.starting)

    def end_of(self, partition: str) -> Position:
        return self.ending_per_partition.get(partition, self.ending)

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> EventHubOptions:
        options = {str(k).lower().removeprefix(PREFIX): v for k, v in raw.items()}
        connection_string = connection_option(options)
        entity = _entity_path(connection_string)
        hub = options.get("eventhub") or entity
        if not hub:
            raise OptionError("give option 'eventHub' (or an EntityPath in the connection string)")
        if entity and hub.lower() != entity.lower():
            raise OptionError(
                f"option 'eventHub' is {hub!r} but the connection string's EntityPath is {entity!r}"
            )
        starting, ending = options.get("startingposition"), options.get("endingposition")
        per_start, per_end = options.get("startingpositions"), options.get("endingpositions")
        max_events = options.get("maxeventspertrigger")
        min_partitions = options.get("minpartitions")
        return cls(
            connection_string=connection_string,
            event_hub=hub,
            consumer_group=options.get("consumergroup") or "$Default",
            starting=parse_position(starting, "startingPosition") if starting else EARLIEST,
            starting_per_partition=(
                parse_positions(per_start, "startingPositions") if per_start else {}
            ),
            ending=parse_position(ending, "endingPosition") if ending else LATEST,
            ending_per_partition=parse_positions(per_end, "endingPositions") if per_end else {},
            max_events_per_trigger=(
                _int(options, "maxEventsPerTrigger", 1) if max_events is not None else None
            ),
            min_partitions=(
                _int(options, "minPartitions", 1) if min_partitions is not None else None
            ),
            receiver_timeout=_seconds(options, "receiverTimeout", 60.0),
            fail_on_data_loss=_bool(
                {"failondataloss": options.get("failondataloss", "true")}, "failOnDataLoss"
            ),
            prefetch=_int(options, "prefetch", 500),
        )


def _entity_path(connection_string: str) -> str | None:
    if "endpoint=" not in connection_string.lower():
        raise OptionError("'connectionString' is not an Event Hubs connection string")
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "entitypath" and value.strip():
            return value.strip()
    return None
