"""``transactional: true``: what it needs (a queue source, every target in the source's
namespace, no failover, backend amqp), checked when loading, and again when building with
the settings that say which namespace each connection is."""

from __future__ import annotations

import textwrap

import pytest

from replication.pipeline import PipelineConfigError, parse_pipelines

from .conftest import PRIMARY, SETTINGS, problems

ALSO_PRIMARY = {**SETTINGS, "AlsoPrimary": PRIMARY}


def test_a_transactional_pipeline_within_one_namespace_loads_and_builds() -> None:
    text = textwrap.dedent("""\
        pipelines:
          - name: orders
            source: {connection: PrimaryServiceBus, queue: orders}
            routes:
              - when: "region = 'eu'"
                target: {connection: AlsoPrimary, queue: eu-orders}
            default: {connection: PrimaryServiceBus, topic: other-orders}
            transactional: true
          - name: plain
            source: {connection: PrimaryServiceBus, queue: plain}
            target: {connection: SecondaryServiceBus, queue: plain}
    """)
    loaded = parse_pipelines(text, "pipelines.yaml", settings=ALSO_PRIMARY)
    transactional, plain = loaded.pipelines
    assert (transactional.transactional, plain.transactional) == (True, False)
    assert transactional.build(ALSO_PRIMARY).transaction_targets() == {
        "route:0": "eu-orders", "default": "other-orders",
    }  # fmt: skip
    assert plain.build(SETTINGS).transaction_targets() is None


def test_transactional_needs_the_amqp_backend_and_a_queue_source() -> None:
    assert problems("""\
        pipelines:
          - name: over-the-sdk
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: PrimaryServiceBus, queue: copies}
            backend: sdk
            transactional: true
          - name: from-a-subscription
            source: {connection: PrimaryServiceBus, topic: events, subscription: all}
            target: {connection: PrimaryServiceBus, queue: copies}
            transactional: true
    """) == [
        "pipelines.yaml:6:5: pipelines[0].transactional: transactional needs backend 'amqp': the "
        "transaction spans the source's receiver and the targets' senders on one connection, "
        "which azure-servicebus (backend 'sdk') cannot share or run a transaction on",
        "pipelines.yaml:8:5: pipelines[1].source: transactional needs a queue source: the copies "
        "are sent via the source entity in the same transaction as its completes, and a "
        "subscription cannot be sent through",
    ]


def test_a_target_on_another_namespace_is_refused() -> None:
    text = """\
        pipelines:
          - name: across
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: AlsoPrimary, queue: copies}
            error_target: {connection: SecondaryServiceBus, queue: errors}
            transactional: true
    """
    assert problems(text, settings=ALSO_PRIMARY) == [
        "pipelines.yaml:5:20: pipelines[0].error_target.connection: transactional: the target "
        "'errors' is on another namespace than the source ('SecondaryServiceBus' vs "
        "'PrimaryServiceBus'); a Service Bus transaction cannot span namespaces (put the "
        "target in the source's namespace, or drop transactional)"
    ]


def test_without_settings_the_build_finds_another_namespace() -> None:
    loaded = parse_pipelines(textwrap.dedent("""\
        pipelines:
          - name: across
            source: {connection: PrimaryServiceBus, queue: orders}
            target: {connection: SecondaryServiceBus, queue: copies}
            transactional: true
    """), "pipelines.yaml")  # fmt: skip
    with pytest.raises(PipelineConfigError, match=r"pipelines\[0\]\.target\.connection: "
                       r"transactional: the target 'copies' is on namespace "
                       r"'secondary\.example:5673', the source on 'primary\.example'"):  # fmt: skip
        loaded.pipelines[0].build(SETTINGS)


def test_transactional_pipelines_cannot_fail_over() -> None:
    assert problems("""\
        pipelines:
          - name: moving
            source:
              connection: PrimaryServiceBus
              queue: orders
              failover: {static: primary-2.example}
            target:
              connection: PrimaryServiceBus
              queue: copies
              failover: {static: primary-2.example}
            transactional: true
    """) == [
        "pipelines.yaml:6:7: pipelines[0].source.failover: transactional pipelines cannot fail "
        "over: a transaction and its targets are bound to the one namespace the source is on",
        "pipelines.yaml:10:7: pipelines[0].target.failover: transactional pipelines cannot fail "
        "over: a transaction and its targets are bound to the one namespace the source is on",
    ]
