// The Function App on an Elastic Premium (EP1) plan (functionapp.bicep chooses this module for
// functionPlan EP1): the runtime is linuxFxVersion, and the settings functionapp.bicep gives
// carry FUNCTIONS_WORKER_RUNTIME, FUNCTIONS_EXTENSION_VERSION and the Azure Files content
// share (WEBSITE_CONTENTSHARE, WEBSITE_CONTENTAZUREFILECONNECTIONSTRING).

param appName string

param planName string

param location string

param tags object = {}

@description('{ items: [{ name, value }] }: the app settings, values resolved (connection strings among them).')
@secure()
param appSettings object

@description('Most instances the plan scales out to.')
@minValue(1)
@maxValue(100)
param maximumElasticWorkerCount int = 20

@description('Spread the plan over availability zones (region support needed; Elastic Premium then keeps 3 instances).')
param zoneRedundant bool = false

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'elastic'
  sku: {
    name: 'EP1'
    tier: 'ElasticPremium'
  }
  // checkov:skip=CKV_AZURE_225: zone redundancy is the zoneRedundant parameter (off by default): not every region offers it, and on Elastic Premium it means 3 instances always running
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
    maximumElasticWorkerCount: maximumElasticWorkerCount
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: appName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // checkov:skip=CKV_AZURE_17: the app has no HTTP-triggered functions (Service Bus and Event Hubs triggers only): there is no call for client certificates to guard
    clientCertEnabled: false
    // checkov:skip=CKV_AZURE_222: deployment (func publish, zip deploy) reaches the app over its public endpoint; the app serves no HTTP functions and this template has no private network
    publicNetworkAccess: 'Enabled'
    siteConfig: {
      linuxFxVersion: 'Python|3.11'
      // checkov:skip=CKV_AZURE_212: instance counts are the platform's: Flex Consumption and Elastic Premium scale out on queue length (maximumInstanceCount / maximumElasticWorkerCount)
      // checkov:skip=CKV_AZURE_213: there is no HTTP endpoint to probe: the functions are Service Bus and Event Hubs triggers and the platform watches the Functions host itself
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: appSettings.items
    }
  }
}

output principalId string = site.identity.principalId
output defaultHostName string = site.properties.defaultHostName
