"""replication.deploy: the template's parameters and the app settings, from pipeline files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replication.deploy import (
    DeployConfigError,
    app_secret_names,
    bicep_parameters,
    required_app_settings,
)
from replication.pipeline import PipelineConfigError

from .support import EXAMPLE, ROOT


def write(tmp_path: Path, text: str, name: str = "pipelines.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def by_name(items: list[dict[str, Any]], namespace: str) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items if item["namespace"] == namespace}


ROUTER = """\
pipelines:
  - name: events-router
    source: {connection: PrimaryServiceBus, topic: events, subscription: router}
    steps:
      - transform: {on_error: route, drop: [internal]}
    routes:
      - when: "region = 'eu'"
        target: {connection: SecondaryServiceBus, queue: events-eu}
      - when: "region = 'us'"
        target: {connection: SecondaryServiceBus, topic: events-us}
    default: {connection: SecondaryServiceBus, queue: events-other}
    error_target: {connection: PrimaryServiceBus, queue: events-failed}
"""


def test_a_router_sends_to_every_route_default_and_error_target(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path, ROUTER))
    secondary = by_name(derived["queues"], "secondary")
    assert set(secondary) == {"events-eu", "events-other"}
    assert all(q["requiresDuplicateDetection"] for q in secondary.values())
    assert by_name(derived["topics"], "secondary")["events-us"]["requiresDuplicateDetection"]
    primary_queues = by_name(derived["queues"], "primary")
    assert primary_queues["events-failed"]["requiresDuplicateDetection"] is True
    assert by_name(derived["topics"], "primary")["events"]["requiresDuplicateDetection"] is False
    assert derived["subscriptions"] == [
        {"namespace": "primary", "topic": "events", "name": "router", "requiresSession": False}
    ]
    assert derived["connections"] == [
        {"name": "PrimaryServiceBus", "namespace": "primary", "listen": True, "send": True,
         "failover": False},  # the error target is sent to on the primary
        {"name": "SecondaryServiceBus", "namespace": "secondary", "listen": False, "send": True,
         "failover": False},
    ]  # fmt: skip
    assert derived["receivers"] == [
        {"connection": "PrimaryServiceBus", "namespace": "primary", "queue": "",
         "topic": "events", "subscription": "router"},
    ]  # fmt: skip
    assert derived["pipelineFile"] == "pipelines.yaml"
    assert "dnsZoneName" not in derived


def test_a_merge_reads_every_source(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path, """\
pipelines:
  - name: merge
    sources:
      - {connection: PrimaryServiceBus, queue: orders-eu}
      - {connection: SecondaryServiceBus, queue: orders-us}
    target: {connection: SecondaryServiceBus, queue: orders-all}
    loop_guard: true
"""))  # fmt: skip
    assert set(by_name(derived["queues"], "primary")) == {"orders-eu"}
    assert set(by_name(derived["queues"], "secondary")) == {"orders-us", "orders-all"}
    assert [(r["connection"], r["queue"]) for r in derived["receivers"]] == [
        ("PrimaryServiceBus", "orders-eu"), ("SecondaryServiceBus", "orders-us"),
    ]  # fmt: skip
    listen = {c["name"]: (c["listen"], c["send"]) for c in derived["connections"]}
    assert listen == {"PrimaryServiceBus": (True, False), "SecondaryServiceBus": (True, True)}


def test_sessions_where_read_and_where_only_session_sources_fill(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path, """\
pipelines:
  - name: orders
    source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
    steps:
      - validate: {json_schema: {type: object}, on_error: route}
    target: {connection: SecondaryServiceBus, queue: orders}
    error_target: {connection: SecondaryServiceBus, queue: orders-invalid}
  - name: mixed
    sources:
      - {connection: PrimaryServiceBus, topic: carts, subscription: copy, sessions: true}
      - {connection: PrimaryServiceBus, queue: carts-legacy}
    target: {connection: SecondaryServiceBus, queue: carts}
"""))  # fmt: skip
    primary = by_name(derived["queues"], "primary")
    secondary = by_name(derived["queues"], "secondary")
    assert primary["orders"]["requiresSession"] is True
    assert secondary["orders"]["requiresSession"] is True  # filled from sessions only
    assert secondary["orders-invalid"]["requiresSession"] is False  # an error target
    assert secondary["carts"]["requiresSession"] is False  # one source has no sessions
    assert primary["carts-legacy"]["requiresSession"] is False
    [subscription] = derived["subscriptions"]
    assert subscription == {"namespace": "primary", "topic": "carts", "name": "copy",
                            "requiresSession": True}  # fmt: skip


def test_a_reader_without_sessions_decides_for_a_filled_queue(tmp_path: Path) -> None:
    derived = bicep_parameters(write(tmp_path, """\
pipelines:
  - name: in
    source: {connection: PrimaryServiceBus, queue: a, sessions: true}
    target: {connection: PrimaryServiceBus, queue: b}
  - name: out
    source: {connection: PrimaryServiceBus, queue: b}
    target: {connection: SecondaryServiceBus, queue: b}
"""))  # fmt: skip
    assert by_name(derived["queues"], "primary")["b"]["requiresSession"] is False


def test_an_entity_read_with_and_without_sessions_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, """\
pipelines:
  - name: one
    source: {connection: PrimaryServiceBus, queue: orders, sessions: true}
    target: {connection: SecondaryServiceBus, queue: one}
  - name: two
    source: {connection: PrimaryServiceBus, queue: orders}
    target: {connection: SecondaryServiceBus, queue: two}
""")  # fmt: skip
    with pytest.raises(DeployConfigError, match=r"queue 'orders' is read with sessions by "
                       r"pipeline 'one' and without by 'two'"):  # fmt: skip
        bicep_parameters(path)


def test_an_unknown_connection_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, """\
pipelines:
  - name: archive
    source: {connection: PrimaryServiceBus, queue: orders}
    target: {connection: ArchiveServiceBus, queue: orders}
""")  # fmt: skip
    with pytest.raises(
        DeployConfigError,
        match=r"pipeline 'archive': connection 'ArchiveServiceBus' is not mapped .*"
        r"\(mapped: PrimaryServiceBus -> primary, ",
    ):
        bicep_parameters(path)
    derived = bicep_parameters(path, {"PrimaryServiceBus": "primary",
                                      "ArchiveServiceBus": "secondary"})  # fmt: skip
    assert [c["name"] for c in derived["connections"]] == ["ArchiveServiceBus",
                                                           "PrimaryServiceBus"]  # fmt: skip
    with pytest.raises(DeployConfigError, match="'tertiary'"):
        bicep_parameters(path, {"PrimaryServiceBus": "primary", "ArchiveServiceBus": "tertiary"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("source: {connection: PrimaryServiceBus, queue: eu/orders}\n"
         "    target: {connection: SecondaryServiceBus, queue: orders}",
         "cannot create names with '/'"),
        ("source: {connection: PrimaryServiceBus, queue: orders}\n"
         "    target: {connection: PrimaryServiceBus, topic: orders}",
         "'orders' is used as a queue and as a topic on the primary namespace"),
        ("source: {connection: Primary.Bus, queue: orders}\n"
         "    target: {connection: SecondaryServiceBus, queue: orders}",
         "'Primary.Bus' cannot be an app setting on Linux"),
    ],
)  # fmt: skip
def test_what_the_template_cannot_create_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, f"pipelines:\n  - name: p\n    {text}\n")
    mapping = {"PrimaryServiceBus": "primary", "SecondaryServiceBus": "secondary",
               "Primary.Bus": "primary"}  # fmt: skip
    with pytest.raises(DeployConfigError, match=message):
        bicep_parameters(path, mapping)


def test_failover_endpoints_are_on_both_namespaces_and_give_the_dns_names(
    tmp_path: Path,
) -> None:
    derived = bicep_parameters(write(tmp_path, """\
pipelines:
  - name: orders
    source:
      connection: PrimaryServiceBus
      queue: orders
      sessions: true
      failover: {dns: {alias: servicebus.test.example.com}}
    target:
      connection: SecondaryServiceBus
      queue: orders-replica
      failover: {dns: {alias: servicebus.test.example.com}}
"""))  # fmt: skip
    for namespace in ("primary", "secondary"):
        assert set(by_name(derived["queues"], namespace)) == {"orders", "orders-replica"}
    assert all(c["failover"] for c in derived["connections"])
    assert derived["dnsZoneName"] == "test.example.com"
    assert derived["dnsAliasName"] == "servicebus"


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        (("sb.one.example.com", "sb.two.example.com"), "several failover DNS aliases"),
        (("example.com", "example.com"), "a zone you can delegate"),
    ],
)
def test_dns_aliases_the_template_cannot_make_are_refused(
    tmp_path: Path, aliases: tuple[str, str], message: str
) -> None:
    source, target = ({"dns": {"alias": alias}} for alias in aliases)
    path = write(tmp_path, f"""\
pipelines:
  - name: orders
    source: {{connection: PrimaryServiceBus, queue: orders, failover: {json.dumps(source)}}}
    target: {{connection: SecondaryServiceBus, queue: copy, failover: {json.dumps(target)}}}
""")  # fmt: skip
    with pytest.raises(DeployConfigError, match=message):
        bicep_parameters(path)


def test_the_pipeline_file_path_is_relative_to_the_app_root(tmp_path: Path) -> None:
    path = write(tmp_path, ROUTER, name="config/pipelines.yaml")
    assert bicep_parameters(path, app_root=tmp_path)["pipelineFile"] == "config/pipelines.yaml"
    with pytest.raises(DeployConfigError, match="not inside the app root"):
        bicep_parameters(path, app_root=tmp_path / "elsewhere")


def test_an_invalid_pipeline_file_is_the_loaders_error(tmp_path: Path) -> None:
    path = write(tmp_path, "pipelines:\n  - name: p\n    source: {connection: X}\n")
    missing = r"pipelines\[0\]: required property 'target' \(or 'routes'\) is missing"
    with pytest.raises(PipelineConfigError, match=missing):
        bicep_parameters(path)
    with pytest.raises(PipelineConfigError, match=missing):
        required_app_settings(path)


# ---------------------------------------------------------------------- app settings

STEPS = """\
pipelines:
  - name: secure
    source: {connection: PrimaryServiceBus, queue: in}
    steps:
      - encrypt: {key_setting: ENC_KEY, key_id: k1}
      - enrich: {properties_from_settings: {region: REGION_NAME, site: SITE_NAME}}
      - sign: {key_setting: SIGN_KEY}
    target:
      connection: SecondaryServiceBus
      queue: out
      failover: {dns: {alias: servicebus.test.example.com}}
  - name: back
    source: {connection: SecondaryServiceBus, queue: out}
    steps:
      - decrypt: {keys: {k1: DEC_KEY_1, k2: DEC_KEY_2}}
      - verify: {keys: {a: VERIFY_A, b: VERIFY_B}, algorithm: ed25519}
    target: {connection: PrimaryServiceBus, queue: back}
"""


def test_required_settings_are_what_validate_settings_checks(tmp_path: Path) -> None:
    path = write(tmp_path, STEPS)
    # no REPLICATION_DNS_NAMESERVER for the failover target: Azure's resolver answers
    assert required_app_settings(path) == {
        "AzureWebJobsStorage", "REPLICATION_PIPELINES", "PrimaryServiceBus",
        "SecondaryServiceBus", "ENC_KEY", "REGION_NAME", "SITE_NAME", "SIGN_KEY", "DEC_KEY_1",
        "DEC_KEY_2", "VERIFY_A", "VERIFY_B",
    }  # fmt: skip
    assert app_secret_names(path) == [
        "DEC_KEY_1", "DEC_KEY_2", "ENC_KEY", "REGION_NAME", "SIGN_KEY", "SITE_NAME",
        "VERIFY_A", "VERIFY_B",
    ]  # fmt: skip


def test_the_repositorys_pipelines_need_their_connections() -> None:
    assert required_app_settings(ROOT / "pipelines.yaml") == {
        "AzureWebJobsStorage", "REPLICATION_PIPELINES", "PrimaryServiceBus",
        "SecondaryServiceBus", "SecondaryEventHubs",
    }  # fmt: skip


# ---------------------------------------------------------------------- the command


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication", "infra-parameters", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


def test_the_command_regenerates_the_example() -> None:
    result = run("pipelines.yaml", "--base", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert result.stderr == ""


def test_the_command_maps_connections_and_names_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, STEPS.replace("SecondaryServiceBus", "DrBus"))
    result = run(str(path), "--map", "DrBus=secondary")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["contentVersion"] == "1.0.0.0"
    connections = document["parameters"]["connections"]["value"]
    assert {c["name"]: c["namespace"] for c in connections} == {
        "DrBus": "secondary", "PrimaryServiceBus": "primary",
    }  # fmt: skip
    assert "ENC_KEY" in result.stderr and "appSecrets" in result.stderr
    failed = run(str(path))
    assert failed.returncode == 1
    assert "connection 'DrBus' is not mapped" in failed.stderr
