"""infra/*.bicep read as the pipeline file needs them: parsed with pycep (checkov's parser; no
Bicep CLI can be downloaded here) and evaluated with the example parameters
(bicep_eval.py): app settings, access rules, entities, outputs, and DNS records that the
project's own resolver follows to the right namespace."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from lark import Token, Tree

from replication.deploy import APP_SETTINGS, bicep_parameters, required_app_settings
from replication.deploy.parameters import parameters_file
from replication.failover.dns import DnsResolver
from tests.failover.dns_server import DnsServer

from .bicep_eval import Template, Unknown, Unsupported, pycep
from .support import (
    EXAMPLE,
    INFRA,
    ROOT,
    app_settings,
    bicep_files,
    deployment,
    example_parameters,
    only,
)

PIPELINES = ROOT / "pipelines.yaml"
FLEX_REFUSES = {
    "FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "WEBSITE_CONTENTSHARE",
}  # fmt: skip


@pytest.mark.parametrize("path", list(bicep_files()), ids=lambda p: p.name)
def test_every_template_parses_with_pycep(path: Path) -> None:
    parsed = pycep().parse(file_path=path)
    assert parsed.get("resources") or parsed.get("modules")


def test_main_uses_every_module() -> None:
    """Every file under modules/ is used by main.bicep or by a module it uses."""
    used: set[str] = set()
    pending = [INFRA / "main.bicep"]
    while pending:
        template = Template.load(pending.pop())
        for module in template.modules.values():
            path = template.path.parent / str(module.children[2].children[0]).strip("'")
            relative = path.resolve().relative_to(INFRA).as_posix()
            if relative not in used:
                used.add(relative)
                pending.append(path)
    on_disk = {p.relative_to(INFRA).as_posix() for p in (INFRA / "modules").glob("*.bicep")}
    assert used == on_disk


# ---------------------------------------------------------------------- parameters


def test_the_example_parameters_are_what_the_pipeline_file_needs() -> None:
    """main.parameters.example.json is the output of `python -m replication infra-parameters
    pipelines.yaml`: regenerate it when pipelines.yaml changes (infra/README.md)."""
    derived = bicep_parameters(PIPELINES)
    example = example_parameters()
    for name, value in derived.items():
        assert example.get(name) == value, f"{EXAMPLE.name}: {name} differs from pipelines.yaml"
    document = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert parameters_file(derived, document) == document


def test_the_example_parameters_fit_the_template() -> None:
    main = Template.load(INFRA / "main.bicep")
    example = example_parameters()
    assert set(example) <= set(main.params)
    required = {name for name, node in main.params.items() if node.children[3] is None}
    assert required <= set(example), f"missing: {required - set(example)}"
    instance = main.instance(example)
    for name in main.params:
        instance.param(name)  # each value is one of its @allowed ones


# ---------------------------------------------------------------------- app settings


def test_function_app_py_reads_only_what_deploy_knows() -> None:
    """APP_SETTINGS lists what function_app.py reads: the same names as in its source."""
    tree = ast.parse((ROOT / "function_app.py").read_text(encoding="utf-8"))
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "os.environ.get", "os.getenv", "environ.get",
        ):  # fmt: skip
            read.add(ast.literal_eval(node.args[0]))
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            read.add(ast.literal_eval(node.slice))
    assert read == set(APP_SETTINGS)


@pytest.mark.parametrize("plan", ["FC1", "EP1"])
@pytest.mark.parametrize("auth", ["connectionString", "managedIdentity"])
def test_the_function_app_has_every_setting_the_app_needs(plan: str, auth: str) -> None:
    settings = app_settings(deployment(functionPlan=plan, authMode=auth))
    names = [s["name"] for s in settings]
    assert len(names) == len(set(names)), names
    connections = {c["name"]: c for c in example_parameters()["connections"]}
    for name in required_app_settings(PIPELINES):
        identity = f"{name}__fullyQualifiedNamespace"
        if identity in names:  # allowed for a connection the pipelines only read from
            assert auth == "managedIdentity"
            assert not connections[name]["send"] and not connections[name]["failover"]
        else:
            assert name in names, f"app setting {name!r} is not set ({plan}, {auth})"
    assert "APPLICATIONINSIGHTS_CONNECTION_STRING" in names
    values = {s["name"]: s["value"] for s in settings}
    assert values["REPLICATION_PIPELINES"] == "pipelines.yaml"
    for name in connections:  # listKeys of the connection's own rule, at deployment
        assert isinstance(values[name], Unknown)
    if plan == "FC1":  # the rest of each plan's site: test_functionapp.py
        assert not FLEX_REFUSES & set(names)
    else:
        assert set(names) >= FLEX_REFUSES
        assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"


def test_secret_settings_are_app_settings_too() -> None:
    settings = app_settings(deployment(appSecrets={"ENC_KEY": "@Microsoft.KeyVault(...)"}))
    assert {"name": "ENC_KEY", "value": "@Microsoft.KeyVault(...)"} in settings


def test_managed_identity_reads_source_only_connections_with_entity_scoped_roles(
    tmp_path: Path,
) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(
        "pipelines:\n"
        "  - name: orders\n"
        "    source: {connection: PrimaryServiceBus, queue: orders, sessions: true}\n"
        "    target: {connection: SecondaryServiceBus, queue: orders}\n"
        "  - name: events\n"
        "    source: {connection: PrimaryServiceBus, topic: events, subscription: copy}\n"
        "    target: {connection: SecondaryServiceBus, topic: events}\n",
        encoding="utf-8",
    )
    derived = bicep_parameters(pipelines)
    main = deployment(**derived, authMode="managedIdentity")
    names = {s["name"]: s["value"] for s in app_settings(main)}
    assert names["PrimaryServiceBus__fullyQualifiedNamespace"] == (
        "sb1-test-example-com.servicebus.windows.net"
    )
    assert "PrimaryServiceBus" not in names
    assert isinstance(names["SecondaryServiceBus"], Unknown)  # a Send key: targets need one
    primary, secondary = only(main.module("primary")), only(main.module("secondary"))
    assert primary.resource("rule") == []
    assert only(primary.resource("namespace"))["properties"]["disableLocalAuth"] is True
    assert [r["name"] for r in secondary.resource("rule")] == ["repl-SecondaryServiceBus"]
    assert only(secondary.resource("rule"))["properties"]["rights"] == ["Send"]
    receivers = only(main.module("primaryReceivers"))
    assert receivers.param("queues") == ["orders"]
    assert receivers.param("subscriptions") == [{"topic": "events", "name": "copy"}]
    assert [r["scope"] for r in receivers.resource("queueReceiver")] == [Unknown("queue.0")]
    assert [r["scope"] for r in receivers.resource("subscriptionReceiver")] == [
        Unknown("subscription.0")
    ]
    role = only(receivers.resource("queueReceiver"))["properties"]
    assert receivers.var("receiverRoleId") == "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
    assert role["principalType"] == "ServicePrincipal"
    secondary_receivers = only(main.module("secondaryReceivers"))
    assert secondary_receivers.param("queues") == []
    assert deployment(**derived).module("primaryReceivers") == []  # connection strings


# ---------------------------------------------------------------------- Service Bus


def test_each_namespace_gets_its_entities_and_one_rule_per_connection() -> None:
    main = deployment()
    derived = bicep_parameters(PIPELINES)
    for role in ("primary", "secondary"):
        namespace = only(main.module(role))
        name = namespace.param("name")
        assert name == f"{'sb1' if role == 'primary' else 'sb2'}-test-example-com"
        queues = {q["name"]: q["properties"] for q in namespace.resource("queue")}
        expected = [q for q in derived["queues"] if q["namespace"] == role]
        assert sorted(queues) == sorted(q["name"] for q in expected)
        for queue in expected:
            made = queues[queue["name"]]
            assert made["requiresSession"] == queue["requiresSession"]
            assert made["requiresDuplicateDetection"] == queue["requiresDuplicateDetection"]
        subscriptions = {s["name"] for s in namespace.resource("subscription")}
        assert subscriptions == {
            f"{name}/{s['topic']}/{s['name']}"
            for s in derived["subscriptions"]
            if s["namespace"] == role
        }
        rules = namespace.resource("rule")
        connection = "PrimaryServiceBus" if role == "primary" else "SecondaryServiceBus"
        assert [(r["name"], r["properties"]["rights"]) for r in rules] == [
            (f"repl-{connection}", ["Listen", "Send"])  # each is read from and sent to
        ]
        properties = only(namespace.resource("namespace"))["properties"]
        assert properties["minimumTlsVersion"] == "1.2"
        assert properties["disableLocalAuth"] is False


def test_a_failover_connection_has_its_rule_and_entities_on_both_namespaces(
    tmp_path: Path,
) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(
        "pipelines:\n"
        "  - name: orders\n"
        "    source: {connection: PrimaryServiceBus, queue: orders}\n"
        "    target:\n"
        "      connection: SecondaryServiceBus\n"
        "      queue: orders-copy\n"
        "      failover: {dns: {alias: servicebus.dr.contoso.net}}\n",
        encoding="utf-8",
    )
    derived = bicep_parameters(pipelines)
    assert derived["dnsZoneName"] == "dr.contoso.net"
    main = deployment(**derived, authMode="managedIdentity")
    for role in ("primary", "secondary"):
        namespace = only(main.module(role))
        assert "orders-copy" in [q["name"] for q in namespace.resource("queue")]
        rules = {r["name"]: r["properties"]["rights"] for r in namespace.resource("rule")}
        assert rules["repl-SecondaryServiceBus"] == ["Send"]
    assert "repl-PrimaryServiceBus" not in {
        r["name"] for r in only(main.module("primary")).resource("rule")
    }  # read with the identity


# ---------------------------------------------------------------------- DNS


@pytest.mark.parametrize(
    ("active", "host"),
    [("primary", "sb1-test-example-com"), ("secondary", "sb2-test-example-com")],
)
def test_the_dns_records_lead_our_resolver_to_the_active_namespace(active: str, host: str) -> None:
    main = deployment(activeNamespace=active)
    dns = only(main.module("dns"))
    zone = only(dns.resource("zone"))["name"]
    with DnsServer() as server:
        for record in dns.resource("srv"):
            srv = record["properties"]["SRVRecords"]
            server.set_srv(f"{record['name']}.{zone}",
                           [(r["priority"], r["weight"], r["port"], r["target"]) for r in srv],
                           record["properties"]["TTL"])  # fmt: skip
        alias = only(dns.resource("alias"))
        server.set_cname(f"{alias['name']}.{zone}", alias["properties"]["CNAMERecord"]["cname"],
                         alias["properties"]["TTL"])  # fmt: skip
        resolution = DnsResolver(main.output("aliasFqdn"), server.address).resolve()
    assert resolution.host == f"{host}.servicebus.windows.net"
    assert resolution.host == main.output("activeNamespaceHost")
    for record in dns.resource("srv"):  # 443 too (AMQP over WebSockets), as the guidance has
        assert sorted(r["port"] for r in record["properties"]["SRVRecords"]) == [443, 5671]


def test_the_alias_is_the_one_the_pipeline_fails_over_with(tmp_path: Path) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(
        "pipelines:\n"
        "  - name: orders\n"
        "    source: {connection: PrimaryServiceBus, queue: orders}\n"
        "    target:\n"
        "      connection: SecondaryServiceBus\n"
        "      queue: orders\n"
        "      failover: {dns: {alias: repl.dr.contoso.net}}\n",
        encoding="utf-8",
    )
    main = deployment(**bicep_parameters(pipelines))
    assert main.output("aliasFqdn") == "repl.dr.contoso.net"
    assert main.param("primaryNamespaceName") == "sb1-dr-contoso-net"


# ---------------------------------------------------------------------- outputs


SECRET_WORDS = ("listKeys", "list_func", "ConnectionString", "Key", "secret", "Secret")


@pytest.mark.parametrize("path", list(bicep_files()), ids=lambda p: p.name)
def test_outputs_hold_no_secret(path: Path) -> None:
    template = Template.load(path)
    secure = {
        name
        for name, node in template.params.items()
        if node.children[0] is not None
        and any(d.data == "deco_secure" for d in node.children[0].children)
    }
    for name, output in template.outputs.items():
        for node in output.children[3].iter_subtrees():
            assert node.data not in ("list_func", "function_accessor"), f"output {name}"
            for token in node.children:
                if isinstance(token, Token):
                    assert not any(w in token for w in SECRET_WORDS), f"output {name}: {token}"
                    assert str(token) not in secure, f"output {name} gives @secure {token}"
        assert (
            not isinstance(output.children[3], Tree)
            or output.children[3].data != "string"
            or (output.children[3].children[0] not in secure)
        )


def test_main_outputs_are_names_and_hosts() -> None:
    main = deployment()
    for name in main.template.outputs:
        value = main.output(name)
        assert not any(w in str(value) for w in SECRET_WORDS), f"output {name}: {value!r}"
    assert main.output("primaryNamespaceHost") == "sb1-test-example-com.servicebus.windows.net"
    assert main.output("functionAppName") == Unknown("a string with unique_string(...)")


def test_the_evaluator_refuses_what_pycep_may_have_grouped_wrongly(tmp_path: Path) -> None:
    """Without these refusals the tests above could pass on a misread template."""
    template = tmp_path / "t.bicep"
    template.write_text(
        "param items array = [\n  {\n    kind: 'a'\n  }\n]\n"
        "var bare = filter(items, x => x.kind == 'a')\n"
        "var wrapped = filter(items, x => (x.kind) == 'a')\n"
        "var mixed = 'a' == 'b' && true\n",
        encoding="utf-8",
    )
    instance = Template.load(template).instance({})
    assert instance.var("wrapped") == [{"kind": "a"}]
    for name in ("bare", "mixed"):
        with pytest.raises(Unsupported, match="parentheses"):
            instance.var(name)
