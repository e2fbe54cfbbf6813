"""One namespace as the dashboard sees it: its entities, and its messages through a client.

Everything goes through public seams, as any tool would: the entities and their counts
through the management API (``entities.py``), messages through the Service Bus client layer
(``servicebus``): peek (locks nothing), a peek-lock receiver on ``<entity>/$DeadLetterQueue``
to resubmit or delete dead letters, a sender for test messages.

Resubmitting is at least once: a dead letter is received under a lock, its copy is sent to
the entity it came from (a subscription's copy goes to its topic, which is the only way in:
the topic's rules decide which subscriptions get it), and only once the entity accepted the
copy is the dead letter completed. Messages received that were not asked for are released
(no delivery counted). The copy keeps the message's identity (message id, session id,
properties without the dead-letter reason and description); with duplicate detection on the
entity a copy with the message id of a message sent within the detection window is dropped
by the entity as a duplicate, so the caller may ask for new message ids instead.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..broker.auth import MANAGE
from ..messages import Message, PropertyValue
from ..servicebus.client import AmqpConnection, AmqpReceiver, AmqpSource, SourceError
from ..servicebus.management import Management
from ..servicebus.sas import mint
from ..servicebus.sender import AmqpSender
from ..tasks.stamping import hops
from ..tasks.task import PATH
from .entities import Entities

if TYPE_CHECKING:
    from ..broker.auth import Authorizer
    from ..broker.clock import Clock
    from ..broker.server import Broker
    from .entities import HttpApp

DEAD_LETTER_QUEUE = "$DeadLetterQueue"
DEAD_LETTER_PROPERTIES = ("DeadLetterReason", "DeadLetterErrorDescription")
MAX_PEEK = 500
MAX_SETTLE = 1000
"""Dead letters one resubmit or delete request acts on at most."""
RECEIVE_WAIT = 1.0
"""Seconds a resubmit or delete waits for more dead letters before it stops looking."""
SUBSCRIPTIONS = "/subscriptions/"


class DashboardError(Exception):
    """A request the dashboard cannot do as asked (HTTP ``status``; ``field``: the form's
    input it is about, if any)."""

    field: str | None = None

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_path(path: str) -> str:
    """A queue, topic or ``topic/Subscriptions/name`` (no sub-queue: that is ``dead_letter``)."""
    path = path.strip("/")
    if not path or DEAD_LETTER_QUEUE.lower() in path.lower() or "$management" in path.lower():
        raise DashboardError(f"entity {path!r}: name a queue, topic or topic/Subscriptions/name")
    return path


def resubmit_target(path: str) -> str:
    """Where a dead letter of ``path`` goes back to: the queue, or the subscription's topic."""
    lowered = path.lower()
    at = lowered.find(SUBSCRIPTIONS)
    return path[:at] if at >= 0 else path


def _value(value: PropertyValue) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime | timedelta | uuid.UUID):
        return str(value)
    return value


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def describe(message: Message) -> dict[str, Any]:
    """A message as JSON: system properties, application properties, body, and the hops its
    ``repl-*`` stamps say it travelled (oldest first)."""
    try:
        body, encoding = message.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(message.body).decode("ascii"), "base64"
    return {
        "sequence_number": message.sequence_number,
        "message_id": message.message_id,
        "session_id": message.session_id,
        "correlation_id": message.correlation_id,
        "subject": message.subject,
        "content_type": message.content_type,
        "to": message.to,
        "reply_to": message.reply_to,
        "partition_key": message.partition_key,
        "enqueued_time": _time(message.enqueued_time),
        "scheduled_enqueue_time": _time(message.scheduled_enqueue_time),
        "time_to_live": (
            None if message.time_to_live is None else message.time_to_live.total_seconds()
        ),
        "delivery_count": message.delivery_count,
        "locked_until": _time(message.locked_until),
        "dead_letter_reason": message.dead_letter_reason,
        "dead_letter_description": message.dead_letter_description,
        "dead_letter_source": message.dead_letter_source,
        "application_properties": {
            key: _value(value) for key, value in message.application_properties.items()
        },
        "hops": _hops(message),
        "body": body,
        "body_encoding": encoding,
        "size": len(message.body),
    }


def _hops(message: Message) -> list[dict[str, str | None]]:
    """Each hop of the stamps, with the namespace it left from (``repl-path``) when known."""
    path = str(message.application_properties.get(PATH) or "")
    namespaces = path.split(";") if path else []
    return [
        {
            "namespace": namespaces[i] if i < len(namespaces) else None,
            "enqueued_time": time,
            "sequence_number": sequence or None,
        }
        for i, (time, sequence) in enumerate(hops(message))
    ]


def resubmittable(message: Message, new_message_id: bool = False) -> Message:
    """The copy a resubmit sends: the message as it was sent, without what the broker added
    (delivery facts, the dead-letter reason and description)."""
    properties = {
        key: value
        for key, value in message.application_properties.items()
        if key not in DEAD_LETTER_PROPERTIES
    }
    return message.copy(
        message_id=str(uuid.uuid4()) if new_message_id else message.message_id,
        application_properties=properties,
        scheduled_enqueue_time=None,
        enqueued_time=None,
        sequence_number=None,
        delivery_count=None,
        locked_until=None,
        dead_letter_reason=None,
        dead_letter_description=None,
        dead_letter_source=None,
        target=None,
        source=None,
    )


@dataclass
class Namespace:
    """A namespace: ``name`` (the app setting naming it, or ``host:port``), its connection
    string, the management API app and the Manage rule that signs requests to it."""

    name: str
    connection_string: str
    host: str
    app: HttpApp
    """The broker's management API (``broker.http_app`` as it was before the dashboard)."""
    key_name: str
    key: str
    authorizer: Authorizer
    """The broker's ``Authorizer``: checks tokens of callers from off this machine."""
    clock: Clock | None = None
    _source: AmqpSource | None = field(default=None, repr=False)
    _management: tuple[AmqpConnection, Management] | None = field(default=None, repr=False)

    @classmethod
    def of_broker(cls, broker: Broker, name: str | None = None) -> Namespace:
        """The namespace an embedded broker serves (signed with its first Manage rule)."""
        rule = next((r for r in broker.authorizer.rules if MANAGE in r.rights), None)
        if rule is None:
            raise DashboardError(f"the broker on port {broker.port} has no Manage rule", 500)
        address = "localhost" if broker.host in ("", "0.0.0.0", "::") else broker.host
        host = f"[{address}]:{broker.port}" if ":" in address else f"{address}:{broker.port}"
        connection = (
            f"Endpoint=sb://{host};SharedAccessKeyName={rule.name};SharedAccessKey={rule.key};"
            "UseDevelopmentEmulator=true;"
        )
        return cls(
            name or host,
            connection,
            host,
            broker.http_app,
            rule.name,
            rule.key,
            broker.authorizer,
            broker.clock,
        )

    def token(self) -> str:
        return mint(f"sb://{self.host}", self.key_name, self.key)[0]

    @property
    def source(self) -> AmqpSource:
        if self._source is None:
            self._source = AmqpSource.from_connection_string(self.connection_string, timeout=15.0)
        return self._source

    async def close(self) -> None:
        if self._source is not None:
            await self._source.close()
        self._source, self._management = None, None

    async def management(self) -> Management:
        connection = await self.source.connection()
        if self._management is None or self._management[0] is not connection:
            self._management = (connection, Management(connection))
        return self._management[1]

    async def entities(self) -> dict[str, Any]:
        return await Entities(self.app, self.token).read()

    # ------------------------------------------------------------------ reading

    async def peek(
        self,
        path: str,
        *,
        dead_letter: bool = False,
        count: int = 20,
        from_sequence: int = 1,
        session_id: str | None = None,
    ) -> list[dict[str, Any]]:
        path = check_path(path)
        node = f"{path}/{DEAD_LETTER_QUEUE}" if dead_letter else path
        count = max(1, min(count, MAX_PEEK))
        management = await self.management()
        peeked = await management.peek(
            node, count, from_sequence_number=max(1, from_sequence), session_id=session_id
        )
        return [describe(m) for m in peeked]

    async def sessions(self, path: str) -> list[str]:
        """The sessions of a session entity that hold messages or state."""
        path = check_path(path)
        management = await self.management()
        found: list[str] = []
        while True:
            reply = await management.request(
                path,
                "com.microsoft:get-message-sessions",
                {
                    "last-updated-time": datetime.max,
                    "skip": len(found),
                    "top": 100,
                },
            )
            ids = [str(i) for i in reply.get("sessions-ids") or []]
            found += ids
            if len(ids) < 100:
                return found

    async def session_state(self, path: str, session_id: str) -> str | None:
        """A session's state (text, or base64 when not UTF-8); locks the session a moment,
        so a session a receiver holds answers with that error."""
        path = check_path(path)
        receiver = await self.source.receiver(path, session=True, session_id=session_id, prefetch=1)
        try:
            state = await (await self.management()).get_session_state(receiver)
        finally:
            await receiver.close()  # gives back what it prefetched, and the session
        if state is None:
            return None
        try:
            return state.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(state).decode("ascii")

    # ------------------------------------------------------------------ writing

    async def send(self, path: str, messages: Message | list[Message]) -> list[int]:
        """Sends ``messages``; those with a scheduled enqueue time are scheduled (through
        ``$management``, which answers with their sequence numbers: returned, to cancel)."""
        path = check_path(path)
        if SUBSCRIPTIONS in path.lower():
            raise DashboardError("send to a queue or topic, not to a subscription")
        batch = [messages] if isinstance(messages, Message) else messages
        scheduled = [m for m in batch if m.scheduled_enqueue_time is not None]
        now = [m for m in batch if m.scheduled_enqueue_time is None]
        numbers: list[int] = []
        management = await self.management()
        for message in scheduled:
            assert message.scheduled_enqueue_time is not None
            numbers += await management.schedule_messages(
                path, message, message.scheduled_enqueue_time
            )
        if now:
            sender = AmqpSender(self.source, path, timeout=15.0)
            try:
                for at in range(0, len(now), 100):
                    await sender.send_messages(now[at : at + 100])
            finally:
                await sender.close()
        return numbers

    async def receive(
        self, path: str, count: int, *, dead_letter: bool = False, session_id: str | None = None
    ) -> tuple[AmqpReceiver, list[Message]]:
        """Up to ``count`` messages of ``path`` under a peek-lock, and the receiver that
        holds their locks (of ``session_id``, or the next free session, on a session
        entity: pass ``session_id="*"`` for any)."""
        path = check_path(path)
        node = f"{path}/{DEAD_LETTER_QUEUE}" if dead_letter else path
        count = max(1, min(count, MAX_PEEK))
        if session_id:
            receiver = await self.source.receiver(
                node,
                prefetch=count,
                session=True,
                session_id=None if session_id == "*" else session_id,
                wait=RECEIVE_WAIT,
            )
        else:
            receiver = await self.source.receiver(node, prefetch=count)
        try:
            taken = await receiver.receive(count, RECEIVE_WAIT)
            while taken and len(taken) < count:
                more = await receiver.receive(count - len(taken), 0.2)
                if not more:
                    break
                taken += more
        except BaseException:
            await receiver.close()
            raise
        return receiver, taken

    async def receive_deferred(
        self, path: str, numbers: list[int], session_id: str | None = None
    ) -> tuple[Management, list[Message], AmqpReceiver | None]:
        """The deferred messages of ``path`` with these sequence numbers, locked (settled by
        lock token over ``$management``). Of a session entity, inside ``session_id``, as
        the SDKs' session receivers do it: the receiver returned holds the session (close
        it when they are settled; it gives back the one message it prefetched)."""
        path = check_path(path)
        management = await self.management()
        if session_id is None:
            return management, await management.receive_deferred_messages(path, numbers), None
        session = await self.source.receiver(path, session=True, session_id=session_id, prefetch=1)
        try:
            taken = await management.receive_deferred_messages(path, numbers, session=session)
        except BaseException:
            await session.close()
            raise
        return management, taken, session

    async def cancel_scheduled(self, path: str, numbers: list[int]) -> None:
        path = check_path(path)
        if SUBSCRIPTIONS in path.lower():
            raise DashboardError("scheduled messages are cancelled on their queue or topic")
        await (await self.management()).cancel_scheduled_messages(path, numbers)

    async def purge(self, path: str, *, dead_letter: bool) -> int:
        """Removes every message of ``path`` (or its dead-letter queue) there now: received
        and completed in batches until a receive comes back empty. How many went."""
        path = check_path(path)
        node = f"{path}/{DEAD_LETTER_QUEUE}" if dead_letter else path
        receiver = await self.source.receiver(node, prefetch=MAX_SETTLE)
        gone = 0
        try:
            while batch := await receiver.receive(MAX_SETTLE, RECEIVE_WAIT):
                gone += receiver.complete(batch)
        finally:
            await receiver.close()
        return gone

    async def resend(
        self,
        path: str,
        sequence_number: int,
        *,
        dead_letter: bool,
        changes: dict[str, Any],
        new_message_id: bool,
    ) -> Message:
        """Sends an edited copy of a message (peeked: the original stays where it is) to
        where a resubmit would: ``changes`` holds the fields to replace (body as text,
        application properties in full); the identity is kept unless ``new_message_id``."""
        peeked = await (await self.management()).peek(
            f"{check_path(path)}/{DEAD_LETTER_QUEUE}" if dead_letter else check_path(path),
            1,
            from_sequence_number=sequence_number,
        )
        if not peeked or peeked[0].sequence_number != sequence_number:
            raise DashboardError(f"no message #{sequence_number} in {path}", 404)
        copy = resubmittable(peeked[0], new_message_id)
        if "body" in changes:
            copy.body = changes.pop("body").encode("utf-8")
        for name, value in changes.items():
            setattr(copy, name, value)
        await self.send(resubmit_target(path), copy)
        return copy

    async def dead_letter_numbers(self, path: str) -> list[int]:
        """The sequence numbers in ``path``'s dead-letter queue now (at most ``MAX_SETTLE``)."""
        peeked = await self.peek(path, dead_letter=True, count=MAX_SETTLE)
        return [int(m["sequence_number"]) for m in peeked if m["sequence_number"] is not None]

    async def settle_dead_letters(
        self,
        path: str,
        sequence_numbers: Iterable[int],
        *,
        resubmit: bool,
        new_message_ids: bool = False,
    ) -> dict[str, Any]:
        """Resubmits (or deletes) the dead letters of ``path`` with these sequence numbers;
        returns what was done and which were not found (taken by another receiver, gone)."""
        path = check_path(path)
        wanted = set(sequence_numbers)
        if len(wanted) > MAX_SETTLE:
            raise DashboardError(f"at most {MAX_SETTLE} dead letters per request")
        done: list[int] = []
        target = resubmit_target(path)
        if not wanted:
            return {"done": [], "not_found": [], "target": target if resubmit else None}
        sender = AmqpSender(self.source, target, timeout=15.0) if resubmit else None
        receiver = await self.source.receiver(f"{path}/{DEAD_LETTER_QUEUE}", prefetch=50)
        held: list[Message] = []
        """Received and not completed: released at the end (no delivery counted)."""
        try:
            while wanted:
                batch = await receiver.receive(50, RECEIVE_WAIT)
                if not batch:
                    break
                held += batch
                for message in batch:
                    number = message.sequence_number
                    if number not in wanted:
                        continue
                    if sender is not None:  # the copy first: complete only once it is taken
                        await sender.send_messages(resubmittable(message, new_message_ids))
                    receiver.complete([message])
                    held = [m for m in held if m is not message]
                    wanted.discard(number)
                    done.append(number)
        except SourceError as exc:
            raise DashboardError(f"stopped after {len(done)}: {exc}", 502) from exc
        finally:
            if held and receiver.is_open:
                receiver.release(held)
            await receiver.close()
            if sender is not None:
                await sender.close()
        return {
            "done": sorted(done),
            "not_found": sorted(wanted),
            "target": target if resubmit else None,
        }
