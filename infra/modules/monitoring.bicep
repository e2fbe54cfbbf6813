// Application Insights on a Log Analytics workspace: the Functions host's logs, the
// replication functions' logs (a failover switch, an abandoned batch) and their traces.

param logAnalyticsName string

param applicationInsightsName string

param location string

param tags object = {}

@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
  }
}

// The name only: the Function App reads the connection string itself (no key in outputs).
output applicationInsightsName string = appInsights.name

// The scope of the alert rules (modules/alerts.bicep).
output applicationInsightsId string = appInsights.id
