// The replication app on Azure (infra/README.md):
//   - two Service Bus namespaces, primary and secondary, with the queues, topics and
//     subscriptions the pipeline file uses, and only the access its connections need;
//   - an Event Hubs namespace on a side whose connections reach event hubs, with those
//     event hubs, the consumer groups the pipelines read, and least-privilege rules
//     (modules/eventhubs.bicep);
//   - the Function App running function_app.py (Flex Consumption or Elastic Premium), its
//     storage account, Application Insights on a Log Analytics workspace;
//   - the DNS zone of the failover design: SRV records per namespace, a CNAME alias on the
//     active one (modules/dns.bicep);
//   - alert rules on the app's metrics in Application Insights and on the namespaces' dead
//     letters, with an action group that mails or calls a webhook (modules/alerts.bicep).
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

@description('[{ namespace, name }]: event hubs the pipelines read or send to (from the pipeline file).')
param eventHubs array = []

@description('[{ namespace, eventHub, name }]: consumer groups event hub sources read, $Default aside (from the pipeline file).')
param consumerGroups array = []

@description('[{ name, namespace, eventHub, listen, send }]: one per connection setting of event hubs; eventHub is the one it reaches, empty when several (from the pipeline file).')
param eventHubConnections array = []

@description('[{ connection, namespace, eventHub }]: event hubs each connection reads (from the pipeline file).')
param eventHubReceivers array = []

@description('Event Hubs tier of the Event Hubs namespaces (Standard: up to 32 partitions and 7 days of retention).')
@allowed([
  'Standard'
  'Premium'
])
param eventHubsSku string = 'Standard'

@description('Partitions of each event hub (fixed once created on Standard; the same count on both sides keeps partition affinity).')
@minValue(1)
@maxValue(100)
param eventHubPartitionCount int = 4

@description('Days an event is kept (Standard: at most 7).')
@minValue(1)
@maxValue(90)
param eventHubRetentionDays int = 1

@description('Globally unique (Event Hubs and Service Bus namespaces share servicebus.windows.net).')
param primaryEventHubsNamespaceName string = 'eh1-${replace(dnsZoneName, '.', '-')}'

param secondaryEventHubsNamespaceName string = 'eh2-${replace(dnsZoneName, '.', '-')}'

@description('REPLICATION_PIPELINES: the pipeline file the app loads, relative to the app root (from the pipeline file).')
param pipelineFile string = 'pipelines.yaml'

@description('Other app settings the pipelines read, name -> value: the keys steps such as encrypt, sign or chain use, enrich values. `python -m replication infra-parameters` names the ones a pipeline file needs; a Key Vault reference (@Microsoft.KeyVault(SecretUri=...)) keeps a key out of the deployment.')
@secure()
param appSecrets object = {}

@description('How long a target remembers message-ids to drop duplicates (ISO 8601 duration).')
param duplicateDetectionWindow string = 'PT10M'

@minValue(1)
param maxDeliveryCount int = 10

@description('Deploy the alert rules and their action group (modules/alerts.bicep).')
param deployAlerts bool = true

@description('E-mail address the alerts notify; empty: none.')
param alertEmail string = ''

@description('Webhook the alerts call with the common alert schema (Teams, PagerDuty, ...); empty: none. Secure: such a URL carries its own token.')
@secure()
param alertWebhookUrl string = ''

@description('Replication lag alert: a target accepted a copy more than this many seconds after the source enqueued it.')
@minValue(1)
param alertLagSeconds int = 60

@description('RPO alert: the oldest message not yet replicated at a source is older than this many seconds.')
@minValue(1)
param alertRpoSeconds int = 300

@description('Dead letters alert: more than this many source messages dead-lettered by a pipeline in the window.')
@minValue(0)
param alertDeadLetteredMessages int = 0

@description('Failed batches alert: more than this many batches abandoned for redelivery by a pipeline in the window.')
@minValue(0)
param alertFailedBatches int = 0

@description('Failover alert: more than this many failover switches of an endpoint in the window.')
@minValue(0)
param alertFailovers int = 0

@description('Dead-letter queue alert: more than this many messages in the dead-letter queue of a Service Bus entity.')
@minValue(0)
param alertDeadLetterQueueMessages int = 0

@description('How often the alert rules run.')
@allowed([
  'PT1M'
  'PT5M'
  'PT15M'
  'PT30M'
  'PT1H'
])
param alertEvaluationFrequency string = 'PT5M'

@description('The time each alert evaluation looks back over: at least alertEvaluationFrequency.')
@allowed([
  'PT5M'
  'PT15M'
  'PT30M'
  'PT1H'
  'PT6H'
  'PT12H'
  'P1D'
])
param alertWindowSize string = 'PT15M'

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

var serviceBusConnections = [for c in connections: {
  name: c.name
  service: 'serviceBus'
  namespaceName: namespaceNames[c.namespace]
  host: namespaceHosts[c.namespace]
  eventHubName: ''
  ruleName: 'repl-${c.name}'
  useIdentity: contains(identityConnectionNames, c.name)
}]

var eventHubsNamespaceNames = {
  primary: primaryEventHubsNamespaceName
  secondary: secondaryEventHubsNamespaceName
}

var primaryEventHubs = filter(eventHubs, h => ((h.namespace) == 'primary'))

var secondaryEventHubs = filter(eventHubs, h => ((h.namespace) == 'secondary'))

// Event Hubs connections have no failover: identity needs only that nothing is sent with it.
var eventHubIdentityConnectionNames = [for c in filter(eventHubConnections, x => (authMode == 'managedIdentity') && (!x.send)): c.name]

var eventHubKeyConnections = filter(eventHubConnections, x => !contains(eventHubIdentityConnectionNames, x.name))

// A connection's rule is on the one event hub it reaches, else on its namespace.
var eventHubRules = [for c in eventHubKeyConnections: {
  namespace: c.namespace
  eventHub: c.eventHub
  name: 'repl-${c.name}'
  rights: concat(((c.listen) ? [
    'Listen'
  ] : []), ((c.send) ? [
    'Send'
  ] : []))
}]

var primaryEventHubRules = filter(eventHubRules, r => ((r.namespace) == 'primary'))

var secondaryEventHubRules = filter(eventHubRules, r => ((r.namespace) == 'secondary'))

var eventHubAppConnections = [for c in eventHubConnections: {
  name: c.name
  service: 'eventHubs'
  namespaceName: eventHubsNamespaceNames[c.namespace]
  host: '${eventHubsNamespaceNames[c.namespace]}.${serviceBusDnsSuffix}'
  eventHubName: c.eventHub
  ruleName: 'repl-${c.name}'
  useIdentity: contains(eventHubIdentityConnectionNames, c.name)
}]

var appConnections = concat(serviceBusConnections, eventHubAppConnections)

var eventHubIdentityReceivers = filter(eventHubReceivers, x => contains(eventHubIdentityConnectionNames, x.connection))

var primaryReceiverEventHubs = [for r in filter(eventHubIdentityReceivers, x => ((x.namespace) == 'primary')): r.eventHub]

var secondaryReceiverEventHubs = [for r in filter(eventHubIdentityReceivers, x => ((x.namespace) == 'secondary')): r.eventHub]

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

module primaryEventHubsNamespace 'modules/eventhubs.bicep' = if (!empty(primaryEventHubs)) {
  name: 'eventhubs-primary'
  params: {
    name: primaryEventHubsNamespaceName
    location: location
    tags: tags
    sku: eventHubsSku
    eventHubs: primaryEventHubs
    consumerGroups: filter(consumerGroups, g => ((g.namespace) == 'primary'))
    hubRules: filter(primaryEventHubRules, r => !empty(r.eventHub))
    namespaceRules: filter(primaryEventHubRules, r => empty(r.eventHub))
    partitionCount: eventHubPartitionCount
    retentionDays: eventHubRetentionDays
    disableLocalAuth: (authMode == 'managedIdentity') && (empty(primaryEventHubRules))
  }
}

module secondaryEventHubsNamespace 'modules/eventhubs.bicep' = if (!empty(secondaryEventHubs)) {
  name: 'eventhubs-secondary'
  params: {
    name: secondaryEventHubsNamespaceName
    location: location
    tags: tags
    sku: eventHubsSku
    eventHubs: secondaryEventHubs
    consumerGroups: filter(consumerGroups, g => ((g.namespace) == 'secondary'))
    hubRules: filter(secondaryEventHubRules, r => !empty(r.eventHub))
    namespaceRules: filter(secondaryEventHubRules, r => empty(r.eventHub))
    partitionCount: eventHubPartitionCount
    retentionDays: eventHubRetentionDays
    disableLocalAuth: (authMode == 'managedIdentity') && (empty(secondaryEventHubRules))
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
    primaryEventHubsNamespace
    secondaryEventHubsNamespace
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

module primaryEventHubReceivers 'modules/eventhubs-receivers.bicep' = if (!empty(primaryReceiverEventHubs)) {
  name: 'eventhub-receivers-primary'
  params: {
    namespaceName: primaryEventHubsNamespaceName
    principalId: functionApp.outputs.principalId
    eventHubs: primaryReceiverEventHubs
  }
  dependsOn: [
    primaryEventHubsNamespace
  ]
}

module secondaryEventHubReceivers 'modules/eventhubs-receivers.bicep' = if (!empty(secondaryReceiverEventHubs)) {
  name: 'eventhub-receivers-secondary'
  params: {
    namespaceName: secondaryEventHubsNamespaceName
    principalId: functionApp.outputs.principalId
    eventHubs: secondaryReceiverEventHubs
  }
  dependsOn: [
    secondaryEventHubsNamespace
  ]
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

module alerts 'modules/alerts.bicep' = if (deployAlerts) {
  name: 'alerts'
  params: {
    namePrefix: appName
    location: location
    tags: tags
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    serviceBusNamespaceNames: [
      primary.outputs.name
      secondary.outputs.name
    ]
    alertEmail: alertEmail
    alertWebhookUrl: alertWebhookUrl
    lagSeconds: alertLagSeconds
    rpoSeconds: alertRpoSeconds
    deadLetteredMessages: alertDeadLetteredMessages
    failedBatches: alertFailedBatches
    failovers: alertFailovers
    deadLetterQueueMessages: alertDeadLetterQueueMessages
    evaluationFrequency: alertEvaluationFrequency
    windowSize: alertWindowSize
  }
}

// Names and hosts only: connection strings and keys stay in the app settings.
output primaryNamespaceName string = primary.outputs.name
output secondaryNamespaceName string = secondary.outputs.name
output primaryNamespaceHost string = namespaceHosts.primary
output secondaryNamespaceHost string = namespaceHosts.secondary
output activeNamespaceHost string = namespaceHosts[activeNamespace]
output functionAppName string = functionApp.outputs.name
// The Event Hubs namespaces made (none when no pipeline uses an event hub).
output eventHubsNamespaceNames array = concat(((empty(primaryEventHubs)) ? [] : [
  primaryEventHubsNamespaceName
]), ((empty(secondaryEventHubs)) ? [] : [
  secondaryEventHubsNamespaceName
]))
output aliasFqdn string = dns.outputs.aliasFqdn
output dnsNameServers array = dns.outputs.nameServers
