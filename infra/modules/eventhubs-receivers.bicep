// authMode 'managedIdentity': the Function App's identity may receive from exactly the event
// hubs its identity-based connections (<Connection>__fullyQualifiedNamespace) read, one
// "Azure Event Hubs Data Receiver" assignment per event hub, nothing namespace-wide.
// No "Data Sender" assignment: the replication code sends with a connection string (targets
// keep a Send-only key rule; see infra/README.md), so the role would grant an unused right.

param namespaceName string

@description('Object id of the Function App\'s system-assigned identity.')
param principalId string

@description('Event hub names read through an identity-based connection.')
param eventHubs array = []

var receiverRoleId = 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde' // Azure Event Hubs Data Receiver

resource namespace 'Microsoft.EventHub/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource eventHub 'Microsoft.EventHub/namespaces/eventhubs@2022-10-01-preview' existing = [for h in eventHubs: {
  parent: namespace
  name: h
}]

resource eventHubReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (h, i) in eventHubs: {
  name: guid(eventHub[i].id, principalId, receiverRoleId)
  scope: eventHub[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', receiverRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}]
