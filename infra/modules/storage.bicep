// The Function App's own storage account: the host's state (AzureWebJobsStorage: locks,
// keys, timers), the Flex Consumption deployment container and, on Elastic Premium, the
// content file share. Replicated messages never touch it: they live in Service Bus.

@description('Storage account name: 3-24 lower-case letters and digits, globally unique.')
@minLength(3)
@maxLength(24)
param name string

param location string

param tags object = {}

@description('Blob container the Flex Consumption plan deploys the app package from.')
param deploymentContainerName string

@description('Azure Files share holding the app content on Elastic Premium; empty: none.')
param contentShareName string = ''

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_GRS'
  }
  // checkov:skip=CKV_AZURE_35: the Functions host reaches its storage over the public endpoint: without VNet integration (not in this template) a firewall that denies by default stops the app; access needs the account key or the app's identity
  // checkov:skip=CKV_AZURE_59: same reason as CKV_AZURE_35: the Function App has no private network path to the account, so the public endpoint stays enabled (keys or Entra ID still required)
  properties: {
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      services: {
        blob: {
          enabled: true
        }
        file: {
          enabled: true
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource fileService 'Microsoft.Storage/storageAccounts/fileServices@2023-05-01' = if (!empty(contentShareName)) {
  parent: storage
  name: 'default'
}

resource contentShare 'Microsoft.Storage/storageAccounts/fileServices/shares@2023-05-01' = if (!empty(contentShareName)) {
  parent: fileService
  name: contentShareName
}

output name string = storage.name
output blobEndpoint string = storage.properties.primaryEndpoints.blob
