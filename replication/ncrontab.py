"""Timer schedules as Azure Functions writes them: NCRONTAB with seconds, or a TimeSpan.

``{second} {minute} {hour} {day} {month} {day-of-week}``, six fields (``*/30 * * * * *``:
every 30 seconds; ``0 */5 * * * *``: every five minutes), in UTC as the Functions host
reads them without ``WEBSITE_TIME_ZONE``. When both the day and the day of week are
restricted, a time must match both, as NCrontab (the host's library) has it. ``croniter``
computes the occurrences (with the seconds field first and days ANDed). A TimeSpan
``hh:mm:ss`` (what the host accepts on App Service plans) is a fixed interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from croniter import croniter


class ScheduleError(ValueError):
    """A schedule that is neither a six-field NCRONTAB expression nor a TimeSpan."""


class Schedule(Protocol):
    def next_after(self, moment: float) -> float:
        """The first occurrence after ``moment`` (Unix seconds), in Unix seconds."""
        ...


@dataclass(frozen=True, slots=True)
class Ncrontab:
    expression: str

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) != 6:
            raise ScheduleError(
                f"schedule {self.expression!r} has {len(fields)} field(s); an NCRONTAB "
                "schedule has six: {second} {minute} {hour} {day} {month} {day-of-week}, "
                "e.g. '*/30 * * * * *' (every 30 s) or '0 */5 * * * *' (every 5 min)"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=True):
            raise ScheduleError(f"schedule {self.expression!r} is not a valid NCRONTAB expression")

    def next_after(self, moment: float) -> float:
        start = datetime.fromtimestamp(moment, UTC)
        found = croniter(self.expression, start, second_at_beginning=True, day_or=False)
        return float(found.get_next(float))


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval (a TimeSpan schedule), counted from the previous occurrence."""

    seconds: float

    def next_after(self, moment: float) -> float:
        return moment + self.seconds


_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})$")


def parse_schedule(text: str) -> Schedule:
    """An NCRONTAB expression or a TimeSpan (``[d.]hh:mm:ss``); ``ScheduleError`` says what
    is wrong with anything else."""
    text = text.strip()
    span = _TIMESPAN.match(text)
    if span is not None:
        days, hours, minutes, seconds = (int(part or 0) for part in span.groups())
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        if total <= 0:
            raise ScheduleError(f"schedule {text!r}: a TimeSpan must be longer than 0")
        return Every(float(total))
    return Ncrontab(text)
