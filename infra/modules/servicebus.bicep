// One Service Bus namespace (the primary or the secondary of the failover pair) with the
// queues, topics and subscriptions the pipeline file uses on it, and one shared access rule
// per connection setting that reaches it with a connection string.
//
// Entities come from `python -m replication infra-parameters` (replication/deploy/parameters.py):
//   queues         [{ name, requiresSession, requiresDuplicateDetection }]
//   topics         [{ name, requiresDuplicateDetection }]
//   subscriptions  [{ topic, name, requiresSession }]
// Sessions where a pipeline reads with `sessions: true` (and on the queues such a pipeline
// fills, so consumers there keep them after a failover); duplicate detection on every entity
// a pipeline sends to: a batch the Functions host abandons is sent again, and the target drops
// the copies by message-id. Neither can be changed on an existing entity: delete and redeploy.
//
// Conditions are written in parentheses: pycep, the parser checkov and tests/infra use, does
// not know operator precedence (a property read that is an operand is in parentheses too).

@description('Namespace name: 6-50 letters, digits and hyphens, globally unique.')
@minLength(6)
@maxLength(50)
param name string

param location string

param tags object = {}

@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'

@description('Messaging units of a Premium namespace.')
@allowed([
  1
  2
  4
  8
  16
])
param premiumCapacity int = 1

param queues array = []

param topics array = []

param subscriptions array = []

@description('[{ name, rights }]: rights are Listen and/or Send, never Manage.')
param authorizationRules array = []

@description('True when no connection uses a key on this namespace (managed identity only).')
param disableLocalAuth bool = false

@description('How long a target remembers message-ids (ISO 8601 duration).')
param duplicateDetectionWindow string = 'PT10M'

param maxDeliveryCount int = 10

@description('Peek-lock duration; the Functions host renews locks of a batch in progress.')
param lockDuration string = 'PT1M'

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {
  name: name
  location: location
  tags: tags
  sku: union({
    name: sku
    tier: sku
  }, ((sku == 'Premium') ? {
    capacity: premiumCapacity
  } : {}))
  properties: {
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
    disableLocalAuth: disableLocalAuth
  }
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = [for q in queues: {
  parent: namespace
  name: q.name
  properties: {
    requiresSession: q.requiresSession
    requiresDuplicateDetection: q.requiresDuplicateDetection
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
    lockDuration: lockDuration
    deadLetteringOnMessageExpiration: true
  }
}]

resource topic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' = [for t in topics: {
  parent: namespace
  name: t.name
  properties: {
    requiresDuplicateDetection: t.requiresDuplicateDetection
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
  }
}]

resource subscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' = [for s in subscriptions: {
  name: '${namespace.name}/${s.topic}/${s.name}'
  properties: {
    requiresSession: s.requiresSession
    maxDeliveryCount: maxDeliveryCount
    lockDuration: lockDuration
    deadLetteringOnMessageExpiration: true
  }
  dependsOn: [
    topic
  ]
}]

// Namespace-level rules: a connection setting serves every entity of its connection, and an
// entity-level rule's connection string carries EntityPath, which ties an SDK client to that
// one entity. Each rule has only the rights its connection's pipelines use.
resource rule 'Microsoft.ServiceBus/namespaces/authorizationRules@2022-10-01-preview' = [for r in authorizationRules: {
  parent: namespace
  name: r.name
  properties: {
    rights: r.rights
  }
}]

output name string = namespace.name
