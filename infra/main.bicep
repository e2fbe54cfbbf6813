// The replication app on Azure (infra/README.md):
//   - two Service Bus namespaces, primary and secondary, with the queues, topics and
//     subscriptions the pipeline file uses, and only the access its connections need;
//   - the Function App running function_app.py (Flex Consumption or Elastic Premium), its
//     storage account, Application Insights on a Log Analytics workspace;
//   - the DNS zone of the failover design: SRV records per namespace, a CNAME alias on the
//     active one (modules/dns.bicep).
//
// The entity and connection parameters are derived from the pipeline file:
//   python -m replication infra-parameters pipelines.yaml --base infra/main.parameters.example.json
// (replication/deploy/parameters.py); main.parameters.example.json is that output for the
// repository's pipelines.yaml.
//
// No Bicep CLI runs in this repository's tests (it cannot be downloaded there): they parse
// these files with pycep, the parser checkov uses, and scan them with checkov. pycep does not
// know operator precedence, so conditions are written in parentheses, and so is a property
// read that is an operand: `(x.namespace) == 'primary'`.

targetScope = 'resourceGroup'

@description('Short lower-case name (letters and digits) for the app, plan, storage and monitoring resources.')
@minLength(3)
@maxLength(11)
param appName string

param location string = resourceGroup().location

param tags object = {}

@description('Service Bus tier of both namespaces (topics and duplicate detection need Standard or better).')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('connectionString: every connection is a key rule\'s connection string. managedIdentity: connections the pipelines only read from (without failover) use the app\'s identity.')
@allowed([
  'connectionString'
  'managedIdentity'
])
param authMode string = 'connectionString'

@description('FC1: Flex Consumption. EP1: Elastic Premium.')
@allowed([
  'FC1'
  'EP1'
])
param functionPlan string = 'FC1'

@description('DNS zone of the failover records, e.g. test.example.com.')
param dnsZoneName string

@description('Label of the CNAME alias: a pipeline\'s failover dns alias is <dnsAliasName>.<dnsZoneName>.')
param dnsAliasName string = 'servicebus'

@description('The namespace the alias points at: primary (sb1) or secondary (sb2). Changing it is failing over.')
@allowed([
  'primary'
  'secondary'
])
param activeNamespace string = 'primary'

@description('TTL of the failover records in seconds: how long clients may keep an old answer.')
@minValue(1)
param dnsTtl int = 60

@description('Globally unique; the guidance\'s naming by default (sb1-test-example-com).')
param primaryNamespaceName string = 'sb1-${replace(dnsZoneName, '.', '-')}'

param secondaryNamespaceName string = 'sb2-${replace(dnsZoneName, '.', '-')}'

@description('DNS suffix of Service Bus namespaces in this cloud.')
param serviceBusDnsSuffix string = 'servicebus.windows.net'

@description('[{ namespace, name, requiresSession, requiresDuplicateDetection }] (from the pipeline file).')
param queues array

@description('[{ namespace, name, requiresDuplicateDetection }] (from the pipeline file).')
param topics array

@description('[{ namespace, topic, name, requiresSession }] (from the pipeline file).')
param subscriptions array

@description('[{ name, namespace, listen, send, failover }]: one per connection setting the pipeline file names (from the pipeline file).')
param connections array

@description('[{ connection, namespace, queue, topic, subscription }]: what each connection reads (from the pipeline file).')
param receivers array

@description('REPLICATION_PIPELINES: the pipeline file the app loads, relative to the app root (from the pipeline file).')
param pipelineFile string = 'pipelines.yaml'

@description('Other app settings the pipelines read, name -> value: the keys steps such as encrypt, sign or chain use, enrich values. `python -m replication infra-parameters` names the ones a pipeline file needs; a Key Vault reference (@Microsoft.KeyVault(SecretUri=...)) keeps a key out of the deployment.')
@secure()
param appSecrets object = {}

@description('How long a target remembers message-ids to drop duplicates (ISO 8601 duration).')
param duplicateDetectionWindow string = 'PT10M'

@minValue(1)
param maxDeliveryCount int = 10

var suffix = uniqueString(resourceGroup().id, appName)

var namespaceNames = {
  primary: primaryNamespaceName
  secondary: secondaryNamespaceName
}

var namespaceHosts = {
  primary: '${primaryNamespaceName}.${serviceBusDnsSuffix}'
  secondary: '${secondaryNamespaceName}.${serviceBusDnsSuffix}'
}

// Identity needs a connection the pipelines only read from: the replication code sends with
// a connection string, and failover reuses a connection string's key on the other namespace.
var identityConnectionNames = [for c in filter(connections, x => (authMode == 'managedIdentity') && (!x.send) && (!x.failover)): c.name]

var keyConnections = filter(connections, x => !contains(identityConnectionNames, x.name))

// One rule per key connection on its namespace, and on both when it fails over (the
// namespaces of a failover pair are structurally identical: same entities, same rules).
var primaryRules = [for c in filter(keyConnections, x => ((x.namespace) == 'primary') || (x.failover)): {
  name: 'repl-${c.name}'
  rights: concat(((c.listen) ? [
    'Listen'
  ] : []), ((c.send) ? [
    'Send'
  ] : []))
}]

var secondaryRules = [for c in filter(keyConnections, x => ((x.namespace) == 'secondary') || (x.failover)): {
  name: 'repl-${c.name}'
  rights: concat(((c.listen) ? [
    'Listen'
  ] : []), ((c.send) ? [
    'Send'
  ] : []))
}]

var appConnections = [for c in connections: {
  name: c.name
  namespaceName: namespaceNames[c.namespace]
  host: namespaceHosts[c.namespace]
  ruleName: 'repl-${c.name}'
  useIdentity: contains(identityConnectionNames, c.name)
}]

var identityReceivers = filter(receivers, x => contains(identityConnectionNames, x.connection))

var primaryReceiverQueues = [for r in filter(identityReceivers, x => ((x.namespace) == 'primary') && (!empty(x.queue))): r.queue]

var primaryReceiverSubscriptions = [for r in filter(identityReceivers, x => ((x.namespace) == 'primary') && (empty(x.queue))): {
  topic: r.topic
  name: r.subscription
}]

var secondaryReceiverQueues = [for r in filter(identityReceivers, x => ((x.namespace) == 'secondary') && (!empty(x.queue))): r.queue]

var secondaryReceiverSubscriptions = [for r in filter(identityReceivers, x => ((x.namespace) == 'secondary') && (empty(x.queue))): {
  topic: r.topic
  name: r.subscription
}]

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    name: take(replace(toLower('st${appName}${suffix}'), '-', ''), 24)
    location: location
    tags: tags
    deploymentContainerName: 'app-package'
    contentShareName: (functionPlan == 'EP1') ? 'content-${suffix}' : ''
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: 'log-${appName}-${suffix}'
    applicationInsightsName: 'appi-${appName}-${suffix}'
    location: location
    tags: tags
  }
}

module primary 'modules/servicebus.bicep' = {
  name: 'servicebus-primary'
  params: {
    name: primaryNamespaceName
    location: location
    tags: tags
    sku: serviceBusSku
    queues: filter(queues, q => ((q.namespace) == 'primary'))
    topics: filter(topics, t => ((t.namespace) == 'primary'))
    subscriptions: filter(subscriptions, s => ((s.namespace) == 'primary'))
    authorizationRules: primaryRules
    disableLocalAuth: (authMode == 'managedIdentity') && (empty(primaryRules))
    duplicateDetectionWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
  }
}

module secondary 'modules/servicebus.bicep' = {
  name: 'servicebus-secondary'
  params: {
    name: secondaryNamespaceName
    location: location
    tags: tags
    sku: serviceBusSku
    queues: filter(queues, q => ((q.namespace) == 'secondary'))
    topics: filter(topics, t => ((t.namespace) == 'secondary'))
    subscriptions: filter(subscriptions, s => ((s.namespace) == 'secondary'))
    authorizationRules: secondaryRules
    disableLocalAuth: (authMode == 'managedIdentity') && (empty(secondaryRules))
    duplicateDetectionWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  params: {
    appName: 'func-${appName}-${suffix}'
    planName: 'plan-${appName}-${suffix}'
    location: location
    tags: tags
    plan: functionPlan
    storageAccountName: storage.outputs.name
    deploymentContainerName: 'app-package'
    contentShareName: (functionPlan == 'EP1') ? 'content-${suffix}' : ''
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    pipelineFile: pipelineFile
    connections: appConnections
    appSecrets: appSecrets
  }
  // the app settings read the namespaces' rules (listKeys) by name
  dependsOn: [
    primary
    secondary
  ]
}

module primaryReceivers 'modules/servicebus-receivers.bicep' = if (authMode == 'managedIdentity') {
  name: 'receivers-primary'
  params: {
    namespaceName: primary.outputs.name
    principalId: functionApp.outputs.principalId
    queues: primaryReceiverQueues
    subscriptions: primaryReceiverSubscriptions
  }
}

module secondaryReceivers 'modules/servicebus-receivers.bicep' = if (authMode == 'managedIdentity') {
  name: 'receivers-secondary'
  params: {
    namespaceName: secondary.outputs.name
    principalId: functionApp.outputs.principalId
    queues: secondaryReceiverQueues
    subscriptions: secondaryReceiverSubscriptions
  }
}

module dns 'modules/dns.bicep' = {
  name: 'dns'
  params: {
    zoneName: dnsZoneName
    aliasName: dnsAliasName
    activeLabel: (activeNamespace == 'primary') ? 'sb1' : 'sb2'
    primaryHost: namespaceHosts.primary
    secondaryHost: namespaceHosts.secondary
    ttl: dnsTtl
    tags: tags
  }
}

// Names and hosts only: connection strings and keys stay in the app settings.
output primaryNamespaceName string = primary.outputs.name
output secondaryNamespaceName string = secondary.outputs.name
output primaryNamespaceHost string = namespaceHosts.primary
output secondaryNamespaceHost string = namespaceHosts.secondary
output activeNamespaceHost string = namespaceHosts[activeNamespace]
output functionAppName string = functionApp.outputs.name
output aliasFqdn string = dns.outputs.aliasFqdn
output dnsNameServers array = dns.outputs.nameServers
