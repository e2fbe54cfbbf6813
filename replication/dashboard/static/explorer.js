// The Messages tab's explorer: peek pages and search, peek-lock receive and settlement,
// deferred and scheduled messages, purge and edit-and-resend. Uses app.js's helpers (el,
// call, where, messageCard, guarded, when). Every mutation first says what it will do and
// to which entity, in the "ask" dialog.
"use strict";

const held = { receipt: null, messages: [] };

function ask(text, fields, options) {
  // the dialog: the sentence, optional fields; resolves to their values, or null (cancel).
  // options.mustType: the text the person must type before Confirm does anything.
  const opts = options || {};
  return new Promise((resolve) => {
    const dialog = $("ask");
    $("ask-text").textContent = text;
    const inputs = (fields || []).map((f) => {
      const input = f.rows ? el("textarea", { name: f.name, rows: f.rows }) :
        el("input", { name: f.name, type: f.type || "text" });
      if (f.type === "checkbox") input.checked = Boolean(f.value);
      else input.value = f.value || "";
      return [f, input];
    });
    $("ask-fields").replaceChildren(...inputs.map(([f, input]) => el("label",
      { class: f.type === "checkbox" ? "check" : null }, input.type === "checkbox" ?
        [input, " " + f.label] : [f.label, input])));
    $("ask-ok").className = opts.danger ? "danger" : "primary";
    $("ask-ok").textContent = opts.ok || "Confirm";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") { resolve(null); return; }
      resolve(Object.fromEntries(inputs.map(([f, input]) =>
        [f.name, input.type === "checkbox" ? input.checked : input.value])));
    }, { once: true });
    $("ask-form").onsubmit = (event) => {
      if (opts.mustType && event.submitter && event.submitter.value === "ok") {
        const typed = $("ask-fields").querySelector("[name=confirm]").value;
        if (typed !== opts.mustType) {
          event.preventDefault();
          $("ask-text").textContent = `${text} Type "${opts.mustType}" exactly to go on.`;
        }
      }
    };
    dialog.showModal();
  });
}

function numbersIn(text) {
  const numbers = text.split(/[\s,]+/).filter(Boolean).map(Number);
  if (!numbers.length || numbers.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new Error(`"${text}": sequence numbers, like 12, 15`);
  }
  return numbers;
}

function deadLetterQueue() { return $("peek-form").queue.value === "dead-letter"; }

function entityLabel(deadLetter) {
  return `${state.entity.path}${deadLetter ? " (dead-letter queue)" : ""} in ` +
    state.entity.namespace;
}

// ------------------------------------------------------------------ peek and search

async function peek(from) {
  const form = $("peek-form");
  if (from) form.from.value = from;
  const params = where({ count: form.count.value || 20, from: form.from.value || 1 });
  if (deadLetterQueue()) params.dead_letter = 1;
  if (form.session.value) params.session = form.session.value;
  const search = $("search-form");
  const criteria = {};
  for (const input of search.querySelectorAll("input")) {
    if (input.value.trim()) criteria[input.name] = input.value.trim();
  }
  const data = await call("messages", Object.assign(params, criteria));
  const searching = Object.keys(criteria).length > 0;
  $("peek-note").textContent = searching ?
    `${data.messages.length} match(es) among ${data.scanned} message(s) peeked from ` +
    `#${params.from} (a search looks at ${data.limit} at most; Next goes on from ` +
    `#${data.next_from || "-"})` : `${data.messages.length} message(s) from #${params.from}`;
  $("messages").replaceChildren(...(data.messages.length ? data.messages.map((m) =>
    messageCard(m, false, [el("button", { class: "link",
      onclick: guarded(() => resend(m, deadLetterQueue())) }, "Edit & resend")])) :
    [el("p", { class: "note" }, searching ? "no matches" : "no messages")]),
  data.next_from && data.messages.length ? el("button", { id: "peek-next",
    onclick: guarded(() => peek(data.next_from)) }, "Next") : "");
}

// ------------------------------------------------------------------ receive and settle

function clearHeld() {
  held.receipt = null;
  held.messages = [];
  $("held").replaceChildren();
  $("held-actions").hidden = true;
  $("op-result").textContent = "";
}

function showHeld(data) {
  held.receipt = data.receipt;
  held.messages = data.messages;
  renderHeld();
}

function renderHeld() {
  $("held-actions").hidden = !held.messages.length;
  $("held-note").textContent = held.messages.length ? `${held.messages.length} message(s) ` +
    `locked for you on ${state.entity.path}` : "";
  $("held").replaceChildren(...held.messages.map((m) => messageCard(m, true,
    ["complete", "abandon", "defer", "dead-letter"].map((action) => el("button", {
      class: action === "dead-letter" ? "danger" : null, "data-action": action,
      onclick: guarded(() => settleHeld(action, [m.sequence_number])),
    }, action)))));
}

async function receive() {
  const count = Number($("receive-count").value || 5);
  const dead = deadLetterQueue();
  const body = { count, dead_letter: dead };
  if ($("peek-form").session.value) body.session = $("peek-form").session.value;
  else if ((state.entity.settings || {}).RequiresSession) body.session = "*";
  if (held.receipt) await call("release", where(), { receipt: held.receipt }).catch(() => null);
  const data = await call("receive", where(), body);
  showHeld(data);
  $("op-result").textContent = `received ${data.messages.length} from ${entityLabel(dead)} ` +
    "under a lock: settle each, or release them";
}

async function settleHeld(action, numbers) {
  if (!numbers.length) throw new Error("select locked messages first");
  const what = `${numbers.length} message(s) (#${numbers.join(", #")}) of ${state.entity.path}`;
  const texts = {
    complete: `Complete ${what}? They are removed from the entity.`,
    abandon: `Abandon ${what}? They go back, with one more delivery counted.`,
    defer: `Defer ${what}? They stay, received only by sequence number.`,
    "dead-letter": `Dead-letter ${what}? They move to its dead-letter queue.`,
  };
  const fields = action === "dead-letter" ? [{ name: "reason", label: "reason" },
    { name: "description", label: "description" }] : [];
  const answer = await ask(texts[action], fields, { danger: action !== "abandon" &&
    action !== "defer", ok: action });
  if (!answer) return;
  const result = await call("settle", where(), Object.assign({ receipt: held.receipt,
    sequence_numbers: numbers, action }, answer));
  held.messages = held.messages.filter((m) => !result.done.includes(m.sequence_number));
  if (!held.messages.length) held.receipt = null;
  renderHeld();
  $("op-result").textContent = `${action}: ${result.done.map((n) => "#" + n).join(", ")}` +
    (result.not_held.length ? `; not held: ${result.not_held.join(", ")}` : "");
}

function pickedHeld() {
  return [...document.querySelectorAll("#held .pick:checked")].map((b) => Number(b.value));
}

async function release() {
  if (!held.receipt) return;
  const result = await call("release", where(), { receipt: held.receipt });
  clearHeld();
  $("op-result").textContent = `released ${result.released} (no delivery counted)`;
}

async function receiveDeferred() {
  // of a session entity, inside the session named in the peek form, as the SDKs do
  const numbers = numbersIn($("deferred-numbers").value);
  const session = $("peek-form").session.value;
  if (!session && (state.entity.settings || {}).RequiresSession) {
    throw new Error("deferred messages of a session entity are received in their session: " +
      "type its id in the session field");
  }
  const body = { sequence_numbers: numbers };
  if (session) body.session = session;
  if (held.receipt) await call("release", where(), { receipt: held.receipt }).catch(() => null);
  const data = await call("deferred", where(), body);
  showHeld(data);
  $("op-result").textContent = `received deferred ${numbers.map((n) => "#" + n).join(", ")} ` +
    (session ? `in session ${session} ` : "") + "under a lock";
}

async function cancelScheduled() {
  const numbers = numbersIn($("scheduled-numbers").value);
  const answer = await ask(`Cancel the scheduled message(s) ${numbers.map((n) => "#" + n)
    .join(", ")} of ${state.entity.path}? They will never be enqueued.`, [], { danger: true });
  if (!answer) return;
  const result = await call("scheduled/cancel", where(), { sequence_numbers: numbers });
  $("op-result").textContent = `cancelled ${result.cancelled.map((n) => "#" + n).join(", ")}`;
}

async function purge() {
  const dead = deadLetterQueue();
  const path = state.entity.path;
  const answer = await ask(`Purge ${entityLabel(dead)}: every message in it now is removed ` +
    `for good. Type the entity's name (${path}) to confirm.`,
  [{ name: "confirm", label: "entity name" }], { danger: true, ok: "Purge", mustType: path });
  if (!answer) return;
  const result = await call("purge", where(), { confirm: answer.confirm, dead_letter: dead });
  $("op-result").textContent = `purged ${result.purged} message(s) from ${entityLabel(dead)}`;
  await peek(1);
}

// ------------------------------------------------------------------ edit and resend

function propertyLines(properties) {
  return Object.entries(properties).filter(([k]) => !k.startsWith("DeadLetter"))
    .map(([k, v]) => `${k}:${typeof v === "number" ? (Number.isInteger(v) ? "int" : "double") :
      typeof v === "boolean" ? "bool" : "string"}=${v}`).join("\n");
}

function parseTyped(text) {
  // "name:type=value" a line (type: string, int, double, bool, timestamp; none: string)
  return text.split("\n").filter((l) => l.trim()).map((line) => {
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`property line ${JSON.stringify(line)} is not name:type=value`);
    const [name, type] = line.slice(0, at).split(":").map((p) => p.trim());
    return { name, type: type || "string", value: line.slice(at + 1) };
  });
}

async function resend(m, deadLetter) {
  const target = state.entity.kind === "subscription" ? `topic ${state.entity.path.split("/")[0]}`
    : state.entity.path;
  const answer = await ask(`Send an edited copy of #${m.sequence_number} (${m.message_id}) to ` +
    `${target}? The original stays where it is.`, [
    { name: "body", label: "body", rows: 5, value: m.body_encoding === "utf-8" ? m.body : "" },
    { name: "properties", label: "application properties (name:type=value a line)", rows: 3,
      value: propertyLines(m.application_properties) },
    { name: "new_id", label: "give the copy a new message id", type: "checkbox" },
  ], { ok: "Send copy" });
  if (!answer) return;
  const result = await call("resend", where(), { sequence_number: m.sequence_number,
    dead_letter: deadLetter, body: answer.body, new_message_id: answer.new_id,
    application_properties: parseTyped(answer.properties) });
  $(deadLetter && state.tab === "dead-letters" ? "dl-result" : "op-result").textContent =
    `sent a copy ${result.sent} to ${result.entity}`;
}

$("peek-form").addEventListener("submit", guarded((e) => { e.preventDefault(); return peek(); }));
$("search-form").addEventListener("submit", guarded((e) => {
  e.preventDefault();
  return peek();
}));
$("receive").addEventListener("click", guarded(receive));
$("receive-deferred").addEventListener("click", guarded(receiveDeferred));
$("cancel-scheduled").addEventListener("click", guarded(cancelScheduled));
$("purge").addEventListener("click", guarded(purge));
$("release").addEventListener("click", guarded(release));
for (const button of document.querySelectorAll("[data-settle]")) {
  button.addEventListener("click", guarded(() => settleHeld(button.dataset.settle, pickedHeld())));
}
