// The Function App on a Flex Consumption (FC1) plan (functionapp.bicep chooses this module for
// functionPlan FC1). Flex Consumption takes the runtime, the blob container its package is
// deployed to and the scale limits from the site's functionAppConfig, and refuses siteConfig
// properties of the other plans (linuxFxVersion, ftpsState, use32BitWorkerProcess, ...: ARM
// error 51021) and ignores the app settings functionAppConfig replaces
// (FUNCTIONS_WORKER_RUNTIME, FUNCTIONS_EXTENSION_VERSION, WEBSITE_RUN_FROM_PACKAGE,
// WEBSITE_CONTENT*): none of them is declared here or in the settings functionapp.bicep
// gives this module.

param appName string

param planName string

param location string

param tags object = {}

param storageAccountName string

@description('The blob container (made by storage.bicep) the app package is deployed to.')
param deploymentContainerName string

@description('{ items: [{ name, value }] }: the app settings, values resolved (connection strings among them).')
@secure()
param appSettings object

@description('Most instances the app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Memory of an instance.')
@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Spread the plan over availability zones (region support needed).')
param zoneRedundant bool = false

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

// Scale belongs to the site (functionAppConfig.scaleAndConcurrency): the plan has no more.
resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  // checkov:skip=CKV_AZURE_225: zone redundancy is the zoneRedundant parameter (off by default): not every region offers it, and on Elastic Premium it means 3 instances always running
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
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
    functionAppConfig: {
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
    }
    siteConfig: {
      // checkov:skip=CKV_AZURE_212: instance counts are the platform's: Flex Consumption and Elastic Premium scale out on queue length (maximumInstanceCount / maximumElasticWorkerCount)
      // checkov:skip=CKV_AZURE_213: there is no HTTP endpoint to probe: the functions are Service Bus and Event Hubs triggers and the platform watches the Functions host itself
      // checkov:skip=CKV_AZURE_78: Flex Consumption refuses siteConfig.ftpsState (ARM error 51021) and takes code only from the functionAppConfig deployment container
      minTlsVersion: '1.2'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: appSettings.items
    }
  }
}

var blobContributorRoleId = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor

// The platform reads (and deployments write) the package in the container with the site's identity.
resource deploymentAccess 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deploymentContainer.id, site.id, blobContributorRoleId)
  scope: deploymentContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobContributorRoleId)
    principalId: site.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

output principalId string = site.identity.principalId
output defaultHostName string = site.properties.defaultHostName
