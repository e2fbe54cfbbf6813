// The Event Hubs view: each namespace's hubs, a hub's partitions (as get_partition_properties
// gives them) and consumer groups, events read from a sequence number, an offset or an
// enqueued time, and an event sent with a partition key or to a partition. Uses app.js's
// helpers (el, call, guarded, when, kv) and explorer.js's (ask, parseTyped).
"use strict";

const hubs = { namespaces: [], open: null };

function hubWhere(extra) {
  return Object.assign({ namespace: hubs.open.namespace, hub: hubs.open.hub.name }, extra || {});
}

async function loadHubs(namespaces) {
  // the hubs of every namespace that has any; the section stays hidden when none does
  if (namespaces) hubs.namespaces = namespaces.filter((ns) => ns.event_hubs).map((ns) => ns.name);
  const found = [];
  for (const name of hubs.namespaces) {
    found.push(await call("eventhubs", { namespace: name }));
  }
  const any = found.some((f) => f.hubs.length);
  $("eventhubs-section").hidden = !any;
  $("eventhubs").replaceChildren(...found.filter((f) => f.hubs.length).map((f) =>
    el("div", { class: "namespace", "data-namespace": f.namespace },
      el("h3", {}, f.namespace),
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "event hub"), el("th", { class: "n" },
          "partitions"), el("th", { class: "n", title: "retained events, all partitions" },
          "events"), el("th", {}, "last enqueued"), el("th", {}, "consumer groups"))),
        el("tbody", {}, f.hubs.map((hub) => el("tr", { class: "clickable",
          "data-hub": hub.name, "data-namespace": f.namespace,
          onclick: () => openHub(f.namespace, hub) },
        el("td", {}, hub.name), el("td", { class: "n" }, hub.partitions.length),
        el("td", { class: "n", "data-field": "events" }, fmt(retained(hub.partitions))),
        el("td", {}, when(latest(hub.partitions)) || "–"),
        el("td", {}, hub.consumer_groups.join(", ")))))))));
  if (hubs.open) {
    const again = found.find((f) => f.namespace === hubs.open.namespace);
    const hub = again && again.hubs.find((h) => h.name === hubs.open.hub.name);
    if (hub) renderHub(hub);
  }
}

function retained(partitions) {
  return partitions.reduce((sum, p) => sum + (p.is_empty ? 0 :
    p.last_enqueued_sequence_number - p.beginning_sequence_number + 1), 0);
}

function latest(partitions) {
  const times = partitions.map((p) => p.last_enqueued_time_utc).filter(Boolean).sort();
  return times.length ? times[times.length - 1] : null;
}

function openHub(namespace, hub) {
  hubs.open = { namespace, hub };
  $("hub").hidden = false;
  $("hub-title").textContent = `${hub.name} (event hub) in ${namespace}`;
  const read = $("read-form");
  read.partition.replaceChildren(...hub.partitions.map((p) => el("option", { value: p.id },
    p.id)));
  read.consumer_group.replaceChildren(...hub.consumer_groups.map((g) => el("option",
    { value: g }, g)));
  read.value.value = String(Math.max(0, hub.partitions[0].beginning_sequence_number));
  $("hub-send-form").partition_id.replaceChildren(el("option", { value: "" },
    "(by the key, or round-robin)"), ...hub.partitions.map((p) => el("option", { value: p.id },
    `partition ${p.id}`)));
  $("events").replaceChildren();
  $("read-note").textContent = "";
  $("hub-send-result").textContent = "";
  renderHub(hub);
  $("hub").scrollIntoView({ block: "start" });
}

function renderHub(hub) {
  hubs.open.hub = hub;
  $("partitions").tBodies[0].replaceChildren(...hub.partitions.map((p) => el("tr", {
    class: "clickable", "data-partition": p.id, title: "read this partition from its start",
    onclick: guarded(() => readFrom(p.id, "sequence", Math.max(0, p.beginning_sequence_number))),
  },
  el("td", {}, p.id),
  el("td", { class: "n", "data-field": "begin" }, p.beginning_sequence_number),
  el("td", { class: "n", "data-field": "last" }, p.last_enqueued_sequence_number),
  el("td", { class: "n", "data-field": "offset" }, p.last_enqueued_offset),
  el("td", { "data-field": "time" }, when(p.last_enqueued_time_utc) || "–"),
  el("td", { "data-field": "empty" }, p.is_empty ? "yes" : "no"))));
  $("consumer-groups").textContent = hub.consumer_groups.join(", ");
}

function readFrom(partition, position, value) {
  const form = $("read-form");
  form.partition.value = partition;
  form.position.value = position;
  form.value.value = value;
  return readEvents();
}

async function readEvents() {
  const form = $("read-form");
  const params = hubWhere({ partition: form.partition.value, consumer_group:
    form.consumer_group.value, position: form.position.value, value: form.value.value.trim(),
    count: form.count.value || 20 });
  if (params.position === "time" && params.value && !/[zZ]|[+-]\d\d:?\d\d$/.test(params.value)) {
    params.value += "Z"; // the field says UTC
  }
  const data = await call("eventhubs/events", params);
  const what = { sequence: "sequence number", offset: "offset", time: "enqueued time" };
  $("read-note").textContent = `${data.events.length} event(s) of partition ${data.partition} ` +
    `from ${what[params.position]} ${params.value} (${data.consumer_group}); ` +
    (data.last_enqueued_sequence_number < 0 ? "the partition has had no events" :
      `the partition's last is #${data.last_enqueued_sequence_number}`);
  $("events").replaceChildren(...(data.events.length ? data.events.map(eventCard) :
    [el("p", { class: "note" }, "no events there")]));
}

function eventCard(e) {
  const system = [["message id", e.message_id], ["correlation id", e.correlation_id],
    ["content type", e.content_type], ["subject", e.subject], ["to", e.to],
    ["reply to", e.reply_to]];
  const props = Object.entries(e.application_properties);
  return el("div", { class: "message event", "data-sequence": e.sequence_number,
    "data-offset": e.offset },
  el("header", {}, el("strong", {}, `#${e.sequence_number}`),
    el("span", {}, `offset ${e.offset}`),
    e.partition_key !== null ? el("span", { class: "note", "data-testid": "partition-key" },
      `partition key ${e.partition_key}`) : null),
  kv([["enqueued", when(e.enqueued_time)], ["partition", e.partition_id],
    ["size", e.size + " bytes"]]),
  system.some(([, v]) => v !== null) ? el("div", {}, el("h3", {}, "system properties"),
    kv(system)) : null,
  props.length ? el("div", {}, el("h3", {}, "properties"), kv(props)) : null,
  el("pre", {}, e.body_encoding === "base64" ? `(base64) ${e.body}` : e.body));
}

async function sendEvent() {
  const form = $("hub-send-form");
  const key = form.partition_key.value;
  const partition = form.partition_id.value;
  if (key && partition) throw new Error("a partition key or a partition, not both");
  const destination = key ? `with partition key "${key}" (the hub hashes it to a partition)` :
    partition ? `to partition ${partition}` : "without a key (the hub picks a partition " +
      "round-robin)";
  const answer = await ask(`Send an event to ${hubs.open.hub.name} in ${hubs.open.namespace} ` +
    `${destination}?`, [], { ok: "Send" });
  if (!answer) return;
  const body = { body: form.body.value, partition_key: key || null,
    partition_id: partition || null, application_properties: parseTyped(form.properties.value) };
  for (const name of ["content_type", "message_id", "correlation_id"]) {
    if (form[name].value) body[name] = form[name].value;
  }
  const result = await call("eventhubs/send", hubWhere(), body);
  $("hub-send-result").textContent = `sent to ${result.hub} ` + (result.partition_key !== null ?
    `with partition key ${result.partition_key}` : result.partition_id !== null ?
    `partition ${result.partition_id}` : "(round-robin)");
  await loadHubs();
}

document.addEventListener("dashboard:overview", (event) => {
  guarded(() => loadHubs(event.detail.namespaces))();
});
$("hub-close").addEventListener("click", () => { $("hub").hidden = true; hubs.open = null; });
$("hubs-refresh").addEventListener("click", guarded(() => loadHubs()));
$("read-form").addEventListener("submit", guarded((e) => { e.preventDefault(); return readEvents(); }));
$("hub-send-form").addEventListener("submit", guarded((e) => {
  e.preventDefault();
  return sendEvent();
}));
