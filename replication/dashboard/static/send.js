// The Send tab: every system property a sender may set, application properties with their
// type chosen explicitly (so "007" can stay a string), a scheduled time, N copies or a JSON
// array as a batch. Uses app.js's helpers (el, call, where, guarded).
"use strict";

const PROPERTY_TYPES = ["string", "int", "double", "bool", "timestamp"];
const SYSTEM_FIELDS = ["content_type", "message_id", "session_id", "subject", "correlation_id",
  "to", "reply_to", "reply_to_session_id", "partition_key"];

function addProperty(name, type, value) {
  const row = el("div", { class: "row property" },
    el("input", { name: "name", placeholder: "name", "aria-label": "property name" }),
    el("select", { name: "type", "aria-label": "property type" },
      PROPERTY_TYPES.map((t) => el("option", { value: t }, t))),
    el("input", { name: "value", placeholder: "value", "aria-label": "property value" }),
    el("button", { type: "button", class: "link", onclick: () => row.remove() }, "remove"));
  row.querySelector("[name=name]").value = name || "";
  row.querySelector("[name=type]").value = type || "string";
  row.querySelector("[name=value]").value = value || "";
  $("properties").append(row);
  return row;
}

function typedProperties() {
  return [...document.querySelectorAll("#properties .property")].map((row) => ({
    name: row.querySelector("[name=name]").value.trim(),
    type: row.querySelector("[name=type]").value,
    value: row.querySelector("[name=value]").value,
  })).filter((p) => p.name);
}

function composed(form) {
  // the request body: the batch when one is given, else the fields (and how many copies)
  if (form.batch.value.trim()) {
    let batch;
    try {
      batch = JSON.parse(form.batch.value);
    } catch (e) {
      throw new Error(`the batch is not JSON: ${e.message}`);
    }
    if (!Array.isArray(batch)) throw new Error("the batch must be a JSON array of messages");
    return { messages: batch };
  }
  const message = { body: form.body.value, application_properties: typedProperties(),
    copies: Number(form.copies.value || 1) };
  for (const name of SYSTEM_FIELDS) if (form[name].value) message[name] = form[name].value;
  if (form.time_to_live.value) message.time_to_live = Number(form.time_to_live.value);
  if (form.scheduled.value) message.scheduled_enqueue_time = form.scheduled.value + "Z";
  return message;
}

async function send(event) {
  event.preventDefault();
  const form = $("send-form");
  const body = composed(form);
  const result = await call("send", where(), body);
  const count = result.message_ids.length;
  $("send-result").textContent = (count === 1 ? `sent ${result.sent}` : `sent ${count} messages`) +
    ` to ${result.entity}` + (result.scheduled.length ? `; scheduled as ` +
    result.scheduled.map((n) => "#" + n).join(", ") : "");
}

$("add-property").addEventListener("click", () => addProperty());
$("send-form").addEventListener("submit", guarded(send));
