// The Function App that runs function_app.py: Linux, Python 3.11, on a Flex Consumption
// (FC1) or Elastic Premium (EP1) plan, with a system-assigned identity and the app settings
// the pipeline file needs.
//
// The plan and the site are in a module per hosting plan, functionapp-flex.bicep (FC1) or
// functionapp-premium.bicep (EP1), so that each declares only what its plan takes: Flex
// Consumption has its runtime, package container and scale limits in the site's
// functionAppConfig and refuses linuxFxVersion, ftpsState and other siteConfig properties
// that Elastic Premium needs (ARM error 51021, reported even for null values, so not
// `plan ? value : null` either). Modules rather than `= if (...)` resources: checkov 3.3.30
// reads no property of a conditional resource. This file works out the app settings once
// and hands them to the plan's module.
//
// App settings: one entry per setting in `settings` below, each { name, source, value,
// namespaceName, eventHubName, ruleName } where source says where the value comes from at
// deployment:
//   'value'        the value as given (pipeline file path, namespace host, ...)
//   'sas'          the primary connection string of authorization rule ruleName of Service
//                  Bus namespace namespaceName (read with listKeys at deployment: never in a
//                  parameter of main.bicep or in an output; the plan's module takes the
//                  settings in a @secure() parameter)
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

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

var storageConnectionString = 'DefaultEndpointsProtocol=https;AccountName=${storage.name};EndpointSuffix=${environment().suffixes.storage};AccountKey=${storage.listKeys().keys[0].value}'

// The settings with their values, as siteConfig.appSettings takes them. Both module
// declarations below write the same loop (tests/infra compares them): a loop that calls
// listKeys cannot be a variable.
module flexSite 'functionapp-flex.bicep' = if (isFlex) {
  name: 'functionapp-flex'
  params: {
    appName: appName
    planName: planName
    location: location
    tags: tags
    storageAccountName: storageAccountName
    deploymentContainerName: deploymentContainerName
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    zoneRedundant: zoneRedundant
    appSettings: {
      items: [for s in settings: {
        name: s.name
        value: ((s.source) == 'sas') ? listKeys(resourceId('Microsoft.ServiceBus/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubsSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/eventhubs/authorizationRules', s.namespaceName, s.eventHubName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'storage') ? storageConnectionString : (((s.source) == 'appInsights') ? appInsights.properties.ConnectionString : s.value))))
      }]
    }
  }
}

module premiumSite 'functionapp-premium.bicep' = if (!isFlex) {
  name: 'functionapp-premium'
  params: {
    appName: appName
    planName: planName
    location: location
    tags: tags
    maximumElasticWorkerCount: maximumElasticWorkerCount
    zoneRedundant: zoneRedundant
    appSettings: {
      items: [for s in settings: {
        name: s.name
        value: ((s.source) == 'sas') ? listKeys(resourceId('Microsoft.ServiceBus/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubsSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/authorizationRules', s.namespaceName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'eventHubSas') ? listKeys(resourceId('Microsoft.EventHub/namespaces/eventhubs/authorizationRules', s.namespaceName, s.eventHubName, s.ruleName), '2022-10-01-preview').primaryConnectionString : (((s.source) == 'storage') ? storageConnectionString : (((s.source) == 'appInsights') ? appInsights.properties.ConnectionString : s.value))))
      }]
    }
  }
}

// One of the two is deployed; ARM evaluates only the branch a condition takes.
output name string = appName
output principalId string = (isFlex) ? flexSite.outputs.principalId : premiumSite.outputs.principalId
output defaultHostName string = (isFlex) ? flexSite.outputs.defaultHostName : premiumSite.outputs.defaultHostName
