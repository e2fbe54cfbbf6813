"""The AMQP errors the broker gives, written as Service Bus writes them.

Service Bus ends every error description with a tracking id and the time
(``... TrackingId:<id>_G<n>, SystemTracker:<namespace>:<entity>, Timestamp:<UTC>``), which
people quote to support and search their logs for. Ours carry a tracking id and the time
too, so errors can be matched between a client's log and the broker's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import ClassVar

from ..amqp.performatives import Error
from ..amqp.types import symbol


def tracked(description: str, clock: Callable[[], float] = time.time) -> str:
    """``description`` with a new tracking id and the time (UTC, seconds)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock()))
    return f"{description} TrackingId:{uuid.uuid4().hex}_G0, Timestamp:{stamp}"


def error(condition: str, description: str) -> Error:
    """An AMQP error with ``condition`` and a tracked description."""
    return Error(condition=symbol(condition), description=tracked(description))


class SendRefusedError(Exception):
    """A send the entity refuses whole: nothing of it is stored. ``condition`` is the AMQP
    error a sender's transfer is rejected with, ``status`` the ``$management`` reply's."""

    condition: ClassVar[str] = "amqp:not-allowed"
    status: ClassVar[int] = 400


class QuotaExceededError(SendRefusedError):
    """The entity holds its ``MaxSizeInMegabytes``: the SDKs raise
    ``ServiceBusQuotaExceededError`` (Python) / ``QuotaExceeded`` (JavaScript) for this."""

    condition: ClassVar[str] = "amqp:resource-limit-exceeded"
    status: ClassVar[int] = 403


class SessionRequiredError(SendRefusedError):
    """A message without a session id is sent straight to a session-enabled queue (a
    topic takes it: its session-enabled subscriptions dead-letter their copies)."""
