#!/usr/bin/env node
// Round trips through a Service Bus (our embedded broker) with the JavaScript SDK,
// @azure/service-bus (rhea underneath): a second client, independent of the Python SDK.
//
//   node roundtrip.mjs <mode> [--connection-string CS] [--queue Q] [--topic T]
//                             [--subscription S] [--count N] [--timeout-ms MS]
//                             [--empty-timeout-ms MS]
//
// Modes:
//   queue    send one message and a batch to --queue, receive them in peek-lock and check
//            every field, complete / abandon (redelivered with deliveryCount 1) / dead-letter
//            (read back from the dead-letter sub-queue), then one receive-and-delete.
//   session  --queue requires sessions: two sessions, acceptSession(queue, "s1") and
//            acceptNextSession, FIFO inside each session, session state set and read back;
//            then acceptNextSession on the drained queue, with a client timeout of
//            --empty-timeout-ms (3000), must fail (reported: error code, time taken).
//   topic    send to --topic, receive from --topic/--subscription (every message expected).
//   send     only send the queue mode's messages to --queue (another client checks them).
//   receive  receive --count messages from --queue in peek-lock, complete them, report them.
//   management  peekMessages, scheduleMessages + cancelScheduledMessages, each on a fresh
//            connection (only the $management token there), then renewMessageLock.
//   no-message-id  send to --queue (one message and a batch of two) and to --topic (one)
//            without a messageId; receive them with lock auto-renewal on (the SDK's
//            default), abandon one and read it again, complete the rest; the queue's last
//            one through subscribe() streaming. Every message must come with a message-id
//            (Service Bus assigns one), the same on redelivery.
//   session-locks  --queue and --topic/--subscription require sessions, with a lock of
//            --lock-ms (60000): acceptSession on a fresh session (no messages yet) and
//            acceptNextSession, on both; the session lock, renewSessionLock and the
//            messages' locks must all be about now + --lock-ms, and receiving, session state
//            and completing must work on each.
//   ttl      send four messages with times to live (plain, 60 days, a sender clock an hour
//            behind, none) to --queue and receive them and --count more: each one's
//            timeToLive, expiresAtUtc, enqueuedTimeUtc.
//   large    --queue (and --session-queue, sessions on): messages of --size bytes (256000,
//            250 KiB) sent, received and completed (receiveMessages, subscribe(), a
//            session); nothing may come back.
//
// The connection string may come from SERVICEBUS_CONNECTION_STRING, entity names from
// SB_QUEUE, SB_TOPIC, SB_SUBSCRIPTION. Always one JSON line on stdout: {"ok": true, "mode",
// "problems": [], "sent": [...], "received": [...] (in order), ...} and exit 0 on success.
// A wrong field value is a "problem": the run goes on, and ends with "ok": false and exit 1.
// A missing message, a wrong order or an SDK error stops the run: {"ok": false, "error": ...},
// exit 1. Details go to stderr. Exit 2: bad usage; 3: the whole run overran its time limit.

import { Buffer } from "node:buffer";
import { isDeepStrictEqual, parseArgs } from "node:util";
import { ServiceBusClient } from "@azure/service-bus";

const USAGE =
  "usage: node roundtrip.mjs <queue|session|topic|send|receive|management|no-message-id|" +
  "session-locks|large|ttl> " +
  "[--connection-string CS] " +
  "[--queue NAME] [--topic NAME] [--subscription NAME] [--count N] [--timeout-ms MS] " +
  "[--empty-timeout-ms MS] [--lock-ms MS] [--size BYTES] [--session-queue NAME]";

/** How long one receiveMessages call waits; loops retry until the step's deadline. */
const WAIT_MS = 2000;
/** How long "nothing more arrives" is watched for (the broker delivers at once). */
const QUIET_MS = 500;

class CheckError extends Error {}

/** Mismatches that do not stop the run (a wrong field value): all are reported at the end. */
const problems = [];

/** A hard check: the run cannot go on meaningfully without it (counts, order, identity). */
function fail(message) {
  throw new CheckError(message);
}

function expect(condition, message) {
  if (!condition) fail(message);
}

function expectEqual(actual, expected, what) {
  if (!isDeepStrictEqual(actual, expected)) {
    fail(`${what}: expected ${show(expected)}, got ${show(actual)}`);
  }
}

/** A soft check: recorded in `problems`, and the run goes on. */
function check(condition, message) {
  if (!condition) {
    problems.push(message);
    log(`PROBLEM: ${message}`);
  }
}

function checkEqual(actual, expected, what) {
  check(
    isDeepStrictEqual(actual, expected),
    `${what}: expected ${show(expected)}, got ${show(actual)}`,
  );
}

function show(value) {
  return JSON.stringify(value, jsonReplacer);
}

function log(message) {
  process.stderr.write(`[roundtrip ${mode}] ${message}\n`);
}

/** Buffers as {"base64": ...}, Longs (sequence numbers) and bigints as strings. */
function jsonReplacer(_key, value) {
  if (value && value.type === "Buffer" && Array.isArray(value.data)) {
    return { base64: Buffer.from(value.data).toString("base64") };
  }
  if (typeof value === "bigint") return value.toString();
  return value;
}

function plain(value) {
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) {
    return { base64: Buffer.from(value).toString("base64") };
  }
  if (value && typeof value === "object" && typeof value.toNumber === "function") {
    return value.toString(); // a Long
  }
  if (value instanceof Date) return value.toISOString();
  return value;
}

/** What the test cares about in a received message, as plain JSON. */
function summary(message) {
  const out = {
    messageId: message.messageId,
    body: plain(message.body),
    subject: message.subject,
    contentType: message.contentType,
    correlationId: message.correlationId,
    applicationProperties: message.applicationProperties ?? {},
    deliveryCount: message.deliveryCount,
    sequenceNumber: plain(message.sequenceNumber),
    enqueuedTimeUtc: plain(message.enqueuedTimeUtc),
    lockedUntilUtc: plain(message.lockedUntilUtc),
    hasLockToken: Boolean(message.lockToken),
    sessionId: message.sessionId,
    state: message.state,
  };
  if (message.deadLetterReason !== undefined) out.deadLetterReason = message.deadLetterReason;
  if (message.deadLetterErrorDescription !== undefined) {
    out.deadLetterErrorDescription = message.deadLetterErrorDescription;
  }
  if (message.deadLetterSource !== undefined) out.deadLetterSource = message.deadLetterSource;
  return out;
}

/** What was sent, in the same shape (for the test and for the checks here). */
function sentSummary(message) {
  return {
    messageId: message.messageId,
    body: plain(message.body),
    subject: message.subject,
    contentType: message.contentType,
    correlationId: message.correlationId,
    applicationProperties: message.applicationProperties ?? {},
    sessionId: message.sessionId,
  };
}

/** Receives until exactly `count` messages arrived, or fails after `timeoutMs`. */
async function receiveN(receiver, count, what, timeoutMs = stepTimeoutMs) {
  const received = [];
  const deadline = Date.now() + timeoutMs;
  while (received.length < count && Date.now() < deadline) {
    const wait = Math.max(100, Math.min(WAIT_MS, deadline - Date.now()));
    const batch = await receiver.receiveMessages(count - received.length, {
      maxWaitTimeInMs: wait,
    });
    received.push(...batch);
  }
  expect(
    received.length === count,
    `${what}: received ${received.length} of ${count} messages within ${timeoutMs} ms` +
      ` (got ${show(received.map((m) => m.messageId))})`,
  );
  return received;
}

async function expectNothingMore(receiver, what) {
  const extra = await receiver.receiveMessages(10, { maxWaitTimeInMs: QUIET_MS });
  expect(
    extra.length === 0,
    `${what}: expected no more messages, got ${show(extra.map((m) => m.messageId))}`,
  );
}

/** The fields a received message must carry over from the one sent (`addedProperties`:
 * application properties the broker adds, such as a dead-letter reason). */
function checkMessage(received, sent, what, addedProperties = {}) {
  const got = summary(received);
  const want = sentSummary(sent);
  want.applicationProperties = { ...want.applicationProperties, ...addedProperties };
  for (const field of [
    "messageId",
    "body",
    "subject",
    "contentType",
    "correlationId",
    "applicationProperties",
    "sessionId",
  ]) {
    checkEqual(got[field], want[field], `${what} (${want.messageId}) ${field}`);
  }
  check(got.hasLockToken || received.lockToken === undefined, `${what}: lock token`);
  check(got.sequenceNumber !== undefined, `${what} (${want.messageId}): no sequence number`);
  check(
    received.enqueuedTimeUtc instanceof Date &&
      Math.abs(received.enqueuedTimeUtc.getTime() - Date.now()) < 120_000,
    `${what} (${want.messageId}): enqueuedTimeUtc ${show(got.enqueuedTimeUtc)} is not recent`,
  );
}

function expectIncreasingSequenceNumbers(messages, what) {
  for (let i = 1; i < messages.length; i++) {
    const before = messages[i - 1].sequenceNumber;
    const after = messages[i].sequenceNumber;
    check(
      after.greaterThan(before),
      `${what}: sequence numbers not increasing: ${before.toString()} then ${after.toString()}`,
    );
  }
}

// ------------------------------------------------------------------------------ messages

const APP_PROPERTIES = {
  text: "héllo",
  int: 42,
  negative: -7,
  float: 1.5,
  flag: true,
  off: false,
};

/** The queue (and send) mode's messages: one sent alone, then a batch of three. */
function queueMessages(prefix) {
  const single = {
    messageId: `${prefix}-single`,
    body: { kind: "single", n: 0, text: "héllo" }, // JSON in a data section
    subject: "subject-single",
    contentType: "application/json",
    correlationId: "corr-single",
    applicationProperties: { ...APP_PROPERTIES, index: 0 },
  };
  const batch = [
    {
      messageId: `${prefix}-batch-0`,
      body: "batch text", // also JSON: the SDK sends "\"batch text\""
      subject: "subject-batch",
      contentType: "text/plain",
      correlationId: "corr-batch-0",
      applicationProperties: { ...APP_PROPERTIES, index: 1 },
    },
    {
      messageId: `${prefix}-batch-1`,
      body: Buffer.from([0, 1, 2, 0xfe, 0xff]), // raw bytes, not JSON
      subject: "subject-batch",
      contentType: "application/octet-stream",
      correlationId: "corr-batch-1",
      applicationProperties: { ...APP_PROPERTIES, index: 2 },
    },
    {
      messageId: `${prefix}-batch-2`,
      body: [1, 2, 3],
      subject: "subject-batch",
      contentType: "application/json",
      correlationId: "corr-batch-2",
      applicationProperties: { ...APP_PROPERTIES, index: 3 },
    },
  ];
  return { single, batch };
}

async function sendBatch(sender, messages, what) {
  const batch = await sender.createMessageBatch();
  for (const message of messages) {
    expect(batch.tryAddMessage(message), `${what}: ${message.messageId} did not fit the batch`);
  }
  expectEqual(batch.count, messages.length, `${what}: batch count`);
  await sender.sendMessages(batch);
}

// ------------------------------------------------------------------------------ modes

async function runSend(client, args) {
  const queue = required(args, "queue");
  const { single, batch } = queueMessages("js");
  const sender = client.createSender(queue);
  await sender.sendMessages(single);
  await sendBatch(sender, batch, "send");
  await sender.close();
  log(`sent ${1 + batch.length} messages to ${queue}`);
  return { queue, sent: [single, ...batch].map(sentSummary) };
}

async function runReceive(client, args) {
  const queue = required(args, "queue");
  const count = Number(args.count ?? 1);
  const receiver = client.createReceiver(queue, { receiveMode: "peekLock" });
  const messages = await receiveN(receiver, count, "receive");
  for (const message of messages) await receiver.completeMessage(message);
  await expectNothingMore(receiver, "receive");
  await receiver.close();
  return { queue, received: messages.map(summary) };
}

/**
 * Times to live as a receiver reads them: the SDK takes absolute-expiry-time - creation-time
 * when both are there (since 7.9.4), so the broker must keep that difference the TTL sent.
 * Sends four messages (a plain TTL; 60 days, past the header's uint32 and carried only in the
 * properties; a sender clock an hour behind; none, so the entity's default applies), then
 * receives them and --count (0) more another client sent first, and reports each one's
 * timeToLive, expiresAtUtc and enqueuedTimeUtc.
 */
async function runTtl(client, args) {
  const queue = required(args, "queue");
  const count = 4 + Number(args.count ?? 0);
  const day = 24 * 3600 * 1000;
  const sender = client.createSender(queue);
  await sender.sendMessages({ messageId: "ttl-plain", body: "plain", timeToLive: 600_000 });
  await sender.sendMessages({
    body: "long",
    bodyType: "value",
    header: { timeToLive: 60 * day },
    properties: { messageId: "ttl-60-days" },
  });
  await sender.sendMessages({
    body: "skewed",
    bodyType: "value",
    header: { timeToLive: 600_000 },
    properties: { messageId: "ttl-clock-behind", creationTime: Date.now() - 3600_000 },
  });
  await sender.sendMessages({ messageId: "ttl-default", body: "default" });
  await sender.close();
  const receiver = client.createReceiver(queue, { receiveMode: "peekLock" });
  const messages = await receiveN(receiver, count, "ttl");
  for (const message of messages) await receiver.completeMessage(message);
  await receiver.close();
  const received = messages.map((message) => ({
    ...summary(message),
    timeToLive: message.timeToLive,
    expiresAtUtc: plain(message.expiresAtUtc),
  }));
  return { queue, received };
}

async function runQueue(client, args) {
  const queue = required(args, "queue");
  const received = [];
  const note = (step, message) => received.push({ step, ...summary(message) });

  // --- send: one message, then a batch
  const { single, batch } = queueMessages("js");
  const sent = [single, ...batch];
  const sender = client.createSender(queue);
  await sender.sendMessages(single);
  await sendBatch(sender, batch, "queue");
  log(`sent ${sent.length} messages to ${queue}`);

  // --- peek-lock: all four, in order, every field intact
  const receiver = client.createReceiver(queue, { receiveMode: "peekLock" });
  const first = await receiveN(receiver, sent.length, "peek-lock");
  expectEqual(
    first.map((m) => m.messageId),
    sent.map((m) => m.messageId),
    "peek-lock order",
  );
  first.forEach((message, i) => {
    checkMessage(message, sent[i], "peek-lock");
    checkEqual(message.deliveryCount, 0, `peek-lock (${message.messageId}) deliveryCount`);
    check(
      message.lockedUntilUtc instanceof Date && message.lockedUntilUtc.getTime() > Date.now(),
      `peek-lock (${message.messageId}): lockedUntilUtc ${show(plain(message.lockedUntilUtc))}` +
        " is not in the future",
    );
    note("peekLock", message);
  });
  expectIncreasingSequenceNumbers(first, "peek-lock");

  // --- settle: complete two, abandon one, dead-letter one
  const [mSingle, mComplete, mAbandon, mDeadLetter] = first;
  await receiver.completeMessage(mSingle);
  await receiver.completeMessage(mComplete);
  await receiver.abandonMessage(mAbandon);
  await receiver.deadLetterMessage(mDeadLetter, {
    deadLetterReason: "js-reason",
    deadLetterErrorDescription: "dead-lettered by the JS client",
  });
  log("completed 2, abandoned 1, dead-lettered 1");

  // --- the abandoned one comes back, with its delivery counted
  const [again] = await receiveN(receiver, 1, "redelivery");
  expectEqual(again.messageId, mAbandon.messageId, "redelivered message");
  checkMessage(again, sent[2], "redelivery");
  checkEqual(again.deliveryCount, 1, `redelivered (${again.messageId}) deliveryCount`);
  checkEqual(
    again.sequenceNumber.toString(),
    mAbandon.sequenceNumber.toString(),
    "redelivered sequence number",
  );
  note("redelivered", again);
  await receiver.completeMessage(again);
  await expectNothingMore(receiver, "after completing everything");

  // --- the dead-lettered one is in the dead-letter sub-queue, with its reason
  const dlq = client.createReceiver(queue, { subQueueType: "deadLetter" });
  const [dead] = await receiveN(dlq, 1, "dead-letter queue");
  // Service Bus also puts the reason and description into the application properties
  checkMessage(dead, sent[3], "dead-letter queue", {
    DeadLetterReason: "js-reason",
    DeadLetterErrorDescription: "dead-lettered by the JS client",
  });
  checkEqual(dead.deadLetterReason, "js-reason", "deadLetterReason");
  checkEqual(
    dead.deadLetterErrorDescription,
    "dead-lettered by the JS client",
    "deadLetterErrorDescription",
  );
  note("deadLetterQueue", dead);
  await dlq.completeMessage(dead);
  await expectNothingMore(dlq, "dead-letter queue");
  await dlq.close();

  // --- receive-and-delete: settled on delivery, nothing to complete
  const rad = {
    messageId: "js-receive-and-delete",
    body: { kind: "receiveAndDelete" },
    subject: "subject-rad",
    contentType: "application/json",
    correlationId: "corr-rad",
    applicationProperties: { ...APP_PROPERTIES, index: 4 },
  };
  await sender.sendMessages(rad);
  const radReceiver = client.createReceiver(queue, { receiveMode: "receiveAndDelete" });
  const [deleted] = await receiveN(radReceiver, 1, "receive-and-delete");
  checkMessage(deleted, rad, "receive-and-delete");
  check(!deleted.lockToken, "receive-and-delete: the message carries a lock token");
  note("receiveAndDelete", deleted);
  await expectNothingMore(radReceiver, "receive-and-delete");
  await radReceiver.close();
  await expectNothingMore(receiver, "peek-lock at the end");
  await receiver.close();
  await sender.close();
  return { queue, sent: [...sent, rad].map(sentSummary), received };
}

async function runSession(client, args) {
  const queue = required(args, "queue");
  const received = [];
  const note = (step, message) => received.push({ step, ...summary(message) });
  const make = (sessionId, n) => ({
    messageId: `${sessionId}-${n}`,
    sessionId,
    body: { sessionId, n },
    subject: "session-subject",
    contentType: "application/json",
    correlationId: `corr-${sessionId}-${n}`,
    applicationProperties: { session: sessionId, n },
  });
  const s1 = [0, 1, 2].map((n) => make("s1", n));
  const s2 = [0, 1].map((n) => make("s2", n));

  // --- send, the two sessions interleaved; s1's last two as one batch
  const sender = client.createSender(queue);
  await sender.sendMessages(s1[0]);
  await sender.sendMessages(s2[0]);
  await sender.sendMessages(s2[1]);
  await sendBatch(sender, [s1[1], s1[2]], "session");
  await sender.close();
  log(`sent ${s1.length} messages in s1 and ${s2.length} in s2 to ${queue}`);

  // --- acceptSession(queue, "s1"): its messages only, in order; session state
  const r1 = await client.acceptSession(queue, "s1");
  expectEqual(r1.sessionId, "s1", "acceptSession sessionId");
  check(
    r1.sessionLockedUntilUtc instanceof Date && r1.sessionLockedUntilUtc.getTime() > Date.now(),
    `acceptSession: sessionLockedUntilUtc ${show(plain(r1.sessionLockedUntilUtc))}` +
      " is not in the future",
  );
  const got1 = await receiveN(r1, s1.length, "session s1");
  expectEqual(
    got1.map((m) => m.messageId),
    s1.map((m) => m.messageId),
    "session s1 order",
  );
  got1.forEach((message, i) => {
    checkMessage(message, s1[i], "session s1");
    note("s1", message);
  });
  expectIncreasingSequenceNumbers(got1, "session s1");
  const stateBefore1 = await r1.getSessionState();
  const state1 = { step: "s1 done", count: s1.length };
  await r1.setSessionState(state1);
  checkEqual(await r1.getSessionState(), state1, "s1 session state read back");
  for (const message of got1) await r1.completeMessage(message);
  await expectNothingMore(r1, "session s1");
  await r1.close();
  log("session s1 received, state set, completed");

  // --- acceptNextSession: s1 is drained, so s2 is next
  const r2 = await client.acceptNextSession(queue);
  expectEqual(r2.sessionId, "s2", "acceptNextSession sessionId");
  const got2 = await receiveN(r2, s2.length, "session s2");
  expectEqual(
    got2.map((m) => m.messageId),
    s2.map((m) => m.messageId),
    "session s2 order",
  );
  got2.forEach((message, i) => {
    checkMessage(message, s2[i], "session s2");
    note("s2", message);
  });
  const stateBefore2 = await r2.getSessionState();
  const state2 = Buffer.from("raw state of s2");
  await r2.setSessionState(state2);
  const stateAfter2 = await r2.getSessionState();
  // getSessionState JSON-parses what it can: raw text comes back as a Buffer
  checkEqual(plain(stateAfter2), plain(state2), "s2 session state read back");
  for (const message of got2) await r2.completeMessage(message);
  await expectNothingMore(r2, "session s2");
  await r2.close();
  log("session s2 received, state set, completed");

  // --- s1 again: no messages left, but its state outlived the receiver
  const r1again = await client.acceptSession(queue, "s1");
  const state1Again = await r1again.getSessionState();
  checkEqual(state1Again, state1, "s1 session state after re-accepting it");
  await expectNothingMore(r1again, "session s1 re-accepted");
  await r1again.close();

  // --- no session has messages now: acceptNextSession gives up after its timeout
  const started = Date.now();
  let nextError = null;
  const emptyTimeoutMs = Number(args["empty-timeout-ms"] ?? 3000);
  const quick = new ServiceBusClient(connectionString, {
    retryOptions: { timeoutInMs: emptyTimeoutMs, maxRetries: 0 },
  });
  try {
    const r = await quick.acceptNextSession(queue);
    nextError = { unexpected: `got session ${r.sessionId}` };
    await r.close();
  } catch (err) {
    nextError = { code: err.code ?? err.name, message: String(err.message).slice(0, 300) };
  } finally {
    await quick.close();
  }
  const elapsedMs = Date.now() - started;
  check(
    !nextError.unexpected,
    `acceptNextSession on a queue without messages: ${nextError.unexpected}`,
  );
  log(`acceptNextSession with nothing to get: ${nextError.code} after ${elapsedMs} ms`);

  return {
    queue,
    sent: [...s1, ...s2].map(sentSummary),
    received,
    sessionState: {
      s1Before: plain(stateBefore1 ?? null),
      s1: state1,
      s1AfterReaccept: state1Again,
      s2Before: plain(stateBefore2 ?? null),
      s2: plain(stateAfter2),
    },
    acceptNextSessionWhenEmpty: { ...nextError, elapsedMs, timeoutMs: emptyTimeoutMs },
  };
}

async function runTopic(client, args) {
  const topic = required(args, "topic");
  const subscription = required(args, "subscription");
  const received = [];
  const make = (n) => ({
    messageId: `topic-${n}`,
    body: { topic: true, n },
    subject: "topic-subject",
    contentType: "application/json",
    correlationId: `corr-topic-${n}`,
    // a subscription with a correlation filter on color = 'red' should get topic-1 only
    applicationProperties: { ...APP_PROPERTIES, index: n, color: n === 1 ? "red" : "blue" },
  });
  const sent = [0, 1, 2].map(make);
  const sender = client.createSender(topic);
  await sender.sendMessages(sent[0]);
  await sendBatch(sender, sent.slice(1), "topic");
  await sender.close();
  log(`sent ${sent.length} messages to topic ${topic}`);

  const receiver = client.createReceiver(topic, subscription, { receiveMode: "peekLock" });
  const got = await receiveN(receiver, sent.length, `subscription ${subscription}`);
  expectEqual(
    got.map((m) => m.messageId),
    sent.map((m) => m.messageId),
    "subscription order",
  );
  got.forEach((message, i) => {
    checkMessage(message, sent[i], `subscription ${subscription}`);
    checkEqual(message.deliveryCount, 0, `subscription (${message.messageId}) deliveryCount`);
    received.push({ step: "subscription", ...summary(message) });
  });
  expectIncreasingSequenceNumbers(got, "subscription");
  for (const message of got) await receiver.completeMessage(message);
  await expectNothingMore(receiver, `subscription ${subscription}`);
  await receiver.close();
  return { topic, subscription, sent: sent.map(sentSummary), received };
}

/**
 * Management operations, each on a fresh client (its own connection) so that the token the
 * SDK puts for `<entity>/$management` is the only one there: peekMessages, scheduleMessages
 * and cancelScheduledMessages; then renewMessageLock on a received message.
 */
async function runManagement(client, args) {
  const queue = required(args, "queue");
  const fresh = () =>
    new ServiceBusClient(connectionString, {
      retryOptions: { timeoutInMs: stepTimeoutMs, maxRetries: 0 },
    });
  const sent = [0, 1].map((n) => ({
    messageId: `mgmt-${n}`,
    body: { management: true, n },
    subject: "mgmt-subject",
    contentType: "application/json",
    correlationId: `corr-mgmt-${n}`,
    applicationProperties: { ...APP_PROPERTIES, index: n },
  }));
  const sender = client.createSender(queue);
  await sender.sendMessages(sent);
  await sender.close();

  // peek on a connection that has nothing but the management link
  const peekClient = fresh();
  let peeked;
  try {
    peeked = await peekClient.createReceiver(queue).peekMessages(10);
  } finally {
    await peekClient.close();
  }
  expectEqual(
    peeked.map((m) => m.messageId),
    sent.map((m) => m.messageId),
    "peeked messages",
  );
  peeked.forEach((message, i) => checkMessage(message, sent[i], "peek"));

  // schedule one for an hour from now, then cancel it, on another bare connection
  const scheduleClient = fresh();
  let sequenceNumbers;
  try {
    const scheduler = scheduleClient.createSender(queue);
    const later = new Date(Date.now() + 3_600_000);
    sequenceNumbers = await scheduler.scheduleMessages(
      [{ messageId: "mgmt-scheduled", body: { scheduled: true } }],
      later,
    );
    expectEqual(sequenceNumbers.length, 1, "scheduleMessages sequence numbers");
    await scheduler.cancelScheduledMessages(sequenceNumbers);
  } finally {
    await scheduleClient.close();
  }

  // receive, renew a lock through $management, complete
  const receiver = client.createReceiver(queue, { maxAutoLockRenewalDurationInMs: 0 });
  const got = await receiveN(receiver, sent.length, "receive after peek");
  const before = got[0].lockedUntilUtc;
  const renewedUntil = await receiver.renewMessageLock(got[0]);
  check(
    renewedUntil instanceof Date && renewedUntil.getTime() >= before.getTime(),
    `renewMessageLock: ${show(plain(renewedUntil))} is before ${show(plain(before))}`,
  );
  for (const message of got) await receiver.completeMessage(message);
  await expectNothingMore(receiver, "after completing");
  await receiver.close();
  return {
    queue,
    sent: sent.map(sentSummary),
    peeked: peeked.map(summary),
    scheduled: sequenceNumbers.map(String),
    renewedUntil: plain(renewedUntil),
    received: got.map((m) => ({ step: "peekLock", ...summary(m) })),
  };
}

/**
 * Messages sent without a messageId: the JS receiver keys its lock auto-renewal by message-id
 * (completeMessage throws "Failed to stop auto lock renewal - no message ID" without one), so
 * this runs with auto-renewal on, as applications do by default.
 */
/** Receives one message from ``queue`` through subscribe() (auto-complete on), passes it
 * to ``note("subscribe", message)`` and closes the subscription and its receiver. */
async function subscribeOne(client, queue, note) {
  const streaming = client.createReceiver(queue, { receiveMode: "peekLock" });
  const streamed = await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new CheckError("subscribe(): no message within the step's time")),
      stepTimeoutMs,
    );
    const subscription = streaming.subscribe({
      processMessage: async (message) => {
        clearTimeout(timer);
        note("subscribe", message);
        resolve(subscription);
      },
      processError: async ({ error }) => {
        clearTimeout(timer);
        reject(error);
      },
    });
  });
  // let the auto-complete after processMessage go through before closing
  await new Promise((resolve) => setTimeout(resolve, 500));
  await streamed.close();
  await streaming.close();
}

async function runNoMessageId(client, args) {
  const queue = required(args, "queue");
  const topic = required(args, "topic");
  const subscription = required(args, "subscription");
  const make = (n) => ({ body: { noId: true, n }, applicationProperties: { n } });
  const sender = client.createSender(queue);
  await sender.sendMessages(make(0));
  await sendBatch(sender, [make(1), make(2)], "no-message-id");
  await sender.sendMessages(make(3)); // for subscribe()
  await sender.close();
  const topicSender = client.createSender(topic);
  await topicSender.sendMessages(make(10));
  await topicSender.close();

  const received = [];
  const note = (step, message) => received.push({ step, ...summary(message) });
  const receiver = client.createReceiver(queue, { receiveMode: "peekLock" });
  const got = await receiveN(receiver, 4, "no-message-id queue");
  got.forEach((message) => note("peekLock", message));
  expectEqual(
    got.map((m) => m.applicationProperties.n),
    [0, 1, 2, 3],
    "no-message-id order",
  );
  await receiver.abandonMessage(got[1]);
  await receiver.completeMessage(got[0]);
  await receiver.completeMessage(got[2]);
  await receiver.abandonMessage(got[3]);
  const [again] = await receiveN(receiver, 1, "no-message-id redelivery");
  note("redelivered", again);
  await receiver.completeMessage(again);
  await receiver.close();

  // subscribe(): the SDK's streaming receiver, auto-complete on
  await subscribeOne(client, queue, note);

  const subReceiver = client.createReceiver(topic, subscription, { receiveMode: "peekLock" });
  const [fromTopic] = await receiveN(subReceiver, 1, "no-message-id subscription");
  note("subscription", fromTopic);
  await subReceiver.completeMessage(fromTopic);
  await expectNothingMore(subReceiver, "no-message-id subscription");
  await subReceiver.close();
  return { queue, topic, subscription, received };
}

/** `date` is about `expectedMs` from now (a lock expiry), give or take `slackMs`. */
function checkLockTime(date, expectedMs, what, slackMs = 5000) {
  const ahead = date instanceof Date ? date.getTime() - Date.now() : NaN;
  check(
    Math.abs(ahead - expectedMs) <= slackMs,
    `${what}: ${show(plain(date))} is ${ahead} ms from now, expected about ${expectedMs}`,
  );
  return ahead;
}

/** One session receiver's round: lock times, state, receive, renew, complete. */
async function sessionRound(receiver, what, lockMs, expected) {
  const report = { sessionId: receiver.sessionId };
  report.lockAheadMs = checkLockTime(receiver.sessionLockedUntilUtc, lockMs, `${what} lock`);
  report.stateBefore = plain((await receiver.getSessionState()) ?? null);
  await receiver.setSessionState({ what });
  checkEqual(await receiver.getSessionState(), { what }, `${what} session state`);
  const messages = expected ? await receiveN(receiver, expected.length, what) : [];
  expectEqual(
    messages.map((m) => m.messageId),
    expected ?? [],
    `${what} messages`,
  );
  for (const message of messages) {
    checkLockTime(message.lockedUntilUtc, lockMs, `${what} message ${message.messageId} lock`);
  }
  const renewed = await receiver.renewSessionLock();
  report.renewedAheadMs = checkLockTime(renewed, lockMs, `${what} renewSessionLock`);
  checkEqual(plain(receiver.sessionLockedUntilUtc), plain(renewed), `${what} lock after renewal`);
  for (const message of messages) await receiver.completeMessage(message);
  await expectNothingMore(receiver, what);
  await receiver.close();
  report.received = messages.map((m) => m.messageId);
  return report;
}

/**
 * Sessions with a long lock (60 s by default): the JS SDK reads the session's lock expiry
 * from the attach's com.microsoft:locked-until-utc (.NET ticks in an AMQP long, which rhea
 * hands over as 8 bytes) and renewals from $management's "expiration" (a timestamp).
 */
async function runSessionLocks(client, args) {
  const queue = required(args, "queue");
  const topic = required(args, "topic");
  const subscription = required(args, "subscription");
  const lockMs = Number(args["lock-ms"] ?? 60_000);
  const sessions = {};
  for (const [entity, label, accept, acceptNext] of [
    [queue, "queue", (id) => client.acceptSession(queue, id), () => client.acceptNextSession(queue)],
    [
      topic,
      "subscription",
      (id) => client.acceptSession(topic, subscription, id),
      () => client.acceptNextSession(topic, subscription),
    ],
  ]) {
    // a fresh session: nothing sent to it yet
    sessions[`${label} fresh`] = await sessionRound(
      await accept(`${label}-fresh`),
      `${label} fresh`,
      lockMs,
    );
    const sender = client.createSender(entity);
    await sender.sendMessages([0, 1].map((n) => ({
      messageId: `${label}-next-${n}`,
      sessionId: `${label}-next`,
      body: { n },
    })));
    await sender.close();
    const next = await acceptNext();
    expectEqual(next.sessionId, `${label}-next`, `${label} acceptNextSession sessionId`);
    sessions[`${label} next`] = await sessionRound(next, `${label} next`, lockMs, [
      `${label}-next-0`,
      `${label}-next-1`,
    ]);
  }
  return { queue, topic, subscription, lockMs, sessions };
}

/**
 * Messages of --size bytes (250 KiB by default): received, completed, and gone. Service Bus
 * settles them as small ones: the receiver's disposition, the broker's settled disposition.
 */
async function runLarge(client, args) {
  const queue = required(args, "queue");
  const sessionQueue = args["session-queue"];
  const size = Number(args.size ?? 256_000);
  const big = (id, extra = {}) => ({
    messageId: id,
    body: Buffer.alloc(size, id.length),
    applicationProperties: { size },
    ...extra,
  });
  const received = [];
  const note = (step, message) =>
    received.push({ step, messageId: message.messageId, size: message.body.length });

  const sender = client.createSender(queue);
  await sender.sendMessages(big("large-0"));
  await sender.sendMessages([big("large-1"), { messageId: "small-2", body: "small" }]);
  await sender.sendMessages(big("large-3"));
  const receiver = client.createReceiver(queue, { receiveMode: "peekLock" });
  const got = await receiveN(receiver, 4, "large");
  for (const message of got) {
    note("peekLock", message);
    await receiver.completeMessage(message);
  }
  await expectNothingMore(receiver, "large, after completing");
  await receiver.close();

  // subscribe(): auto-complete after processMessage
  await sender.sendMessages(big("large-subscribe"));
  await subscribeOne(client, queue, note);
  await sender.close();
  const after = client.createReceiver(queue, { receiveMode: "peekLock" });
  await expectNothingMore(after, "large, after subscribe()");
  await after.close();

  if (sessionQueue) {
    const sessionSender = client.createSender(sessionQueue);
    await sessionSender.sendMessages(big("large-session", { sessionId: "large" }));
    await sessionSender.close();
    const sessionReceiver = await client.acceptSession(sessionQueue, "large");
    const [message] = await receiveN(sessionReceiver, 1, "large session");
    note("session", message);
    await sessionReceiver.completeMessage(message);
    await expectNothingMore(sessionReceiver, "large session, after completing");
    await sessionReceiver.close();
  }
  return { queue, sessionQueue, size, received };
}

// ------------------------------------------------------------------------------ main

const MODES = {
  queue: runQueue,
  session: runSession,
  topic: runTopic,
  send: runSend,
  receive: runReceive,
  management: runManagement,
  "no-message-id": runNoMessageId,
  "session-locks": runSessionLocks,
  large: runLarge,
  ttl: runTtl,
};

function required(args, name) {
  const value = args[name];
  if (!value) usageError(`--${name} is required for mode ${mode}`);
  return value;
}

function usageError(message) {
  process.stderr.write(`roundtrip: ${message}\n${USAGE}\n`);
  process.exit(2);
}

let parsed;
try {
  parsed = parseArgs({
    allowPositionals: true,
    options: {
      "connection-string": { type: "string" },
      queue: { type: "string", default: process.env.SB_QUEUE },
      topic: { type: "string", default: process.env.SB_TOPIC },
      subscription: { type: "string", default: process.env.SB_SUBSCRIPTION },
      count: { type: "string" },
      "timeout-ms": { type: "string" },
      "empty-timeout-ms": { type: "string" },
      "lock-ms": { type: "string" },
      size: { type: "string" },
      "session-queue": { type: "string" },
    },
  });
} catch (err) {
  usageError(err.message);
}
const args = parsed.values;
const mode = parsed.positionals[0];
if (parsed.positionals.length !== 1 || !(mode in MODES)) {
  usageError(`expected one mode out of ${Object.keys(MODES).join(", ")}`);
}
const connectionString =
  args["connection-string"] ?? process.env.SERVICEBUS_CONNECTION_STRING ?? "";
if (!connectionString) usageError("no --connection-string (or SERVICEBUS_CONNECTION_STRING)");
/** Each step's (and each SDK operation's) time limit (10 s); the whole run gets six. */
const stepTimeoutMs = Number(args["timeout-ms"] ?? 10_000);

const overall = setTimeout(() => {
  const error = `the ${mode} round trip did not finish within ${6 * stepTimeoutMs} ms`;
  process.stdout.write(`${JSON.stringify({ ok: false, mode, error })}\n`);
  process.stderr.write(`roundtrip ${mode}: FAILED: ${error}\n`);
  process.exit(3);
}, 6 * stepTimeoutMs);
overall.unref();

// maxRetries 0: a failure shows at once, as what it is, instead of after retries.
const client = new ServiceBusClient(connectionString, {
  retryOptions: { timeoutInMs: stepTimeoutMs, maxRetries: 0 },
});
let exitCode = 0;
try {
  const result = await MODES[mode](client, args);
  const ok = problems.length === 0;
  exitCode = ok ? 0 : 1;
  process.stdout.write(`${JSON.stringify({ ok, mode, problems, ...result }, jsonReplacer)}\n`);
  if (!ok) {
    process.stderr.write(`roundtrip ${mode}: FAILED: ${problems.length} problem(s):\n`);
    for (const problem of problems) process.stderr.write(`  - ${problem}\n`);
  }
} catch (err) {
  exitCode = 1;
  const kind = err instanceof CheckError ? "check failed" : `${err.name} (${err.code ?? "-"})`;
  const error = `${kind}: ${err.message}`;
  process.stdout.write(`${JSON.stringify({ ok: false, mode, error, problems })}\n`);
  process.stderr.write(`roundtrip ${mode}: FAILED: ${error}\n`);
  for (const problem of problems) process.stderr.write(`  - (before that) ${problem}\n`);
  if (!(err instanceof CheckError)) process.stderr.write(`${err.stack}\n`);
} finally {
  try {
    await client.close();
  } catch (err) {
    process.stderr.write(`roundtrip ${mode}: closing the client failed: ${err.message}\n`);
    exitCode ||= 1;
  }
}
process.exit(exitCode);
