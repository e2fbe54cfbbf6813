#!/usr/bin/env node
// What each of @azure/service-bus's published JavaScript samples (samples/v7/javascript in
// azure-sdk-for-js) does, replayed against the embedded broker and checked: the samples
// themselves only print, and they are not ours to copy, so each scenario here does what its
// namesake does, through the same SDK calls, and fails when the outcome is wrong.
//
//   node samples.mjs <scenario>
//
// Settings come from the samples' own environment variables: SERVICEBUS_CONNECTION_STRING,
// QUEUE_NAME (an empty queue, MaxDeliveryCount 10), QUEUE_NAME_WITH_SESSIONS (an empty
// session queue), and for usingNamedKeyCredential SERVICEBUS_FQDN, SERVICEBUS_SAS_POLICY,
// SERVICEBUS_SAS_KEY. The administration client needs NODE_EXTRA_CA_CERTS (the broker's CA).
// Prints one JSON line {"ok": true|false, "scenario", ...what it saw}; exit 0 on success, 1 on
// a failed check or an SDK error, 2 on bad usage.

import http from "node:http";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { AzureNamedKeyCredential } from "@azure/core-auth";
import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";
import { ServiceBusClient as BetaServiceBusClient } from "@azure/service-bus-beta";
import { HttpsProxyAgent } from "https-proxy-agent";
import WebSocket from "ws";

const env = process.env;
const connectionString = env.SERVICEBUS_CONNECTION_STRING ?? "";
const queueName = env.QUEUE_NAME ?? "";
const sessionQueueName = env.QUEUE_NAME_WITH_SESSIONS ?? "";
/** How long a step waits for messages the broker already holds. */
const WAIT_MS = 10_000;

class CheckError extends Error {}

function check(condition, message) {
  if (!condition) throw new CheckError(message);
}

function checkEqual(actual, expected, what) {
  const [a, e] = [JSON.stringify(actual), JSON.stringify(expected)];
  check(a === e, `${what}: got ${a}, expected ${e}`);
}

const bodies = (prefix, count) => Array.from({ length: count }, (_, i) => `${prefix} ${i}`);

/** Receives until ``count`` messages arrived (settling each with ``settle``) or WAIT_MS. */
async function receiveAll(receiver, count, settle = (m) => receiver.completeMessage(m)) {
  const received = [];
  const deadline = Date.now() + WAIT_MS;
  while (received.length < count && Date.now() < deadline) {
    const batch = await receiver.receiveMessages(count - received.length, {
      maxWaitTimeInMs: 1000,
    });
    for (const message of batch) {
      if (settle) await settle(message);
      received.push(message);
    }
  }
  checkEqual(received.length, count, "messages received");
  return received;
}

async function leftIn(client, entity, options = {}) {
  const receiver = client.createReceiver(entity, options);
  const peeked = await receiver.peekMessages(100);
  await receiver.close();
  return peeked.length;
}

async function send(client, entity, messages) {
  const sender = client.createSender(entity);
  await sender.sendMessages(messages);
  await sender.close();
}

const SCENARIOS = {
  async sendMessages(client) {
    const sender = client.createSender(queueName);
    const texts = bodies("sent", 10);
    await sender.sendMessages(texts.slice(0, 2).map((body) => ({ body })));
    let batch = await sender.createMessageBatch();
    for (const body of texts.slice(2)) {
      if (!batch.tryAddMessage({ body })) {
        await sender.sendMessages(batch);
        batch = await sender.createMessageBatch();
        check(batch.tryAddMessage({ body }), "a small message does not fit an empty batch");
      }
    }
    await sender.sendMessages(batch);
    await sender.close();
    const receiver = client.createReceiver(queueName);
    const peeked = await receiver.peekMessages(20);
    checkEqual(
      peeked.map((m) => m.body),
      texts,
      "bodies peeked in order",
    );
    return { sent: texts.length, peeked: peeked.length };
  },

  async receiveMessagesLoop(client) {
    await send(client, queueName, bodies("loop", 10).map((body) => ({ body })));
    const receiver = client.createReceiver(queueName);
    const received = [];
    for (let round = 0; round < 20 && received.length < 10; round++) {
      for (const message of await receiver.receiveMessages(4, { maxWaitTimeInMs: 1000 })) {
        await receiver.completeMessage(message);
        received.push(message.body);
      }
    }
    checkEqual(received, bodies("loop", 10), "bodies received in order");
    await receiver.close();
    checkEqual(await leftIn(client, queueName), 0, "messages left");
    return { received: received.length };
  },

  async receiveMessagesStreaming(client) {
    await send(client, queueName, bodies("stream", 10).map((body) => ({ body })));
    const receiver = client.createReceiver(queueName);
    const received = [];
    const errors = [];
    const subscription = receiver.subscribe({
      processMessage: async (message) => received.push(message.body),
      processError: async (args) => errors.push(`${args.errorSource}: ${args.error.message}`),
    });
    const deadline = Date.now() + WAIT_MS;
    while (received.length < 10 && Date.now() < deadline) await sleep(100);
    await sleep(500); // completing (autoCompleteMessages) follows processMessage
    await subscription.close();
    await receiver.close();
    checkEqual(errors, [], "errors reported to processError");
    checkEqual(received, bodies("stream", 10), "bodies received in order");
    checkEqual(await leftIn(client, queueName), 0, "messages left after auto-complete");
    return { received: received.length };
  },

  async browseMessages(client) {
    await send(client, queueName, bodies("browse", 10).map((body) => ({ body })));
    const receiver = client.createReceiver(queueName);
    const first = await receiver.peekMessages(10);
    const again = await receiver.peekMessages(10);
    checkEqual(first.map((m) => m.body), bodies("browse", 10), "bodies browsed");
    checkEqual(again.length, 0, "a second peek continues after the first (none left)");
    const fromStart = await receiver.peekMessages(10, { fromSequenceNumber: first[0].sequenceNumber });
    checkEqual(fromStart.length, 10, "peeked again from the first sequence number");
    const [message] = await receiveAll(receiver, 1, null);
    checkEqual(message.deliveryCount, 0, "delivery count after browsing");
    await receiver.close();
    return { browsed: first.length };
  },

  async exceedMaxDeliveryCount(client) {
    await send(client, queueName, { body: "poison", messageId: "poison" });
    const receiver = client.createReceiver(queueName);
    let deliveries = 0;
    for (;;) {
      const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 1000 });
      if (!message) break;
      checkEqual(message.deliveryCount, deliveries, "delivery count");
      deliveries += 1;
      await receiver.abandonMessage(message);
    }
    await receiver.close();
    const deadLetters = client.createReceiver(queueName, { subQueueType: "deadLetter" });
    const [dead] = await receiveAll(deadLetters, 1);
    await deadLetters.close();
    checkEqual(dead.messageId, "poison", "dead-lettered message");
    checkEqual(dead.deadLetterReason, "MaxDeliveryCountExceeded", "dead-letter reason");
    return { deliveries, reason: dead.deadLetterReason };
  },

  async scheduledMessages(client) {
    const sender = client.createSender(queueName);
    const when = new Date(Date.now() + 3000);
    const sequenceNumbers = await sender.scheduleMessages(
      bodies("later", 10).map((body) => ({ body })),
      when,
    );
    await sender.close();
    checkEqual(sequenceNumbers.length, 10, "sequence numbers returned");
    const receiver = client.createReceiver(queueName);
    const peeked = await receiver.peekMessages(10);
    checkEqual(peeked.map((m) => m.state), Array(10).fill("scheduled"), "state while scheduled");
    const early = await receiver.receiveMessages(10, { maxWaitTimeInMs: 1000 });
    checkEqual(early.length, 0, "messages received before their time");
    const received = await receiveAll(receiver, 10);
    check(Date.now() >= when.getTime() - 50, "received before the scheduled time");
    await receiver.close();
    return { early: early.length, received: received.length };
  },

  async deferral(client) {
    const steps = ["first", "second", "third", "fourth"];
    const shuffled = [2, 0, 3, 1].map((i) => ({
      body: steps[i],
      subject: "recipe",
      applicationProperties: { step: i },
    }));
    await send(client, queueName, shuffled);
    const receiver = client.createReceiver(queueName);
    const deferred = new Map();
    const processed = [];
    let next = 0;
    for (const message of await receiveAll(receiver, 4, null)) {
      if (message.applicationProperties.step === next) {
        processed.push(message.body);
        await receiver.completeMessage(message);
        next += 1;
      } else {
        deferred.set(message.applicationProperties.step, message.sequenceNumber);
        await receiver.deferMessage(message);
      }
    }
    while (deferred.has(next)) {
      const [message] = await receiver.receiveDeferredMessages(deferred.get(next));
      checkEqual(message.state, "deferred", "state of a deferred message");
      processed.push(message.body);
      await receiver.completeMessage(message);
      next += 1;
    }
    await receiver.close();
    checkEqual(processed, steps, "steps processed in order");
    checkEqual(await leftIn(client, queueName), 0, "messages left");
    return { deferred: deferred.size, processed };
  },

  async movingMessagesToDLQ(client) {
    await send(client, queueName, { body: { name: "Creamy Chicken Pasta", type: "Dinner" } });
    const receiver = client.createReceiver(queueName);
    const [message] = await receiveAll(receiver, 1, null);
    await receiver.deadLetterMessage(message, {
      deadLetterReason: "Incorrect Recipe type",
      deadLetterErrorDescription: "Recipe type does not match preferences.",
    });
    await receiver.close();
    const deadLetters = client.createReceiver(queueName, { subQueueType: "deadLetter" });
    const [dead] = await receiveAll(deadLetters, 1);
    await deadLetters.close();
    checkEqual(dead.body, message.body, "dead-lettered body");
    checkEqual(
      [dead.deadLetterReason, dead.deadLetterErrorDescription],
      ["Incorrect Recipe type", "Recipe type does not match preferences."],
      "dead-letter reason and description",
    );
    return { reason: dead.deadLetterReason };
  },

  async processMessageFromDLQ(client) {
    await send(client, queueName, { body: { name: "Pasta", type: "Dessert" }, messageId: "fix-me" });
    const receiver = client.createReceiver(queueName);
    const [message] = await receiveAll(receiver, 1, null);
    await receiver.deadLetterMessage(message, { deadLetterReason: "Wrong type" });
    const deadLetters = client.createReceiver(queueName, { subQueueType: "deadLetter" });
    const [dead] = await receiveAll(deadLetters, 1, null);
    const repaired = { body: { ...dead.body, type: "Dinner" }, messageId: dead.messageId };
    await send(client, queueName, repaired);
    await deadLetters.completeMessage(dead);
    await deadLetters.close();
    const [again] = await receiveAll(receiver, 1);
    await receiver.close();
    checkEqual(again.body, repaired.body, "resubmitted body");
    checkEqual(again.messageId, "fix-me", "resubmitted message-id");
    checkEqual(await leftIn(client, queueName, { subQueueType: "deadLetter" }), 0, "dead letters left");
    return { resubmitted: again.messageId };
  },

  async session(client) {
    const sessions = ["session-1", "session-2"];
    const messages = bodies("step", 5).flatMap((body) =>
      sessions.map((sessionId) => ({ body: `${sessionId} ${body}`, sessionId })),
    );
    await send(client, sessionQueueName, messages);
    const got = {};
    for (const sessionId of sessions) {
      const receiver = await client.acceptSession(sessionQueueName, sessionId);
      got[sessionId] = (await receiveAll(receiver, 5)).map((m) => m.body);
      checkEqual(got[sessionId], bodies(`${sessionId} step`, 5), `${sessionId} in order`);
      await receiver.close();
    }
    return { sessions: got };
  },

  async sessionState(client) {
    await send(client, sessionQueueName, [
      { body: "Milk", sessionId: "alice" },
      { body: "Bread", sessionId: "alice" },
    ]);
    let receiver = await client.acceptSession(sessionQueueName, "alice");
    const items = [];
    for (const message of await receiveAll(receiver, 2)) {
      items.push(message.body);
      await receiver.setSessionState(JSON.stringify(items));
    }
    await receiver.close();
    receiver = await client.acceptSession(sessionQueueName, "alice");
    const kept = JSON.parse(String(await receiver.getSessionState()));
    await receiver.setSessionState(JSON.stringify([]));
    const cleared = JSON.parse(String(await receiver.getSessionState()));
    await receiver.close();
    checkEqual(kept, ["Milk", "Bread"], "session state after the session was released");
    checkEqual(cleared, [], "session state after clearing");
    return { kept, cleared };
  },

  async sessionRoundRobin(client) {
    const sessions = ["rr-a", "rr-b", "rr-c", "rr-d"];
    await send(
      client,
      sessionQueueName,
      sessions.flatMap((sessionId) => bodies(sessionId, 3).map((body) => ({ body, sessionId }))),
    );
    const got = {};
    while (Object.keys(got).length < sessions.length) {
      const receiver = await client.acceptNextSession(sessionQueueName, {
        maxAutoLockRenewalDurationInMs: 10_000,
      });
      check(!(receiver.sessionId in got), `session ${receiver.sessionId} offered twice`);
      got[receiver.sessionId] = (await receiveAll(receiver, 3)).map((m) => m.body);
      await receiver.close();
    }
    for (const sessionId of sessions) {
      checkEqual(got[sessionId], bodies(sessionId, 3), `${sessionId} in order`);
    }
    return { order: Object.keys(got) };
  },

  async topicSubscriptionWithRuleOperationsSample(client) {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const [topic, subscription] = ["colors-topic", "red-only"];
    await admin.createTopic(topic);
    await admin.createSubscription(topic, subscription);
    const rules = client.createRuleManager(topic, subscription);
    await rules.deleteRule("$Default");
    await rules.createRule("red", { sqlExpression: "color = 'red'" });
    const colors = ["red", "blue", "green", "red", "blue", "red"];
    await send(
      client,
      topic,
      colors.map((color, i) => ({ body: `${color} ${i}`, applicationProperties: { color } })),
    );
    const receiver = client.createReceiver(topic, subscription);
    const received = (await receiveAll(receiver, 3)).map((m) => m.body);
    const more = await receiver.receiveMessages(5, { maxWaitTimeInMs: 1000 });
    await receiver.close();
    await admin.deleteTopic(topic);
    checkEqual(received, ["red 0", "red 3", "red 5"], "messages the rule let through");
    checkEqual(more.length, 0, "messages the rule kept out");
    return { received };
  },

  async ruleManager(client) {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const [topic, subscription] = ["rules-topic", "rules-subscription"];
    await admin.createTopic(topic);
    await admin.createSubscription(topic, subscription);
    // "Managing subscription-level rules only requires Listen claim" (the sample): a
    // listen-only key when the test gives one, and one without Listen is refused by name
    const listenOnly = env.SERVICEBUS_LISTEN_CONNECTION_STRING;
    const listening = listenOnly ? new ServiceBusClient(listenOnly) : client;
    const rules = listening.createRuleManager(topic, subscription);
    let refusal = null;
    if (env.SERVICEBUS_SEND_CONNECTION_STRING) {
      const sendOnly = new ServiceBusClient(env.SERVICEBUS_SEND_CONNECTION_STRING, {
        retryOptions: { maxRetries: 0 },
      });
      try {
        for await (const rule of sendOnly.createRuleManager(topic, subscription).listRules()) {
          check(false, `a send-only key listed rule ${rule.name}`);
        }
      } catch (error) {
        if (error instanceof CheckError) throw error;
        refusal = `${error.code}: ${error.message.split(" TrackingId")[0]}`;
      } finally {
        await sendOnly.close();
      }
      check(refusal?.includes("Listen"), `a send-only key's refusal names Listen: ${refusal}`);
    }
    await rules.createRule("sql", { sqlExpression: "priority > 2" });
    await rules.createRule("correlation", { correlationId: "order-1", subject: "created" });
    await rules.createRule("with-action", { sqlExpression: "1=1" }, { sqlExpression: "SET a = 1" });
    const names = [];
    for await (const rule of rules.listRules()) names.push(rule.name);
    const pages = [];
    for await (const page of rules.listRules().byPage({ maxPageSize: 2 })) pages.push(page.length);
    await rules.deleteRule("sql");
    const after = [];
    for await (const rule of rules.listRules()) after.push(rule.name);
    await admin.deleteTopic(topic);
    if (listening !== client) await listening.close();
    checkEqual(names.sort(), ["$Default", "correlation", "sql", "with-action"], "rules listed");
    checkEqual(pages, [2, 2], "rules listed in pages of 2");
    checkEqual(after.sort(), ["$Default", "correlation", "with-action"], "rules after a delete");
    return { names, pages, after, refusal };
  },

  async listingEntities() {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const made = ["list-a", "list-b", "list-c"];
    for (const name of made) await admin.createQueue(name);
    const all = [];
    for await (const queue of admin.listQueues()) all.push(queue.name);
    const pages = [];
    const firstPage = admin.listQueues().byPage({ maxPageSize: 2 });
    const first = await firstPage.next();
    pages.push(first.value.map((q) => q.name));
    let token = first.value.continuationToken;
    while (token) {
      const page = await admin.listQueues().byPage({ maxPageSize: 2, continuationToken: token }).next();
      pages.push(page.value.map((q) => q.name));
      token = page.value.continuationToken;
    }
    const runtime = [];
    for await (const queue of admin.listQueuesRuntimeProperties()) runtime.push(queue.name);
    for (const name of made) await admin.deleteQueue(name);
    checkEqual(pages.flat().sort(), all.slice().sort(), "queues listed page by page");
    check(made.every((name) => all.includes(name)), `made queues missing from ${all}`);
    checkEqual(runtime.sort(), all.slice().sort(), "queues listed with runtime properties");
    return { queues: all, pages };
  },

  async administrationClient() {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const name = "admin-sample-queue";
    const created = await admin.createQueue(name);
    const got = await admin.getQueue(name);
    got.maxDeliveryCount = 12;
    const updated = await admin.updateQueue(got);
    const runtime = await admin.getQueueRuntimeProperties(name);
    const namespace = await admin.getNamespaceProperties();
    await admin.deleteQueue(name);
    const exists = await admin.queueExists(name);
    checkEqual(created.name, name, "created queue");
    checkEqual(updated.maxDeliveryCount, 12, "updated max delivery count");
    checkEqual(runtime.totalMessageCount, 0, "messages in a new queue");
    checkEqual(exists, false, "the queue exists after being deleted");
    return { namespace: namespace.name, maxDeliveryCount: updated.maxDeliveryCount };
  },

  async usingNamedKeyCredential() {
    const credential = new AzureNamedKeyCredential(env.SERVICEBUS_SAS_POLICY, env.SERVICEBUS_SAS_KEY);
    const client = new ServiceBusClient(env.SERVICEBUS_FQDN, credential);
    try {
      await send(client, queueName, { body: "named key" });
      const receiver = client.createReceiver(queueName);
      const [message] = await receiveAll(receiver, 1);
      await receiver.close();
      checkEqual(message.body, "named key", "body");
      return { received: message.body };
    } finally {
      await client.close();
    }
  },

  async useProxy() {
    const tunnels = [];
    const proxy = http.createServer();
    proxy.on("connect", (request, socket, head) => {
      const [host, port] = request.url.split(":");
      tunnels.push(request.url);
      const upstream = net.connect(Number(port), host, () => {
        socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
        upstream.write(head);
        upstream.pipe(socket);
        socket.pipe(upstream);
      });
      upstream.on("error", () => socket.destroy());
      socket.on("error", () => upstream.destroy());
    });
    await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    const agent = new HttpsProxyAgent(`http://127.0.0.1:${proxy.address().port}`);
    const client = new ServiceBusClient(connectionString, {
      webSocketOptions: { webSocket: WebSocket, webSocketConstructorOptions: { agent } },
    });
    try {
      await send(client, queueName, { body: "through the proxy" });
      const receiver = client.createReceiver(queueName);
      const [message] = await receiveAll(receiver, 1);
      await receiver.close();
      checkEqual(message.body, "through the proxy", "body");
      check(tunnels.length > 0, "nothing went through the proxy");
      return { tunnels: [...new Set(tunnels)] };
    } finally {
      await client.close();
      proxy.close();
    }
  },

  async deleteMessages() {
    const client = new BetaServiceBusClient(connectionString);
    try {
      const texts = bodies("delete", 10).map((body) => ({ body }));
      await send(client, queueName, texts);
      const receiver = client.createReceiver(queueName, { receiveMode: "receiveAndDelete" });
      const deleted = await receiver.deleteMessages({ maxMessageCount: 10 });
      await send(client, queueName, texts);
      const olderThan1970 = await receiver.deleteMessages({
        maxMessageCount: 10,
        beforeEnqueueTime: new Date(1970, 1, 1),
      });
      const purged = await receiver.purgeMessages();
      const left = (await receiver.peekMessages(20)).length;
      await receiver.close();
      checkEqual([deleted, olderThan1970, purged, left], [10, 0, 10, 0], "deleted, none older than 1970, purged, left");
      return { deleted, olderThan1970, purged };
    } finally {
      await client.close();
    }
  },
};

const scenario = process.argv[2];
if (process.argv.length !== 3 || !(scenario in SCENARIOS)) {
  process.stderr.write(`usage: node samples.mjs <${Object.keys(SCENARIOS).join("|")}>\n`);
  process.exit(2);
}
const client = new ServiceBusClient(connectionString, {
  retryOptions: { timeoutInMs: WAIT_MS, maxRetries: 0 }, // a failure shows at once
});
let exitCode = 0;
try {
  const seen = await SCENARIOS[scenario](client);
  process.stdout.write(`${JSON.stringify({ ok: true, scenario, ...seen })}\n`);
} catch (err) {
  exitCode = 1;
  const kind = err instanceof CheckError ? "check failed" : `${err.name} (${err.code ?? "-"})`;
  process.stdout.write(`${JSON.stringify({ ok: false, scenario, error: `${kind}: ${err.message}` })}\n`);
  if (!(err instanceof CheckError)) process.stderr.write(`${err.stack}\n`);
} finally {
  await client.close();
}
process.exit(exitCode);
