"""The drill end to end on real brokers, its figures checked against what the brokers hold.

Each drill produces for 3 s at 40 msg/s into the sample pipeline ``orders-to-secondary``
(sessions, primary -> secondary) and fails over at 1.5 s. Afterwards the brokers are read
with the azure-servicebus SDK (the embedded ones started again over the data the drill left),
and every figure of its JSON is computed again from that: the recovery point as the set
difference of what the primary accepted and what the secondary holds, duplicates by
message-id, the lag from the stamps, the recovery time against the secondary's enqueued
times.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage

from replication.cli import main
from replication.drill.options import DrillOptions
from replication.drill.report import as_json
from replication.drill.run import broker_config, load_pipeline, run_drill
from tests.broker.conftest import REPO_ROOT, BrokerHandle, BrokerProcess

pytestmark = pytest.mark.timeout(240)

PIPELINES = REPO_ROOT / "pipelines.yaml"
QUICK = {"rate": 40.0, "duration": 3.0, "flip_after": 1.5, "recheck_interval": 0.3, "settle": 5.0}
"""A short drill: 120 messages, the flip halfway, a re-check every 0.3 s."""


@dataclass
class Held:
    """A message at a broker, as the SDK peeked it."""

    message_id: str
    enqueued_at: float
    source_enqueued_at: float | None


def peek_all(connection_string: str, report: dict[str, Any]) -> list[Held]:
    """Every message of the drill at ``orders``, session by session, with the SDK."""
    run_id = report["run_id"]
    held: list[Held] = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        for session in (f"drill-{run_id}-s{k}" for k in range(4)):
            with client.get_queue_receiver("orders", session_id=session) as receiver:
                start = 1
                while batch := receiver.peek_messages(100, sequence_number=start):
                    held += [as_held(m) for m in batch]
                    start = max(m.sequence_number or 0 for m in batch) + 1
    return [h for h in held if h.message_id.startswith(f"drill-{run_id}-")]


def as_held(message: ServiceBusReceivedMessage) -> Held:
    stamp = (message.application_properties or {}).get(b"repl-enqueue-time")
    source = None
    if stamp is not None:
        text = stamp.decode() if isinstance(stamp, bytes) else str(stamp)
        source = datetime.fromisoformat(text.split(";")[-1]).timestamp()
    assert message.enqueued_time_utc is not None
    return Held(str(message.message_id), message.enqueued_time_utc.timestamp(), source)


def check_against_brokers(
    report: dict[str, Any], secondary: list[Held], primary: list[Held] | None
) -> None:
    """Every figure of ``report`` again, from what the brokers hold."""
    figures, flip_at = report["figures"], report["flip"]["at"]
    by_primary, by_secondary = set(report["accepted"]["primary"]), report["accepted"]["secondary"]
    assert by_primary and by_secondary, "the drill did not produce on both sides"
    assert figures["produced"] == len(by_primary) + len(by_secondary) + len(report["unsent"])
    counts = Counter(h.message_id for h in secondary)
    assert figures["on_secondary"] == len(secondary)
    assert figures["distinct_on_secondary"] == len(counts)
    assert figures["duplicates"] == sum(n - 1 for n in counts.values())
    assert figures["duplicate_ids"] == sorted(i for i, n in counts.items() if n > 1)
    # the recovery point: accepted by the primary, not on the secondary
    assert figures["rpo_ids"] == sorted(by_primary - set(counts))
    assert figures["rpo_messages"] == len(figures["rpo_ids"])
    assert figures["lost_by_secondary"] == [] and set(by_secondary) <= set(counts)
    # copies and direct sends; the lag from the stamps, split at the flip
    stamped = [h for h in secondary if h.source_enqueued_at is not None]
    direct = [h for h in secondary if h.source_enqueued_at is None]
    assert (figures["replicated"], figures["sent_to_secondary"]) == (len(stamped), len(direct))
    for name, side in (("lag_before", True), ("lag_after", False)):
        lags = [
            h.enqueued_at - h.source_enqueued_at  # type: ignore[operator]
            for h in stamped
            if (h.enqueued_at < flip_at) == side
        ]
        expected = {"copies": len(lags), "p50": None, "max": None}
        if lags:
            expected.update(p50=statistics.median(lags), max=max(lags))
        assert figures[name] == pytest.approx(expected, abs=1e-6)
    # the recovery time: nothing reached the secondary directly before the flip, and the
    # first accept there is a message it holds, enqueued no earlier than RTO allows
    first = min(direct, key=lambda h: h.enqueued_at)
    assert first.enqueued_at >= flip_at - 0.001  # enqueued times are whole milliseconds
    assert figures["first_on_secondary"] in {h.message_id for h in direct}
    assert figures["rto"] >= first.enqueued_at - flip_at - 0.001
    if primary is not None:  # what the primary accepted is on one side or the other
        on_primary = {h.message_id for h in primary}
        assert set(figures["rpo_ids"]) <= on_primary
        assert by_primary <= on_primary | {h.message_id for h in stamped}


def restarted(broker_process: Callable[..., BrokerProcess], folder: Path) -> BrokerProcess:
    """A broker over the data a drill's embedded namespace left in ``folder``."""
    config = json.loads((folder / "Config.json").read_text())
    return broker_process(config, data_dir=folder / "data")


def test_a_kill_reports_what_the_brokers_hold(
    tmp_path: Path, broker_process: Callable[..., BrokerProcess]
) -> None:
    """The command a team runs: ``python -m replication drill --mode kill``, the primary's
    process killed at 1.5 s; the table on stdout, the figures in the JSON."""
    report_path, data = tmp_path / "drill.json", tmp_path / "drill"
    argv = [
        sys.executable,
        "-m",
        "replication",
        "drill",
        "--mode",
        "kill",
        "--rate",
        "40",
        "--duration",
        "3",
        "--flip-after",
        "1.5",
        "--recheck-interval",
        "0.3",
        "--settle",
        "5",
        "--pipelines",
        str(PIPELINES),
        "--data-dir",
        str(data),
        "--json",
        str(report_path),
    ]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert "recovery point (RPO)" in done.stdout and "primary killed" in done.stdout
    report = json.loads(report_path.read_text())
    assert report["mode"] == "kill"
    assert report["figures"]["rto"] is not None
    secondary = restarted(broker_process, data / "secondary")
    primary = restarted(broker_process, data / "primary")
    check_against_brokers(
        report,
        peek_all(secondary.connection_string, report),
        peek_all(primary.connection_string, report),
    )


async def test_a_cname_flip_reports_what_the_brokers_hold(
    tmp_path: Path, broker_process: Callable[..., BrokerProcess]
) -> None:
    """The alias flipped at 1.5 s with the primary up: the producer follows at its next
    re-check, and the replication drains what the primary still took meanwhile."""
    options = DrillOptions(
        mode="flip", via="dns", pipelines_file=PIPELINES, data_dir=tmp_path, **QUICK
    )
    report = as_json(await run_drill(options))
    assert report["failover_source"].startswith("dns servicebus.drill.invalid")
    figures = report["figures"]
    assert figures["rto"] <= 0.3 + 0.5 + 0.5  # a re-check, its wait, a send
    assert figures["rpo_messages"] == 0  # the primary stayed up: everything was replicated
    secondary = restarted(broker_process, tmp_path / "secondary")
    primary = restarted(broker_process, tmp_path / "primary")
    check_against_brokers(
        report,
        peek_all(secondary.connection_string, report),
        peek_all(primary.connection_string, report),
    )


async def test_a_file_flip_between_namespaces_given_by_connection_string(
    tmp_path: Path, broker_factory: Callable[..., BrokerHandle]
) -> None:
    """``--primary``/``--secondary`` (two brokers standing for namespaces of one's own) and
    ``--file``: the drill writes the primary's host into the file, flips it, and reads the
    secondary as it reads any namespace."""
    config = broker_config(load_pipeline(DrillOptions(pipelines_file=PIPELINES)))
    primary, secondary = broker_factory(config), broker_factory(config)
    share = tmp_path / "primary.txt"
    options = DrillOptions(
        mode="flip",
        pipelines_file=PIPELINES,
        primary=primary.connection_string,
        secondary=secondary.connection_string,
        file=str(share),
        **QUICK,
    )
    result = await run_drill(options)
    report = as_json(result)
    assert share.read_text() == f"localhost:{secondary.port}\n"
    assert (report["primary"], report["secondary"]) == (
        f"localhost:{primary.port}",
        f"localhost:{secondary.port}",
    )
    check_against_brokers(
        report,
        peek_all(secondary.connection_string, report),
        peek_all(primary.connection_string, report),
    )


async def test_a_kill_without_replication_loses_all_the_primary_took(
    tmp_path: Path, broker_process: Callable[..., BrokerProcess]
) -> None:
    """Nothing replicates (``--no-replicate``, via the file): the recovery point is every
    message the primary accepted, going back to the first send, and it is exactly what the
    killed primary holds when it comes back."""
    options = DrillOptions(
        mode="kill",
        via="file",
        replicate=False,
        pipelines_file=PIPELINES,
        data_dir=tmp_path,
        **QUICK,
    )
    result = await run_drill(options)
    report = as_json(result)
    figures = report["figures"]
    assert figures["rpo_ids"] == sorted(report["accepted"]["primary"])
    first_sent = min(a.sent_at for a in result.production.accepted)
    assert figures["rpo_seconds"] == pytest.approx(result.flip.at - first_sent)
    assert figures["rpo_seconds"] >= 1.4
    # all of it was behind at the kill, but what the primary took as it was killed
    after = figures["accepted_by_primary_after_flip"]
    assert figures["behind_at_flip"] == figures["rpo_messages"] - after
    assert figures["replicated"] == 0
    secondary = restarted(broker_process, tmp_path / "secondary")
    primary = restarted(broker_process, tmp_path / "primary")
    held_by_primary = peek_all(primary.connection_string, report)
    check_against_brokers(report, peek_all(secondary.connection_string, report), held_by_primary)
    assert sorted(h.message_id for h in held_by_primary) == figures["rpo_ids"]


def test_options_that_cannot_run_say_which_to_change(capsys: pytest.CaptureFixture[str]) -> None:
    connection = "Endpoint=sb://localhost:1/;SharedAccessKeyName=a;SharedAccessKey=b"
    assert main(["drill", "--primary", connection, "--secondary", connection, "--file", "x"]) == 2
    assert "--mode kill needs the embedded brokers" in capsys.readouterr().err
    assert main(["drill", "--flip-after", "40", "--duration", "30"]) == 2
    assert "--flip-after (40) must be between 0 and --duration (30)" in capsys.readouterr().err
