#!/usr/bin/env node
// @azure/event-hubs against the broker's Event Hubs face, as a JavaScript developer starts:
// a connection string with the hub's EntityPath (its $management reads put a token for
// "<hub>/$management", the SDK's own audience), a batch sent by partition key, events sent to
// a partition (one an AMQP annotated message with delivery annotations), and
// EventHubConsumerClient.subscribe reading every partition from the start.
//
//   EVENTHUB_CONNECTION_STRING=... node eventhubs.mjs
//
// Prints one JSON line {"ok": true|false, ...what it saw}; exit 0 on success, 1 otherwise.

import {
  EventHubConsumerClient,
  EventHubProducerClient,
  earliestEventPosition,
} from "@azure/event-hubs";

const connectionString = process.env.EVENTHUB_CONNECTION_STRING ?? "";
const WAIT_MS = 20_000;
const retryOptions = { maxRetries: 0, timeoutInMs: 10_000 };

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

async function main() {
  const producer = new EventHubProducerClient(connectionString, { retryOptions });
  const hub = await producer.getEventHubProperties();
  const keyed = await producer.createBatch({ partitionKey: "customer-7" });
  for (let i = 0; i < 10; i++) check(keyed.tryAdd({ body: `keyed ${i}` }), "batch room");
  await producer.sendBatch(keyed);
  const pinned = await producer.createBatch({ partitionId: "0" });
  for (let i = 0; i < 4; i++) check(pinned.tryAdd({ body: `pinned ${i}` }), "batch room");
  check(
    pinned.tryAdd({
      body: "annotated",
      bodyType: "data",
      deliveryAnnotations: { delann_key: "delann_value" },
    }),
    "batch room",
  );
  await producer.sendBatch(pinned);
  const partition0 = await producer.getPartitionProperties("0");
  await producer.close();

  const seen = [];
  const consumer = new EventHubConsumerClient("$Default", connectionString, { retryOptions });
  const errors = [];
  const subscription = consumer.subscribe(
    {
      processEvents: async (events, context) => {
        for (const event of events) seen.push({ event, partition: context.partitionId });
      },
      processError: async (error) => {
        errors.push(`${error.code ?? error.name}: ${error.message}`);
      },
    },
    { startPosition: earliestEventPosition, maxBatchSize: 50, maxWaitTimeInSeconds: 1 },
  );
  const deadline = Date.now() + WAIT_MS;
  while (seen.length < 15 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await subscription.close();
  await consumer.close();

  const bodies = seen.map(({ event }) => String(event.body)).sort();
  const keyedPartitions = new Set(
    seen.filter(({ event }) => String(event.body).startsWith("keyed")).map((s) => s.partition),
  );
  const annotated = seen.find(({ event }) => String(event.body) === "annotated");
  const deliveryAnnotations = annotated?.event.getRawAmqpMessage().deliveryAnnotations ?? {};
  check(errors.length === 0, `no errors: ${errors.join("; ")}`);
  check(hub.partitionIds.length === 2, `partition ids ${hub.partitionIds}`);
  check(partition0.lastEnqueuedSequenceNumber >= 4, "partition 0 holds the pinned events");
  check(seen.length === 15, `15 events read, got ${seen.length}`);
  check(keyedPartitions.size === 1, `one partition for one key: ${[...keyedPartitions]}`);
  check(deliveryAnnotations.delann_key === "delann_value", "the delivery annotations came");
  return { partitionIds: hub.partitionIds, bodies, keyedPartitions: [...keyedPartitions] };
}

main()
  .then((seen) => {
    console.log(JSON.stringify({ ok: true, ...seen }));
  })
  .catch((error) => {
    console.log(JSON.stringify({ ok: false, error: `${error.code ?? error.name}: ${error.message}` }));
    process.exitCode = 1;
  });
