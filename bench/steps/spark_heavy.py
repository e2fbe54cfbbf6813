"""A heavy transformation for ``bench/spark.py``'s scaling runs: about a millisecond of CPU
per message, so the executors, not the broker, bound the throughput.

Each message gets a ``customer-pseudonym`` property: its ``customer`` property (else its
message-id) through PBKDF2-HMAC-SHA256 with ``ROUNDS`` rounds, the kind of keyed slow hash a
replica in another region uses so that it holds no personal data. Used as the callable of a
``transform`` step (``callable_takes: message``). Local runs import it from this folder on
PYTHONPATH; cluster runs ship it with ``spark-submit --py-files`` (executors) and have the
folder on the driver's PYTHONPATH too: the pipeline is parsed, and its callables imported,
in the driver's Python processes as well (the runner and Spark's planning process).
"""

from __future__ import annotations

import hashlib

from replication.messages import Message

ROUNDS = 4000
"""About 1 ms of one core per message (PBKDF2-HMAC-SHA256 in OpenSSL)."""
SALT = b"bench-spark-pseudonym-salt"


def pseudonymise(message: Message) -> list[Message]:
    props = dict(message.application_properties)
    customer = str(props.get("customer", message.message_id)).encode()
    props["customer-pseudonym"] = hashlib.pbkdf2_hmac("sha256", customer, SALT, ROUNDS).hex()
    return [message.copy(application_properties=props)]
