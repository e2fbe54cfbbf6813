"""A ``transform`` callable for the Spark tests: kills its Python worker once, on a marked
message, as a crash would (no exception, no cleanup, the connection just drops)."""

from __future__ import annotations

import os
from pathlib import Path

from replication.messages import Message

MARKER = "REPLICATION_TEST_CRASH_MARKER"
"""The environment variable naming the file that says the crash happened already."""


def crash_once(message: Message) -> Message:
    marker = os.environ.get(MARKER)
    if marker and message.application_properties.get("crash") and not Path(marker).exists():
        Path(marker).write_text(str(message.message_id))
        os._exit(17)
    return message
