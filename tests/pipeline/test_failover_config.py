"""The endpoint ``failover:`` block: what loads, what is refused (and how it is said), and
what ``build`` makes of it."""

from __future__ import annotations

from replication.failover import Failover
from replication.pipeline import json_schema, parse_pipelines

from .conftest import SETTINGS, problems

GOOD = """\
pipelines:
  - name: orders
    source:
      connection: PrimaryServiceBus
      queue: orders
      failover: {file: {path: /mnt/share/primary.txt}, failures: 2}
    target:
      connection: SecondaryServiceBus
      queue: orders
      failover:
        dns: {alias: servicebus.test.example.com, nameserver: "127.0.0.1:5353"}
        recheck_interval: 5
"""


def test_failover_blocks_load_and_build_failovers() -> None:
    settings = {**SETTINGS, "REPLICATION_FAILOVER_HOSTS": "sb1.example=127.0.0.1:5672"}
    (pipeline,) = parse_pipelines(GOOD, "pipelines.yaml", settings=settings).pipelines
    assert "failover file /mnt/share/primary.txt" in pipeline.describe()
    assert "failover dns servicebus.test.example.com" in pipeline.describe()
    built = pipeline.build(settings)
    target = built.targets[None]
    assert isinstance(target.failover, Failover)
    assert target.failover.name == "orders/target"
    assert target.failover.recheck_interval == 5
    assert target.failover.resolver.describe() == (
        "dns servicebus.test.example.com via 127.0.0.1:5353"
    )
    assert target.failover.connection_for("sb1.example").startswith(
        "Endpoint=sb://127.0.0.1:5672/;SharedAccessKeyName=k"
    )
    (source,) = built.source_failovers
    assert source is not None and (source.name, source.failures) == ("orders/source", 2)
    # the loop guard's identity is the configured namespace, whichever one is live
    assert built.task.source_namespace == "primary.example"


def test_the_default_nameserver_comes_from_the_settings() -> None:
    text = GOOD.replace(', nameserver: "127.0.0.1:5353"', "")
    settings = {**SETTINGS, "REPLICATION_DNS_NAMESERVER": "10.0.0.2"}
    (pipeline,) = parse_pipelines(text, "pipelines.yaml", settings=settings).pipelines
    failover = pipeline.build(settings).targets[None].failover
    assert failover is not None
    assert failover.resolver.describe() == "dns servicebus.test.example.com via 10.0.0.2:53"


def test_bad_failover_blocks_are_named() -> None:
    found = problems("""\
        pipelines:
          - name: a
            source:
              connection: PrimaryServiceBus
              queue: orders
              failover: {dns: {alias: sb.example.com}, file: {path: x}}
            target:
              connection: SecondaryServiceBus
              queue: orders
              failover: {dns: {alias: nodots, nameserver: "host:port"}}
          - name: b
            source: {connection: PrimaryServiceBus, queue: o, failover: {file: {url: "ftp://x"}}}
            target: {connection: SecondaryServiceBus, queue: o, failover: {dsn: {alias: a.b}}}
          - name: c
            source: {connection: PrimaryServiceBus, queue: o, failover: {}}
            target: {connection: SecondaryServiceBus, queue: o, failover: {static: "not a host"}}
    """)
    text = "\n".join(found)
    assert "pipelines[0].source.failover: give exactly one of 'dns', 'file' or 'static' " \
        "(got dns, file)" in text  # fmt: skip
    assert "pipelines[0].target.failover.dns.alias: 'nodots' is not a DNS name" in text
    assert "pipelines[0].target.failover.dns.nameserver:" in text
    assert "pipelines[1].source.failover.file: url 'ftp://x' must start with http://" in text
    assert "pipelines[1].target.failover.dsn: unknown property 'dsn' (did you mean 'dns'?)" \
        in text  # fmt: skip
    assert "pipelines[2].source.failover: give exactly one of 'dns', 'file' or 'static'" in text
    assert "pipelines[2].target.failover.static:" in text


def test_the_environment_settings_are_checked_with_settings() -> None:
    settings = {**SETTINGS, "REPLICATION_FAILOVER_HOSTS": "sb1.example",
                "REPLICATION_DNS_NAMESERVER": "dns.example:99999"}  # fmt: skip
    found = problems(GOOD, settings=settings)
    assert any("'REPLICATION_FAILOVER_HOSTS': host map entry 'sb1.example' is not "
               "host=address" in line for line in found)  # fmt: skip
    assert any("'REPLICATION_DNS_NAMESERVER'" in line for line in found)


def test_the_old_pipeline_level_failover_is_refused() -> None:
    found = problems("""\
        pipelines:
          - name: a
            source: {connection: PrimaryServiceBus, queue: o}
            target: {connection: SecondaryServiceBus, queue: o}
            failover: {}
    """)
    assert found == [
        "pipelines.yaml:5:5: pipelines[0].failover: 'failover' goes on an endpoint: give it under "
        "'source' (or each of 'sources') and/or 'target', e.g. target: {connection: ..., queue: "
        "..., failover: {dns: {alias: ...}}}"
    ]


def test_identity_based_sources_cannot_fail_over() -> None:
    (pipeline,) = parse_pipelines(GOOD, "pipelines.yaml").pipelines
    settings = {
        "PrimaryServiceBus__fullyQualifiedNamespace": "primary.servicebus.windows.net",
        "SecondaryServiceBus": SETTINGS["SecondaryServiceBus"],
    }
    try:
        pipeline.build(settings)
    except ValueError as exc:
        assert "failover needs a connection string in 'PrimaryServiceBus'" in str(exc)
    else:
        raise AssertionError("built")


def test_the_json_schema_describes_failover() -> None:
    schema = json_schema()
    text = str(schema)
    assert "FailoverSpec" in text and "recheck_interval" in text and "alias" in text
