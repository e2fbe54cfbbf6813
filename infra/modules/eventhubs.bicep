// One Event Hubs namespace (the primary or the secondary) with the event hubs the pipeline
// file uses on it, the consumer groups its sources read, and one shared access rule per
// connection setting that reaches it with a connection string.
//
// From `python -m replication infra-parameters` (replication/deploy/parameters.py):
//   eventHubs       [{ name }]
//   consumerGroups  [{ eventHub, name }]   ($Default exists on every event hub)
//   hubRules        [{ eventHub, name, rights }]: a connection that reaches one event hub
//                   gets its rule on that hub (Listen for a source, Send for a target)
//   namespaceRules  [{ name, rights }]: a connection that reaches several (one setting holds
//                   one connection string, and a hub's carries EntityPath)
// The Functions Event Hubs trigger needs its consumer group to exist; it keeps checkpoints
// and partition ownership in the app's storage account (AzureWebJobsStorage).
//
// Conditions are written in parentheses: pycep, the parser checkov and tests/infra use, does
// not know operator precedence (a property read that is an operand is in parentheses too).

@description('Namespace name: 6-50 letters, digits and hyphens, globally unique (it shares servicebus.windows.net with Service Bus namespaces).')
@minLength(6)
@maxLength(50)
param name string

param location string

param tags object = {}

@description('Standard (up to 32 partitions, 7 days of retention, 20 consumer groups per hub) or Premium.')
@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'

@description('Throughput units (Standard) or processing units (Premium).')
@minValue(1)
@maxValue(40)
param capacity int = 1

param eventHubs array = []

param consumerGroups array = []

@description('[{ eventHub, name, rights }]: rights are Listen and/or Send, never Manage.')
param hubRules array = []

@description('[{ name, rights }]: rights are Listen and/or Send, never Manage.')
param namespaceRules array = []

@description('Partitions of each event hub: fixed once created on Standard (Event Hubs -> Event Hubs keeps partition affinity when source and target have the same count).')
@minValue(1)
@maxValue(100)
param partitionCount int = 4

@description('Days an event is kept (Standard: at most 7).')
@minValue(1)
@maxValue(90)
param retentionDays int = 1

@description('True when no connection uses a key on this namespace (managed identity only).')
param disableLocalAuth bool = false

resource namespace 'Microsoft.EventHub/namespaces@2022-10-01-preview' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: sku
    tier: sku
    capacity: capacity
  }
  properties: {
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
    disableLocalAuth: disableLocalAuth
  }
}

resource eventHub 'Microsoft.EventHub/namespaces/eventhubs@2022-10-01-preview' = [for h in eventHubs: {
  parent: namespace
  name: h.name
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: retentionDays
  }
}]

resource consumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2022-10-01-preview' = [for g in consumerGroups: {
  name: '${namespace.name}/${g.eventHub}/${g.name}'
  properties: {}
  dependsOn: [
    eventHub
  ]
}]

// Each rule has only the rights its connection's pipelines use.
resource hubRule 'Microsoft.EventHub/namespaces/eventhubs/authorizationRules@2022-10-01-preview' = [for r in hubRules: {
  name: '${namespace.name}/${r.eventHub}/${r.name}'
  properties: {
    rights: r.rights
  }
  dependsOn: [
    eventHub
  ]
}]

resource namespaceRule 'Microsoft.EventHub/namespaces/authorizationRules@2022-10-01-preview' = [for r in namespaceRules: {
  parent: namespace
  name: r.name
  properties: {
    rights: r.rights
  }
}]

output name string = namespace.name
