"""The names Service Bus adds to AMQP, once: the broker writes them and our client reads them.

Annotation keys of a received message (``x-opt-...``), link properties and filters of the
attach (``com.microsoft:...``), error conditions, and the nodes every namespace has.
"""

from __future__ import annotations

from .amqp.types import symbol

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
OFFSET = symbol("x-opt-offset")
"""Event Hubs: an event's offset in its partition (a string)."""

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
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
ENTITY_NOT_FOUND = "com.microsoft:entity-not-found"
ENTITY_ALREADY_EXISTS = "com.microsoft:entity-already-exists"
ENTITY_DISABLED = "com.microsoft:entity-disabled"
OPERATION_TIMEOUT = "com.microsoft:timeout"
NOT_FOUND = "amqp:not-found"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
TRANSACTION_UNKNOWN_ID = "amqp:transaction:unknown-id"
TRANSACTION_ROLLBACK = "amqp:transaction:rollback"
TRANSACTION_TIMEOUT = "amqp:transaction:timeout"

# ---------------------------------------------------------------------- $management

SERVER_TIMEOUT = "com.microsoft:server-timeout"
"""Application property of a request: how long (uint, ms) the service may take."""
ASSOCIATED_LINK_NAME = "associated-link-name"
"""Application property of a request about a receiver's messages or session: its link name."""

# Descriptor codes of the rule descriptions enumerate-rules answers with (as the .NET SDK
# defines them: the filters' codes have one hex digit fewer than the others, and the JS SDK
# matches on these same numbers).
RULE_DESCRIPTION_CODE = 0x0000013700000004
EMPTY_RULE_ACTION_CODE = 0x0000013700000005
SQL_RULE_ACTION_CODE = 0x0000013700000006
SQL_FILTER_CODE = 0x000001370000006
TRUE_FILTER_CODE = 0x000001370000007
FALSE_FILTER_CODE = 0x000001370000008
CORRELATION_FILTER_CODE = 0x000001370000009
