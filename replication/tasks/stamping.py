"""The replication stamp: where a replica came from, appended on every hop.

``repl-enqueue-time`` is the source's enqueued time (ISO 8601 UTC with fraction and ``Z``)
and ``repl-sequence`` the source's sequence number; a message that already carries them
(it was replicated before) gets ``;`` and the new value appended, so the properties list
every hop in order. An event read from an event hub also gets ``repl-offset``, its offset
in its partition (the Event Hubs federation docs' stamp); once a message has it, every later
hop appends to it too (empty for a Service Bus hop, which has no offset), and the first
offset is put after one empty entry per earlier hop, so the n-th entry of each list is the
n-th hop. Everything else (identity, routing, user properties) is kept as is.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..messages import Message

ENQUEUE_TIME = "repl-enqueue-time"
SEQUENCE = "repl-sequence"
OFFSET = "repl-offset"
SEPARATOR = ";"


def iso_utc(moment: datetime) -> str:
    """``2026-11-23T10:15:30.1234560Z``: UTC, seven fraction digits as .NET writes them."""
    global _last_iso
    last, text = _last_iso
    if moment is last:  # the messages of a batch mostly share their enqueued time (2 µs)
        return text
    utc = moment
    if utc.tzinfo is not None and utc.utcoffset():
        utc = utc.astimezone(UTC)
    # isoformat, not strftime: faster, and it writes year 1 as 0001 (glibc's %Y gives "1")
    text = utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "0Z"
    _last_iso = (moment, text)
    return text


_last_iso: tuple[datetime | None, str] = (None, "")


def _append(current: object, value: str) -> str:
    if current is None or current == "":
        return value
    return f"{current}{SEPARATOR}{value}"


def stamp(message: Message, now: datetime | None = None) -> Message:
    """The message with this hop's stamp appended (``now`` stands in for a missing
    enqueued time, e.g. a message that was never on a broker)."""
    enqueued = message.enqueued_time or now or datetime.now(UTC)
    props = dict(message.application_properties)
    earlier = props.get(ENQUEUE_TIME)
    props[ENQUEUE_TIME] = _append(earlier, iso_utc(enqueued))
    sequence = "" if message.sequence_number is None else str(message.sequence_number)
    props[SEQUENCE] = _append(props.get(SEQUENCE), sequence)
    offsets = props.get(OFFSET)
    if message.offset is not None or offsets not in (None, ""):
        if offsets in (None, "") and earlier not in (None, ""):
            offsets = SEPARATOR * str(earlier).count(SEPARATOR)  # one empty entry per hop
            props[OFFSET] = f"{offsets}{SEPARATOR}{message.offset or ''}"
        else:
            props[OFFSET] = _append(offsets, message.offset or "")
    return message.with_properties(props)


def hops(message: Message) -> list[tuple[str, str]]:
    """The (enqueue time, sequence) pairs of every hop so far, oldest first."""
    times = str(message.application_properties.get(ENQUEUE_TIME) or "")
    sequences = str(message.application_properties.get(SEQUENCE) or "")
    if not times:
        return []
    time_list = times.split(SEPARATOR)
    seq_list = sequences.split(SEPARATOR) if sequences else []
    seq_list += [""] * (len(time_list) - len(seq_list))
    return list(zip(time_list, seq_list, strict=False))
