"""The names Service Bus adds to AMQP, once: the broker writes them and our client reads them.

Annotation keys of a received message (``x-opt-...``), link properties and filters of the
attach (``com.microsoft:...``), error conditions, and the nodes every namespace has.
"""

from __future__ import annotations

from ..amqp.types import symbol

# ---------------------------------------------------------------------- nodes

CBS_NODE = "$cbs"
MANAGEMENT_SUFFIX = "/$management"
SAS_TOKEN_TYPE = "servicebus.windows.net:sastoken"
JWT_TOKEN_TYPE = "jwt"

# ---------------------------------------------------------------------- message annotations

SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")
LOCKED_UNTIL = symbol("x-opt-locked-until")
LOCK_TOKEN = symbol("x-opt-lock-token")
PARTITION_KEY = symbol("x-opt-partition-key")
SCHEDULED_ENQUEUE_TIME = symbol("x-opt-scheduled-enqueue-time")
MESSAGE_STATE = symbol("x-opt-message-state")
DEAD_LETTER_SOURCE = symbol("x-opt-deadletter-source")
ENQUEUE_SEQUENCE_NUMBER = symbol("x-opt-enqueue-sequence-number")

# ---------------------------------------------------------------------- dead-lettering

DEAD_LETTER_REASON = symbol("DeadLetterReason")
DEAD_LETTER_DESCRIPTION = symbol("DeadLetterErrorDescription")
"""Keys of the info map (``fields``: symbol keys) of a rejected outcome that asks for
dead-lettering; the dead-lettered message carries them as application properties (string
keys: use ``str()`` there)."""

# ---------------------------------------------------------------------- attach

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
TIMEOUT = symbol("com.microsoft:timeout")
TRANSFER_DESTINATION = symbol("com.microsoft:transfer-destination-address")

# ---------------------------------------------------------------------- error conditions

DEAD_LETTER = "com.microsoft:dead-letter"
MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
ENTITY_DISABLED = "com.microsoft:entity-disabled"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
