// DNS-based failover (the federation guidance's scheme, replication/failover/dns.py):
//
//   _azure_servicebus._amqp.sb1.<zone>  SRV  1 1 5671 <primary>.servicebus.windows.net
//                                        SRV  2 2 443  <primary>.servicebus.windows.net
//   _azure_servicebus._amqp.sb2.<zone>  SRV  1 1 5671 <secondary>.servicebus.windows.net
//                                        SRV  2 2 443  <secondary>.servicebus.windows.net
//   <alias>.<zone>                       CNAME sb1.<zone>   (or sb2: the active namespace)
//
// The resolver asks for the CNAME of the alias, then for SRV records at
// `_azure_servicebus._amqp.` + the canonical name, and keeps port 5671 (443 is AMQP over
// WebSockets, for clients that need it). sb1 and sb2 are names inside this zone rather than
// delegated child zones: the answers are the same and there is one zone to manage.
// Failing over is pointing the CNAME at the other name: redeploy with the other
// `activeNamespace`, or
//   az network dns record-set cname set-record -g <rg> -z <zone> -n <alias> -c sb2.<zone>
// Keep the TTL short: clients re-resolve when it expires.

@description('The zone, e.g. test.example.com (delegate it from the parent zone with the name servers in the outputs).')
param zoneName string

@description('The alias label: <aliasName>.<zoneName> is what a pipeline\'s failover dns alias names.')
param aliasName string = 'servicebus'

@allowed([
  'sb1'
  'sb2'
])
param activeLabel string = 'sb1'

@description('Host of the primary namespace (<name>.servicebus.windows.net).')
param primaryHost string

@description('Host of the secondary namespace.')
param secondaryHost string

@minValue(1)
param ttl int = 60

param tags object = {}

var namespaceNames = [
  {
    label: 'sb1'
    host: primaryHost
  }
  {
    label: 'sb2'
    host: secondaryHost
  }
]

resource zone 'Microsoft.Network/dnsZones@2018-05-01' = {
  name: zoneName
  location: 'global'
  tags: tags
  properties: {
    zoneType: 'Public'
  }
}

resource srv 'Microsoft.Network/dnsZones/SRV@2018-05-01' = [for n in namespaceNames: {
  parent: zone
  name: '_azure_servicebus._amqp.${n.label}'
  properties: {
    TTL: ttl
    SRVRecords: [
      {
        priority: 1
        weight: 1
        port: 5671
        target: n.host
      }
      {
        priority: 2
        weight: 2
        port: 443
        target: n.host
      }
    ]
  }
}]

resource alias 'Microsoft.Network/dnsZones/CNAME@2018-05-01' = {
  parent: zone
  name: aliasName
  properties: {
    TTL: ttl
    CNAMERecord: {
      cname: '${activeLabel}.${zoneName}'
    }
  }
}

output aliasFqdn string = '${aliasName}.${zoneName}'
output nameServers array = zone.properties.nameServers
