"""The Function App per hosting plan (modules/functionapp*.bicep, issue 38): what a Flex
Consumption (FC1) app needs and nothing it refuses, and Elastic Premium (EP1) as before.

Flex Consumption takes its runtime, package container and scale limits from the site's
``functionAppConfig``, refuses a set of ``siteConfig`` properties with ARM error 51021
(``linuxFxVersion``, ``ftpsState``, ...; reported refused even when sent as null), and does
not use the legacy app settings listed under "Flex Consumption plan deprecations" in the
Functions app settings reference. Elastic Premium needs ``linuxFxVersion`` and its content
share.
"""

from __future__ import annotations

from typing import Any

import pytest
from lark import Tree

from .bicep_eval import Template, Unknown
from .support import INFRA, PLAN_MODULES, deployment, only, plan_module

MODULES = INFRA / "modules"

FLEX_REFUSED_SITE_CONFIG = {
    "linuxFxVersion",
    "windowsFxVersion",
    "ftpsState",
    "use32BitWorkerProcess",
    "netFrameworkVersion",
    "preWarmedInstanceCount",
    "functionsRuntimeScaleMonitoringEnabled",
    "functionAppScaleLimit",
    "alwaysOn",
}
"""siteConfig properties a Flex Consumption site refuses (ARM 51021 reports in Azure's issue
trackers; alwaysOn: no always-on instance on a consumption plan)."""

FLEX_DEPRECATED_SETTINGS = {
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "FUNCTIONS_EXTENSION_VERSION",
    "FUNCTIONS_WORKER_PROCESS_COUNT",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "WEBSITE_SKIP_CONTENTSHARE_VALIDATION",
    "SCM_DO_BUILD_DURING_DEPLOYMENT",
    "ENABLE_ORYX_BUILD",
    "WEBSITE_VNET_ROUTE_ALL",
}
"""App settings Flex Consumption does not use: functionAppConfig replaces them."""

BLOB_ENDPOINT = "https://stexample.blob.core.windows.net/"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"


def nulls(value: Any, path: str = "") -> list[str]:
    """Where ``value`` holds a null: a property declared for the other plan only."""
    if value is None:
        return [path or "."]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in nulls(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in nulls(item, f"{path}[{i}]")]
    return []


def deployed_modules(plan: str, **overrides: Any) -> list[str]:
    """Which of modules/functionapp.bicep's per-plan modules the parameters deploy."""
    app = only(deployment(functionPlan=plan, **overrides).module("functionApp"))
    return [s for s in PLAN_MODULES.values() if s in app.template.modules and app.module(s)]


def body(template: Template, symbol: str) -> Tree:
    """The object a declaration deploys (its syntax), past any condition."""
    node = template.resources[symbol] if symbol in template.resources else template.modules[symbol]
    node = node.children[4] if node.data == "resource" else node.children[3]
    return node.children[1] if node.data == "deploy_condition" else node


def value_of(obj: Tree, *keys: str) -> Any:
    """The syntax of ``obj.keys[0].keys[1]...`` in an object literal."""
    for key in keys:
        [obj] = [
            pair.children[1] for pair in obj.children if str(pair.children[0].children[0]) == key
        ]
    return obj


@pytest.mark.parametrize("auth", ["connectionString", "managedIdentity"])
def test_flex_consumption_declares_its_runtime_and_package_container_in_functionAppConfig(
    auth: str,
) -> None:
    main = deployment(functionPlan="FC1", authMode=auth)
    assert deployed_modules("FC1", authMode=auth) == ["flexSite"]
    flex = plan_module(main)
    plan, site = only(flex.resource("plan")), only(flex.resource("site"))
    assert plan["kind"] == "functionapp"
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert plan["properties"] == {"reserved": True, "zoneRedundant": False}
    assert site["kind"] == "functionapp,linux"
    assert site["identity"] == {"type": "SystemAssigned"}
    config = site["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    assert config["scaleAndConcurrency"] == {"maximumInstanceCount": 100, "instanceMemoryMB": 2048}
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"] == {"type": "SystemAssignedIdentity"}
    # the container the storage module makes, under the account's blob endpoint
    container = flex.param("deploymentContainerName")
    made = only(only(main.module("storage")).resource("deploymentContainer"))
    assert made["name"] == container == "app-package"
    assert made["properties"] == {"publicAccess": "None"}
    endpoint = {"storage": {"properties": {"primaryEndpoints": {"blob": BLOB_ENDPOINT}}}}
    with_endpoint = flex.eval(body(flex.template, "site"), endpoint)
    value = with_endpoint["properties"]["functionAppConfig"]["deployment"]["storage"]["value"]
    assert value == f"{BLOB_ENDPOINT}{container}"
    # the site's identity may read and write that container, and only that container
    role = only(flex.resource("deploymentAccess"))
    assert role["scope"].symbol == "deploymentContainer"
    assert only(flex.resource("deploymentContainer"))["name"] == container
    assert flex.var("blobContributorRoleId") == BLOB_DATA_CONTRIBUTOR
    assert role["properties"]["principalId"] == Unknown("site.identity.principalId")
    assert role["properties"]["principalType"] == "ServicePrincipal"
    app = only(main.module("functionApp"))
    assert app.output("principalId") == Unknown("site.identity.principalId")


@pytest.mark.parametrize("auth", ["connectionString", "managedIdentity"])
def test_flex_consumption_declares_nothing_flex_refuses_or_ignores(auth: str) -> None:
    flex = plan_module(deployment(functionPlan="FC1", authMode=auth))
    plan, site = only(flex.resource("plan")), only(flex.resource("site"))
    site_config = site["properties"]["siteConfig"]
    assert not FLEX_REFUSED_SITE_CONFIG & set(site_config), sorted(site_config)
    names = {s["name"] for s in site_config["appSettings"]}
    assert not FLEX_DEPRECATED_SETTINGS & names
    assert "AzureWebJobsStorage" in names  # the host's storage: Flex still needs it
    # not even as null: nothing in the Flex plan or site belongs to Elastic Premium
    assert nulls(plan) == []
    assert nulls(site) == []


def test_elastic_premium_keeps_linuxFxVersion_and_its_content_share() -> None:
    main = deployment(functionPlan="EP1")
    assert deployed_modules("EP1") == ["premiumSite"]
    premium = plan_module(main)
    plan, site = only(premium.resource("plan")), only(premium.resource("site"))
    assert plan["kind"] == "elastic"
    assert plan["sku"] == {"name": "EP1", "tier": "ElasticPremium"}
    assert plan["properties"] == {
        "reserved": True,
        "zoneRedundant": False,
        "maximumElasticWorkerCount": 20,
    }
    assert site["kind"] == "functionapp,linux"
    assert "functionAppConfig" not in site["properties"]  # Flex Consumption only
    site_config = site["properties"]["siteConfig"]
    assert site_config["linuxFxVersion"] == "Python|3.11"
    assert site_config["ftpsState"] == "Disabled"
    values = {s["name"]: s["value"] for s in site_config["appSettings"]}
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert values["FUNCTIONS_EXTENSION_VERSION"] == "~4"
    share = only(main.module("functionApp")).param("contentShareName")
    assert values["WEBSITE_CONTENTSHARE"] == share
    assert isinstance(values["WEBSITE_CONTENTAZUREFILECONNECTIONSTRING"], Unknown)  # a key
    storage = only(main.module("storage"))
    assert storage.param("contentShareName") == share  # the share the storage module makes
    assert only(deployment(functionPlan="FC1").module("storage")).param("contentShareName") == ""
    assert nulls(plan) == []
    assert nulls(site) == []
    app = only(main.module("functionApp"))
    assert app.output("principalId") == Unknown("site.identity.principalId")


def test_both_plans_get_the_same_app_settings_loop_and_hardening() -> None:
    """functionapp.bicep writes the settings loop into both module declarations (a loop that
    calls listKeys cannot be a variable): the same text; and both sites have the same TLS,
    HTTPS, identity and network settings."""
    app = Template.load(MODULES / "functionapp.bicep")
    path = ("params", "appSettings")
    assert value_of(body(app, "flexSite"), *path) == value_of(body(app, "premiumSite"), *path)
    sites = {
        plan: only(plan_module(deployment(functionPlan=plan)).resource("site"))
        for plan in ("FC1", "EP1")
    }
    common = {"name", "location", "tags", "kind", "identity"}
    assert {k: sites["FC1"][k] for k in common} == {k: sites["EP1"][k] for k in common}
    for key in ("httpsOnly", "clientCertEnabled", "publicNetworkAccess"):
        assert sites["FC1"]["properties"][key] == sites["EP1"]["properties"][key], key
    for key in ("minTlsVersion", "http20Enabled", "remoteDebuggingEnabled"):
        flex_value = sites["FC1"]["properties"]["siteConfig"][key]
        assert flex_value == sites["EP1"]["properties"]["siteConfig"][key], key
    assert sites["FC1"]["properties"]["siteConfig"]["minTlsVersion"] == "1.2"
    assert sites["FC1"]["properties"]["httpsOnly"] is True


def test_the_plan_modules_take_the_settings_in_a_secure_parameter() -> None:
    """The settings carry connection strings (listKeys at deployment): a @secure() object
    keeps them out of the deployment's logged parameters."""
    for name in ("functionapp-flex.bicep", "functionapp-premium.bicep"):
        param = Template.load(MODULES / name).params["appSettings"]
        decorators = param.children[0].children if param.children[0] is not None else []
        assert any(d.data == "deco_secure" for d in decorators), name
