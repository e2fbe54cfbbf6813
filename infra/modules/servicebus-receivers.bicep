// authMode 'managedIdentity': the Function App's identity may receive from exactly the queues
// and subscriptions its identity-based connections (<Connection>__fullyQualifiedNamespace)
// read, one "Azure Service Bus Data Receiver" assignment per entity, nothing namespace-wide.
// No "Data Sender" assignment: the replication code sends with a connection string (targets
// keep a Send-only key rule; see infra/README.md), so the role would grant an unused right.

param namespaceName string

@description('Object id of the Function App\'s system-assigned identity.')
param principalId string

@description('Queue names read through an identity-based connection.')
param queues array = []

@description('[{ topic, name }]: subscriptions read through an identity-based connection.')
param subscriptions array = []

var receiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0' // Azure Service Bus Data Receiver

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' existing = [for q in queues: {
  parent: namespace
  name: q
}]

resource queueReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (q, i) in queues: {
  name: guid(queue[i].id, principalId, receiverRoleId)
  scope: queue[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', receiverRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}]

resource topic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' existing = [for s in subscriptions: {
  parent: namespace
  name: s.topic
}]

resource subscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' existing = [for (s, i) in subscriptions: {
  parent: topic[i]
  name: s.name
}]

resource subscriptionReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (s, i) in subscriptions: {
  name: guid(subscription[i].id, principalId, receiverRoleId)
  scope: subscription[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', receiverRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}]
