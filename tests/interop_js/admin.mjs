#!/usr/bin/env node
// The JavaScript ServiceBusAdministrationClient (@azure/service-bus) against the embedded
// broker: it always calls https://<Endpoint host:port>/..., so the broker's CA must be
// trusted (NODE_EXTRA_CA_CERTS=<data dir>/tls/ca.pem, set by tests/broker/test_js_client.py).
//
//   node admin.mjs <connection string> <prefix>
//
// Creates a queue, a topic, a subscription and a SQL rule named <prefix>-..., lists them
// back, sends 3 messages to the queue over AMQP and reads the queue's runtime properties.
// Prints one JSON line: {"ok": true, "queues": [...], "topics": [...], ...}; exit 1 on error.

import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";

const [connectionString, prefix] = process.argv.slice(2);

async function names(iterator, field = "name") {
  const found = [];
  for await (const item of iterator) found.push(item[field]);
  return found;
}

async function main() {
  const admin = new ServiceBusAdministrationClient(connectionString);
  const queue = await admin.createQueue(`${prefix}-q`, { maxDeliveryCount: 7 });
  await admin.createTopic(`${prefix}-t`);
  await admin.createSubscription(`${prefix}-t`, "all");
  await admin.createRule(`${prefix}-t`, "all", "eu", { sqlExpression: "region = 'eu'" });
  const client = new ServiceBusClient(connectionString);
  const sender = client.createSender(`${prefix}-q`);
  await sender.sendMessages([1, 2, 3].map((n) => ({ body: `m${n}`, messageId: `m${n}` })));
  await sender.close();
  await client.close();
  const runtime = await admin.getQueueRuntimeProperties(`${prefix}-q`);
  const rules = await names(admin.listRules(`${prefix}-t`, "all"));
  let missing = null;
  try {
    await admin.getQueue(`${prefix}-none`);
  } catch (error) {
    missing = error.code ?? String(error);
  }
  return {
    ok: true,
    maxDeliveryCount: queue.maxDeliveryCount,
    queues: await names(admin.listQueues()),
    topics: await names(admin.listTopics()),
    subscriptions: await names(admin.listSubscriptions(`${prefix}-t`), "subscriptionName"),
    rules,
    activeMessageCount: runtime.activeMessageCount,
    missing,
    namespace: (await admin.getNamespaceProperties()).name,
  };
}

main().then(
  (result) => console.log(JSON.stringify(result)),
  (error) => {
    console.error(error);
    console.log(JSON.stringify({ ok: false, error: String(error), code: error.code ?? null }));
    process.exit(1);
  },
);
