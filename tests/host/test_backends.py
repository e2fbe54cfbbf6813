"""The local host's trigger over both receive backends (a pipeline's ``backend``: our AMQP
client or azure-servicebus): the generated functions replicate the same way whichever
receives. A replica keeps its identity and gets the stamp of the source delivery (and the
worker's stop closes the pipeline's senders), and sessions keep their order under
concurrency. (Dead-lettering, abandoning, lock renewal and
the settlement actions run over both in test_settlement.py.)"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from replication.host.trigger import HostOptions
from replication.tasks.stamping import ENQUEUE_TIME, SEQUENCE, iso_utc
from replication.tasks.targets import BACKENDS
from tests.broker.conftest import make_config, receive_all
from tests.waiting import until

from .support import pipeline_app, run_app, settled, stats

pytestmark = pytest.mark.timeout(120)


def test_the_backend_is_amqp_or_sdk() -> None:
    assert HostOptions().backend == "amqp"
    assert HostOptions(backend="sdk").backend == "sdk"
    with pytest.raises(ValueError, match="unknown receive backend 'uamqp'"):
        HostOptions(backend="uamqp")  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_replica_keeps_its_identity_and_gets_the_stamp(
    broker_factory: Any, backend: str
) -> None:
    broker = broker_factory(make_config({"in": {}, "out": {}}))
    settings = {"Bus": broker.connection_string}
    sent = ServiceBusMessage(
        b"\x00payload\xff", message_id="m-1", correlation_id="c-1", subject="orders",
        content_type="application/octet-stream", reply_to="replies", to="someone",
        time_to_live=timedelta(hours=1), partition_key="pk",
        application_properties={"region": "eu", "count": 7, "ratio": 0.5, "ok": True},
    )  # fmt: skip
    with broker.client() as client:
        with client.get_queue_sender("in") as sender:
            sender.send_messages(sent)
        with client.get_queue_receiver("in") as receiver:
            (source_view,) = receiver.peek_messages(max_message_count=1)
    text = f"""\
pipelines:
  - name: copy
    source: {{connection: Bus, queue: in}}
    target: {{connection: Bus, queue: out}}
    backend: {backend}
"""
    runners = await run_app(pipeline_app(text, settings), settings, until=settled(1))
    assert runners[0].options.backend == backend
    # the worker's stop closed the pipeline's sender too (it stayed open until the process
    # ended, and a broker stopping waited for its answer)
    await until(lambda: not broker.call(lambda: broker.broker.peers), "no connection left")
    assert stats(runners)["received"] == 1
    (copy,) = receive_all(broker, "out")
    assert broker.count("in") == 0
    assert b"".join(copy.body) == b"\x00payload\xff"
    assert (copy.message_id, copy.correlation_id, copy.subject) == ("m-1", "c-1", "orders")
    assert copy.content_type == "application/octet-stream"
    assert (copy.reply_to, copy.to, copy.partition_key) == ("replies", "someone", "pk")
    assert copy.time_to_live == timedelta(hours=1)
    props = {k.decode(): v for k, v in copy.application_properties.items()}
    assert props["region"] == b"eu" and props["count"] == 7 and props["ratio"] == 0.5
    assert props["ok"] is True
    assert props[ENQUEUE_TIME] == iso_utc(source_view.enqueued_time_utc).encode()
    assert props[SEQUENCE] == str(source_view.sequence_number).encode()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sessions_keep_their_order_under_concurrency(
    broker_factory: Any, backend: str
) -> None:
    """Four sessions, interleaved at the source, two taken at a time in batches of 5: each
    session's messages reach the target in the order they were sent, none twice."""
    session_queue = {"RequiresSession": True}
    broker = broker_factory(make_config({"in": session_queue, "out": session_queue}))
    settings = {"Bus": broker.connection_string}
    sessions, per_session = ["s0", "s1", "s2", "s3"], 25
    with broker.client() as client, client.get_queue_sender("in") as sender:
        sender.send_messages([
            ServiceBusMessage(f"{s}-{n}", message_id=f"{s}-{n}", session_id=s)
            for n in range(per_session) for s in sessions
        ])  # fmt: skip
    text = f"""\
pipelines:
  - name: ordered
    source: {{connection: Bus, queue: in, sessions: true}}
    target: {{connection: Bus, queue: out}}
    batch_size: 5
    concurrency: 2
    backend: {backend}
"""
    total = len(sessions) * per_session
    runners = await run_app(pipeline_app(text, settings), settings, until=settled(total))
    assert stats(runners)["received"] == total  # none came twice
    arrived: dict[str, list[int]] = defaultdict(list)
    for message_id in broker.message_ids("out"):
        session, n = str(message_id).split("-")
        arrived[session].append(int(n))
    assert dict(arrived) == {s: list(range(per_session)) for s in sessions}
