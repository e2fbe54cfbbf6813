// The Function App that runs function_app.py: Linux, Python 3.11, on a Flex Consumption
// (FC1) or Elastic Premium (EP1) plan, with a system-assigned identity and the app settings
// the pipeline file needs.
//
// App settings: one entry per setting in `settings` below, each { name, source, value,
// namespaceName, eventHubName, ruleName } where source says where the value comes from at
// deployment:
//   'value'        the value as given (pipeline file path, namespace host, ...)
//   'sas'          the primary connection string of authorization rule ruleName of Service
//                  Bus namespace namespaceName (read with listKeys: never in a parameter or
//                  an output)
//   'eventHubsSas' the same of a rule of Event Hubs namespace namespaceName
//   'eventHubSas'  the same of a rule of event hub eventHubName there (it carries EntityPath)
//   'storage'      a connection string of the app's storage account
//   'appInsights'  the Application Insights connection string
// The names are plain data so tests/infra can check them against the pipeline file.
//
// Conditions are written in parentheses: pycep, the parser checkov and tests/infra use, does
// not know operator precedence (a property read that is an operand is in parentheses too).

param appName string

param planName string

param location string

param tags object = {}

@allowed([
  'FC1'
  'EP1'
])
param plan string = 'FC1'

param storageAccountName string

@description('Flex Consumption: the blob container the app package is deployed to.')
param deploymentContainerName string

@description('Elastic Premium: the Azure Files share holding the app content.')
param contentShareName string

param applicationInsightsName string

@description('REPLICATION_PIPELINES: the pipeline file function_app.py loads, relative to the app root.')
param pipelineFile string = 'pipelines.yaml'

@description('[{ name, service, namespaceName, host, eventHubName, ruleName, useIdentity }]: one per connection setting the pipeline file names; service is serviceBus or eventHubs, eventHubName the event hub whose rule an Event Hubs connection uses (empty: the namespace\'s).')
param connections array

@description('Other settings the pipelines read (step keys, enrich values): name -> value.')
@secure()
param appSecrets object = {}

@description('Flex Consumption: most instances the app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Flex Consumption: memory of an instance.')
@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Elastic Premium: most instances the plan scales out to.')
@minValue(1)
@maxValue(100)
param maximumElasticWorkerCount int = 20

@description('Spread the plan over availability zones (region support needed; Elastic Premium then keeps 3 instances).')
param zoneRedundant bool = false

var isFlex = (plan == 'FC1')

var baseSettings = [
  {
    name: 'AzureWebJobsStorage'
    source: 'storage'
    value: ''
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
  {
    name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
    source: 'appInsights'
    value: ''
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
  {
    name: 'REPLICATION_PIPELINES'
    source: 'value'
    value: pipelineFile
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
]

// Flex Consumption takes the runtime from functionAppConfig and refuses these settings.
var premiumSettings = (isFlex) ? [] : [
  {
    name: 'FUNCTIONS_EXTENSION_VERSION'
    source: 'value'
    value: '~4'
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
  {
    name: 'FUNCTIONS_WORKER_RUNTIME'
    source: 'value'
    value: 'python'
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
  {
    name: 'WEBSITE_CONTENTAZUREFILECONNECTIONSTRING'
    source: 'storage'
    value: ''
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
  {
    name: 'WEBSITE_CONTENTSHARE'
    source: 'value'
    value: contentShareName
    namespaceName: ''
    eventHubName: ''
    ruleName: ''
  }
]

// A connection is identity-based (<name>__fullyQualifiedNamespace, read by the Functions
// trigger with the app's identity) or a connection string of its own authorization rule.
var connectionSettings = [for c in connections: {
  name: (c.useIdentity) ? '${c.name}__fullyQualifiedNamespace' : c.name
  source: (c.useIdentity) ? 'value' : (((c.service) == 'serviceBus') ? 'sas' : ((empty(c.eventHubName)) ? 'eventHubsSas' : 'eventHubSas'))
  value: (c.useIdentity) ? c.host : ''
  namespaceName: c.namespaceName
  eventHubName: c.eventHubName
  ruleName: c.ruleName
}]

var secretSettings = [for secret in items(appSecrets): {
  name: secret.key
  source: 'value'
  value: secret.value
  namespaceName: ''
  ruleName: ''
}]

var settings = concat(baseSettings, premiumSettings, connectionSettings, secretSettings)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deploymentContainerName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

var storageConnectionString = 'DefaultEndpointsProtocol=https;AccountName=${storage.name};EndpointSuffix=${environment().suffixes.storage};AccountKey=${storage.listKeys().keys[0].value}'

resource hostingPlan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: (isFlex) ? 'functionapp' : 'elastic'
  sku: (isFlex) ? {
    name: 'FC1'
    tier: 'FlexConsumption'
  } : {
    name: 'EP1'
    tier: 'ElasticPremium'
  }
  // checkov:skip=CKV_AZURE_225: zone redundancy is the zoneRedundant parameter (off by default): not every region offers it, and on Elastic Premium it means 3 instances always running
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
    maximumElasticWorkerCount: (isFlex) ? null : maximumElasticWorkerCount
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: appName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: hostingPlan.id
    httpsOnly: true
    // checkov:skip=CKV_AZURE_17: the app has no HTTP-triggered functions (Service Bus and Event Hubs triggers only): there is no call for client certificates to guard
    clientCertEnabled: false
    // checkov:skip=CKV_AZURE_222: deployment (func publish, zip deploy) reaches the app over its public endpoint; the app serves no HTTP functions and this template has no private network
    publicNetworkAccess: 'Enabled'
    functionAppConfig: (isFlex) ? {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    } : null
    siteConfig: {
      linuxFxVersion: (isFlex) ? null : 'Python|3.11'
      // checkov:skip=CKV_AZURE_212: instance counts are the platform's: Flex Consumption and Elastic Premium scale out on queue length (maximumInstanceCount / maximumElasticWorkerCount)
      // checkov:skip=CKV_AZURE_213: there is no HTTP endpoint to probe: the functions are Service Bus and Event Hubs triggers and the platform watches the Functions host itself
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: [for s in settings: {
        name: s.name
        value: ((s.source) == 'sas') ? listKeys(resourceId('Microsoft.ServiceBus/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubsSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/eventhubs/authorizationRules', s.namespaceName, s.eventHubName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'storage') ? storageConnectionString : (((s.source) == 'appInsights') ? appInsights.properties.ConnectionString : s.value))))
      }]
    }
  }
}

var blobContributorRoleId = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor

// Flex Consumption fetches the package from the deployment container with the app's identity.
resource deploymentAccess 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (isFlex) {
  name: guid(deploymentContainer.id, functionApp.id, blobContributorRoleId)
  scope: deploymentContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobContributorRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

output name string = functionApp.name
output principalId string = functionApp.identity.principalId
output defaultHostName string = functionApp.properties.defaultHostName
