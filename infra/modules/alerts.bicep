// Alert rules on the replication app's telemetry, and the action group they notify
// (infra/README.md, "Alerts"; docs/alerts.md says which alert answers which question).
//
// The app exports OpenTelemetry metrics to Application Insights with the Azure Monitor
// exporter; they arrive as custom metrics, one row per series, app instance and export
// interval (60 s) in the component's `customMetrics` table:
//   - a counter (delta temporality) as its increase in the interval: `value` (= valueSum);
//   - a gauge as its last value: `value`;
//   - a histogram as the interval's aggregate: valueSum, valueCount, valueMin, valueMax;
//   - the metric's attributes as customDimensions.
// Each log-search rule below summarizes one metric per series (its dimensions) over the
// window, so the rule's own aggregation sees one row per series, and compares that with the
// threshold. The rules are stateful (autoMitigate): one notification when a series breaks
// its threshold, one when it is back.
//
// Dead letters: the app's counter (replication_dead_lettered_messages) counts what a step
// dead-lettered (or sent to the error target), per pipeline; it cannot see what the broker
// dead-letters by itself (a message past maxDeliveryCount after failed batches, an expired
// one). The namespaces' platform metric DeadletteredMessages (per EntityName) can, so both
// are watched: the log-search rule for new dead letters of a pipeline, a metric alert per
// namespace for dead-letter queues holding messages.
//
// Conditions are written in parentheses: pycep, the parser checkov and tests/infra use, does
// not know operator precedence.

@description('Prefix of the rule and action group names (main.bicep: appName).')
param namePrefix string

param location string

param tags object = {}

@description('Resource id of the Application Insights component the app sends its metrics to: the rules\' scope.')
param applicationInsightsId string

@description('Service Bus namespaces whose dead-letter queues are watched (platform metric DeadletteredMessages).')
param serviceBusNamespaceNames array = []

@description('E-mail address the action group notifies; empty: none.')
param alertEmail string = ''

@description('Webhook the action group calls (common alert schema); empty: none. A webhook URL carries its own token, hence secure.')
@secure()
param alertWebhookUrl string = ''

@description('Replication lag alert: a copy accepted more than this many seconds after its source enqueued it.')
@minValue(1)
param lagSeconds int = 60

@description('RPO alert: the oldest message not yet replicated at a source is older than this many seconds.')
@minValue(1)
param rpoSeconds int = 300

@description('Dead letters alert: more than this many source messages dead-lettered by a pipeline in the window.')
@minValue(0)
param deadLetteredMessages int = 0

@description('Failed batches alert: more than this many batches abandoned for redelivery by a pipeline in the window.')
@minValue(0)
param failedBatches int = 0

@description('Failover alert: more than this many switches of a failover endpoint in the window.')
@minValue(0)
param failovers int = 0

@description('Dead-letter queue alert: more than this many messages in the dead-letter queue of a Service Bus entity.')
@minValue(0)
param deadLetterQueueMessages int = 0

// Values both kinds of rule take (metric alerts take fewer than log-search rules).
@description('How often the rules run.')
@allowed([
  'PT1M'
  'PT5M'
  'PT15M'
  'PT30M'
  'PT1H'
])
param evaluationFrequency string = 'PT5M'

@description('The time each evaluation looks back over: at least evaluationFrequency.')
@allowed([
  'PT5M'
  'PT15M'
  'PT30M'
  'PT1H'
  'PT6H'
  'PT12H'
  'P1D'
])
param windowSize string = 'PT15M'

var emailReceivers = (empty(alertEmail)) ? [] : [
  {
    name: 'email'
    emailAddress: alertEmail
    useCommonAlertSchema: true
  }
]

var webhookReceivers = (empty(alertWebhookUrl)) ? [] : [
  {
    name: 'webhook'
    serviceUri: alertWebhookUrl
    useCommonAlertSchema: true
  }
]

// Without a receiver there is no action group: the alerts still fire and show in Azure
// Monitor (Alerts), they notify nobody.
var notify = (!empty(emailReceivers)) || (!empty(webhookReceivers))

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (notify) {
  name: 'ag-${namePrefix}-replication'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: take('repl${namePrefix}', 12)
    enabled: true
    emailReceivers: emailReceivers
    webhookReceivers: webhookReceivers
  }
}

// A rule's dimensions: one alert per value of each. Written out rather than made by a
// property loop inside the rules' resource loop, which Bicep may refuse (nested loops).
var byPipeline = {
  name: 'pipeline'
  operator: 'Include'
  values: [
    '*'
  ]
}

var byTarget = {
  name: 'target'
  operator: 'Include'
  values: [
    '*'
  ]
}

var bySource = {
  name: 'source'
  operator: 'Include'
  values: [
    '*'
  ]
}

var byEndpoint = {
  name: 'endpoint'
  operator: 'Include'
  values: [
    '*'
  ]
}

// One log-search rule per entry: `query` yields one row per series with the `measure` column
// compared with `threshold` (GreaterThan); `dimensions` split the alert per series.
var logAlerts = [
  {
    name: 'replication-lag'
    displayName: 'Replication lag above ${lagSeconds} s'
    severity: 2
    description: 'A target accepted a copy more than ${lagSeconds} s after the source enqueued it (replication_lag_seconds, the slowest copy of the window, per pipeline and target; path lag where a message crossed several hops). Look at the target: throttling (ThrottledRequests), errors, a failover in progress; then at the Function App: instances at their limit, slow steps. Lag after an outage is the backlog draining: it falls back by itself.'
    query: '''
customMetrics
| where name == "replication_lag_seconds"
| extend pipeline = tostring(customDimensions.pipeline), target = tostring(customDimensions.target)
| summarize lag_seconds = max(valueMax) by pipeline, target
'''
    measure: 'lag_seconds'
    aggregation: 'Maximum'
    dimensions: [
      byPipeline
      byTarget
    ]
    threshold: lagSeconds
  }
  {
    name: 'replication-rpo'
    displayName: 'Source RPO above ${rpoSeconds} s'
    severity: 1
    description: 'The oldest message not yet replicated at a source is older than ${rpoSeconds} s (replication_rpo_seconds per pipeline and source; replication_rpo_messages counts them): losing the source now loses that much. Check that the function runs and receives (replication_received_messages), that the target accepts (failed batches, dead letters, Service Bus ServerErrors), and scale out (maximumInstanceCount) if it only falls behind.'
    query: '''
customMetrics
| where name == "replication_rpo_seconds"
| extend pipeline = tostring(customDimensions.pipeline), source = tostring(customDimensions.source)
| summarize rpo_seconds = max(value) by pipeline, source
'''
    measure: 'rpo_seconds'
    aggregation: 'Maximum'
    dimensions: [
      byPipeline
      bySource
    ]
    threshold: rpoSeconds
  }
  {
    name: 'replication-dead-letters'
    displayName: 'Dead letters growing'
    severity: 2
    description: 'A pipeline dead-lettered (or sent to its error target) more than ${deadLetteredMessages} source messages in the window because a step said so (replication_dead_lettered_messages): they are not replicated unless resubmitted. Peek the source dead-letter queue (python -m replication peek <entity>/$DeadLetterQueue) or the error target: DeadLetterReason names the step and the problem; fix the message or the pipeline, then resubmit.'
    query: '''
customMetrics
| where name == "replication_dead_lettered_messages"
| extend pipeline = tostring(customDimensions.pipeline)
| summarize dead_lettered = sum(value) by pipeline
'''
    measure: 'dead_lettered'
    aggregation: 'Total'
    dimensions: [
      byPipeline
    ]
    threshold: deadLetteredMessages
  }
  {
    name: 'replication-failed-batches'
    displayName: 'Failed batches'
    severity: 2
    description: 'A pipeline abandoned more than ${failedBatches} batches for redelivery in the window (replication_failed_batches): a target or a step is failing. Find the exception in the Function App log (traces and exceptions of the pipeline); each redelivery counts towards maxDeliveryCount, after which the broker dead-letters the message.'
    query: '''
customMetrics
| where name == "replication_failed_batches"
| extend pipeline = tostring(customDimensions.pipeline)
| summarize failed_batches = sum(value) by pipeline
'''
    measure: 'failed_batches'
    aggregation: 'Total'
    dimensions: [
      byPipeline
    ]
    threshold: failedBatches
  }
  {
    name: 'replication-failovers'
    displayName: 'Failover'
    severity: 1
    description: 'A failover endpoint switched to a newly resolved namespace more than ${failovers} times in the window (replication_failovers per endpoint). If nobody moved the DNS alias on purpose, the active namespace failed: check Service Health for Service Bus, move source triggers that read the failed namespace (README: Runbook: fail over and fail back) and plan the fail back.'
    query: '''
customMetrics
| where name == "replication_failovers"
| extend endpoint = tostring(customDimensions.endpoint)
| summarize failovers = sum(value) by endpoint
'''
    measure: 'failovers'
    aggregation: 'Total'
    dimensions: [
      byEndpoint
    ]
    threshold: failovers
  }
]

resource logAlert 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [for rule in logAlerts: {
  name: '${namePrefix}-${rule.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: rule.displayName
    description: rule.description
    severity: rule.severity
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: evaluationFrequency
    windowSize: windowSize
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: rule.query
          timeAggregation: rule.aggregation
          metricMeasureColumn: rule.measure
          dimensions: rule.dimensions
          operator: 'GreaterThan'
          threshold: rule.threshold
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: (notify) ? [
        actionGroup.id
      ] : []
    }
  }
}]

// The broker's own count of dead letters, per entity: also what no pipeline step decided
// (past maxDeliveryCount, expired). A level, not a rate: the alert stays until the queue is
// emptied (resubmitted or deleted) or the threshold is raised.
resource deadLetterQueue 'Microsoft.Insights/metricAlerts@2018-03-01' = [for namespaceName in serviceBusNamespaceNames: {
  name: '${namePrefix}-dead-letter-queue-${namespaceName}'
  location: 'global'
  tags: tags
  properties: {
    description: 'A dead-letter queue of namespace ${namespaceName} holds more than ${deadLetterQueueMessages} messages (DeadletteredMessages per EntityName). Peek it (python -m replication peek <entity>/$DeadLetterQueue): MaxDeliveryCountExceeded after failed batches or a target outage, TTLExpiredException for messages that waited too long, a step\'s reason otherwise; resubmit or delete them once the cause is fixed.'
    severity: 2
    enabled: true
    scopes: [
      resourceId('Microsoft.ServiceBus/namespaces', namespaceName)
    ]
    evaluationFrequency: evaluationFrequency
    windowSize: windowSize
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadletteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: deadLetterQueueMessages
          timeAggregation: 'Average'
        }
      ]
    }
    actions: (notify) ? [
      {
        actionGroupId: actionGroup.id
      }
    ] : []
  }
}]
