// The dashboard page: renders /$dashboard/api/overview, follows /$dashboard/api/events
// (server-sent events, read with fetch so a SAS token can go in a header), and acts on one
// entity at a time. No framework, nothing fetched from elsewhere.
"use strict";

const API = "/$dashboard/api/";
const COLORS = { received: "#2563eb", forwarded: "#16a34a", backlog: "#f59e0b" };
const HISTORY_SECONDS = 600;
const state = { history: {}, selectedPipeline: null, entity: null, tab: "messages",
  deadLetters: [], namespaces: [] };

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function headers(extra) {
  const all = Object.assign({}, extra || {});
  if (token()) all.Authorization = token();
  return all;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function call(route, params, body) {
  const url = API + route + (params ? "?" + new URLSearchParams(params) : "");
  const options = { headers: headers(), cache: "no-store" };
  if (body !== undefined) {
    options.method = "POST";
    options.headers = headers({ "Content-Type": "application/json" });
    options.body = JSON.stringify(body);
  }
  const response = await fetch(url, options);
  const data = await response.json().catch(() => ({}));
  const problem = data.error || response.status + " " + response.statusText;
  if (response.status === 401) {
    askForToken(problem);
    throw new Error(`not authorized (401): ${problem}`);
  }
  if (!response.ok) throw Object.assign(new Error(problem), { field: data.field });
  return data;
}

// ------------------------------------------------------------------ pipelines

function fmt(n) { return Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }); }

function failoverNote(f) {
  // which resolver, what it resolved to, and the last switch: when, from where to where, why
  if (!f) return null;
  const last = f.last_switch;
  return el("div", { class: "note", "data-testid": "failover" },
    `failover ${f.resolver}: ${f.resolved || "not resolved yet"}, ${f.switches} switch(es)` +
    (last ? `, last at ${new Date(last.at * 1000).toLocaleTimeString()}: ${last.from} → ` +
      `${last.to} (${last.why.join("; ")})` : ""));
}

function seconds(value) {
  // a lag: "-" before any copy, ms under a second, else seconds (minutes past two)
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  return `${(value / 60).toFixed(1)} min`;
}

function renderPipelines(pipelines) {
  $("pipelines-section").hidden = !pipelines;
  if (!pipelines) return;
  const body = $("pipelines").tBodies[0];
  body.replaceChildren(...pipelines.map((p) => {
    const c = p.counts;
    const sources = p.sources.map((s) => el("div", {},
      `${s.entity} @ ${s.namespace}`, failoverNote(s.failover)));
    const targets = p.targets.map((t) => el("div", {},
      `${t.role}: ${t.entity} @ ${t.namespace || t.connection}`, failoverNote(t.failover)));
    const row = el("tr", {
      class: "clickable" + (state.selectedPipeline === p.name ? " selected" : ""),
      "data-pipeline": p.name,
      onclick: () => {
        state.selectedPipeline = state.selectedPipeline === p.name ? null : p.name;
        renderPipelines(pipelines);
        drawChart();
      },
    },
    el("td", {}, p.name),
    ...["received", "forwarded", "filtered", "dead_lettered", "failed_batches", "backlog"]
      .map((f) => el("td", { class: "n", "data-field": f }, fmt(c[f]))),
    el("td", { class: "n", "data-field": "rate" }, fmt(p.rate)),
    el("td", { class: "n", "data-field": "lag", title: `last copy / largest in ${p.lag.window} s` },
      `${seconds(p.lag.last)} / ${seconds(p.lag.max)}`),
    el("td", { class: "n", "data-field": "rpo", title: "age of the oldest message not yet " +
      "replicated, and how many wait (measured at the source)" },
      p.rpo ? `${seconds(p.rpo.seconds)}, ${fmt(p.rpo.messages)} msg` : "–"),
    el("td", {}, sources), el("td", {}, targets));
    return row;
  }));
}

function addSample(time, pipelines) {
  for (const p of pipelines || []) {
    const ring = state.history[p.name] || (state.history[p.name] = []);
    const c = p.counts;
    ring.push([time, c.received, c.forwarded, c.filtered, c.dead_lettered, c.failed_batches,
      c.backlog]);
    while (ring.length && ring[0][0] < time - HISTORY_SECONDS) ring.shift();
  }
}

function series() {
  // per-second rates of received and forwarded, and the backlog: of one pipeline or all
  const names = state.selectedPipeline ? [state.selectedPipeline] : Object.keys(state.history);
  const byTime = new Map();
  for (const name of names) {
    const ring = state.history[name] || [];
    for (let i = 1; i < ring.length; i++) {
      const [t, rec, fwd] = ring[i];
      const [t0, rec0, fwd0] = ring[i - 1];
      const span = t - t0;
      if (span <= 0) continue;
      const key = Math.round(t);
      const point = byTime.get(key) || { t: key, received: 0, forwarded: 0, backlog: 0 };
      point.received += (rec - rec0) / span;
      point.forwarded += (fwd - fwd0) / span;
      point.backlog += ring[i][6];
      byTime.set(key, point);
    }
  }
  return [...byTime.values()].sort((a, b) => a.t - b.t);
}

function drawChart() {
  const canvas = $("chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 900;
  const height = canvas.clientHeight || 180;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  $("chart-title").textContent = state.selectedPipeline || "all pipelines";
  const points = series();
  const pad = { left: 44, right: 44, top: 8, bottom: 18 };
  const now = Date.now() / 1000;
  const x = (t) => pad.left + (width - pad.left - pad.right) * (1 - (now - t) / HISTORY_SECONDS);
  const maxRate = Math.max(1, ...points.map((p) => Math.max(p.received, p.forwarded)));
  const maxBacklog = Math.max(1, ...points.map((p) => p.backlog));
  const yRate = (v) => height - pad.bottom - (height - pad.top - pad.bottom) * (v / maxRate);
  const yBack = (v) => height - pad.bottom - (height - pad.top - pad.bottom) * (v / maxBacklog);
  g.strokeStyle = "#d9dee7";
  g.fillStyle = "#667085";
  g.font = "11px system-ui, sans-serif";
  g.beginPath();
  g.moveTo(pad.left, height - pad.bottom);
  g.lineTo(width - pad.right, height - pad.bottom);
  g.stroke();
  g.fillText(fmt(maxRate) + "/s", 2, pad.top + 8);
  g.fillText(fmt(maxBacklog), width - pad.right + 4, pad.top + 8);
  g.fillText("-10 min", pad.left, height - 4);
  g.fillText("now", width - pad.right - 20, height - 4);
  const line = (key, y) => {
    g.strokeStyle = COLORS[key];
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p[key])) : g.moveTo(x(p.t), y(p[key]))));
    g.stroke();
  };
  line("received", yRate);
  line("forwarded", yRate);
  line("backlog", yBack);
}

// ------------------------------------------------------------------ namespaces

function entityRow(namespace, path, kind, item, extra) {
  const c = item.counts;
  const s = item.settings || {};
  return el("tr", {
    class: "clickable", "data-entity": path, "data-namespace": namespace,
    onclick: () => openEntity(namespace, path, kind, s),
  },
  el("td", {}, path), el("td", {}, kind + (s.RequiresSession ? ", sessions" : "")),
  ...["active", "deferred", "scheduled", "dead_lettered", "transfer", "transfer_dead_lettered"]
    .map((f) => el("td", { class: "n", "data-field": f }, kind === "topic" && f !== "scheduled" &&
      f !== "active" ? "" : fmt(c[f]))),
  el("td", { class: "rules" }, extra || ""));
}

function renderNamespaces(namespaces) {
  state.namespaces = namespaces;
  const box = $("namespaces");
  box.replaceChildren(...namespaces.map((ns) => {
    const rows = [];
    for (const q of ns.queues || []) rows.push(entityRow(ns.name, q.name, "queue", q));
    for (const t of ns.topics || []) {
      rows.push(entityRow(ns.name, t.name, "topic", t));
      for (const s of t.subscriptions || []) {
        const rules = (s.rules || []).map((r) =>
          el("div", {}, `${r.name}: ${r.filter}` + (r.action ? ` / ${r.action}` : "")));
        rows.push(entityRow(ns.name, `${t.name}/Subscriptions/${s.name}`, "subscription", s,
          rules));
      }
    }
    return el("div", { class: "namespace", "data-namespace": ns.name },
      el("h3", {}, ns.name === ns.host ? ns.name : `${ns.name} (${ns.host})`),
      ns.error ? el("p", { class: "ns-error" }, ns.error) : null,
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "entity"), el("th", {}, "kind"),
          el("th", { class: "n" }, "active"),
          el("th", { class: "n", title: "of the active ones" }, "deferred"),
          el("th", { class: "n" }, "scheduled"),
          el("th", { class: "n" }, "dead-lettered"), el("th", { class: "n" }, "transfer"),
          el("th", { class: "n" }, "transfer DLQ"), el("th", {}, "rules"))),
        el("tbody", {}, rows)));
  }));
}

// ------------------------------------------------------------------ one entity

function openEntity(namespace, path, kind, settings) {
  state.entity = { namespace, path, kind, settings };
  $("entity").hidden = false;
  $("entity-title").textContent = `${path} (${kind}) in ${namespace}`;
  const sessions = Boolean((settings || {}).RequiresSession);
  document.querySelector('[data-tab="send"]').hidden = kind === "subscription";
  document.querySelector('[data-tab="sessions"]').hidden = !sessions;
  const away = (state.tab === "send" && kind === "subscription") ||
    (state.tab === "sessions" && !sessions);
  clearHeld();
  showTab(away ? "messages" : state.tab);
  $("entity").scrollIntoView({ block: "start" });
}

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll(".tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== "tab-" + name;
  if (name === "messages") peek().catch((e) => showError(e.message));
  if (name === "dead-letters") loadDeadLetters(1).catch((e) => showError(e.message));
  if (name === "sessions") loadSessions().catch((e) => showError(e.message));
  if (name === "settings") loadSettings().catch((e) => showError(e.message));
}

function where(extra) {
  return Object.assign({ namespace: state.entity.namespace, entity: state.entity.path },
    extra || {});
}

function hopPath(m) {
  // the repl-* stamps: every hop the message took (oldest first), then where it is now
  const hops = m.hops.map((h, i) => el("span", { class: "hop", "data-testid": "hop",
    title: h.enqueued_time }, `#${i + 1} ${h.namespace || ""} seq ${h.sequence_number || "?"} ` +
    `@ ${when(h.enqueued_time)}`));
  const here = el("span", { class: "hop here", title: m.enqueued_time || "" },
    `here seq ${m.sequence_number} @ ${when(m.enqueued_time) || "?"}`);
  const items = [];
  for (const hop of [...hops, here]) {
    if (items.length) items.push("→");
    items.push(hop);
  }
  return el("div", { class: "path", "data-testid": "path" }, "path:", items);
}

function when(iso) {
  // an ISO time to the second, in UTC, as people read it (no microseconds, no offset noise)
  if (!iso) return iso;
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso).replace(/(\.\d+)/, "");
  return at.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function kv(entries) {
  return el("dl", { class: "kv" }, entries.filter(([, v]) => v !== null && v !== undefined &&
    v !== "").flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
}

function messageCard(m, selectable, actions) {
  const props = Object.entries(m.application_properties).filter(([k]) =>
    !["repl-enqueue-time", "repl-sequence", "repl-path"].includes(k) &&
    k !== "DeadLetterReason" && k !== "DeadLetterErrorDescription");
  return el("div", { class: "message", "data-sequence": m.sequence_number,
    "data-message-id": m.message_id || "" },
  el("header", {},
    selectable ? el("input", { type: "checkbox", class: "pick", value: m.sequence_number }) : null,
    el("strong", {}, `#${m.sequence_number}`), el("span", {}, m.message_id || ""),
    m.session_id ? el("span", { class: "note" }, `session ${m.session_id}`) : null,
    actions ? el("span", { class: "actions" }, actions) : null),
  m.dead_letter_reason !== null || m.dead_letter_description !== null ?
    el("div", { "data-testid": "dead-letter-reason" },
      el("span", { class: "reason" }, m.dead_letter_reason || "(no reason)"), ": ",
      el("span", { "data-testid": "dead-letter-description" }, m.dead_letter_description || ""))
    : null,
  kv([["enqueued", when(m.enqueued_time)], ["locked until", when(m.locked_until)], ["delivery count", m.delivery_count],
    ["content type", m.content_type], ["correlation id", m.correlation_id],
    ["subject", m.subject], ["to", m.to], ["reply to", m.reply_to],
    ["partition key", m.partition_key], ["scheduled", when(m.scheduled_enqueue_time)],
    ["time to live (s)", m.time_to_live], ["dead-letter source", m.dead_letter_source],
    ["size", m.size + " bytes"]]),
  props.length ? el("div", {}, el("h3", {}, "application properties"), kv(props)) : null,
  m.hops.length ? hopPath(m) : null,
  el("pre", {}, m.body_encoding === "base64" ? `(base64) ${m.body}` : m.body));
}

async function loadDeadLetters(from) {
  // a page of 100 from a sequence number; "Next 100" goes on past the last one shown
  const data = await call("messages", where({ dead_letter: 1, count: 100, from: from || 1 }));
  state.deadLetters = data.messages;
  state.deadLettersNext = data.next_from;
  $("dl-next").hidden = data.messages.length < 100;
  $("dead-letters").replaceChildren(...(data.messages.length ? data.messages.map((m) =>
    messageCard(m, true, [el("button", { class: "link", onclick: guarded(() => resend(m, true)) },
      "Edit & resend")])) : [el("p", { class: "note" }, from > 1 ? "no more dead letters" :
      "no dead letters")]));
}

function picked() {
  return [...document.querySelectorAll("#dead-letters .pick:checked")].map((b) => Number(b.value));
}

function confirmAction(text, dedupe) {
  return new Promise((resolve) => {
    const dialog = $("confirm");
    $("confirm-text").textContent = text;
    $("confirm-dedupe").hidden = !dedupe;
    $("confirm-ok").className = text.startsWith("Delete") ? "danger" : "primary";
    $("confirm-new-ids").checked = Boolean(dedupe);
    $("confirm-dedupe-text").textContent = dedupe ? ` Duplicate detection is on for this ` +
      `entity (window ${dedupe}): a copy with the message id of a message sent within that ` +
      `window is dropped as a duplicate.` : "";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ?
      { newIds: $("confirm-new-ids").checked } : null), { once: true });
    dialog.showModal();
  });
}

function deadLetterCount() {
  // the entity's count from the live state (the list shows the first 100 only)
  const e = state.entity;
  const ns = state.namespaces.find((n) => n.name === e.namespace);
  const subscriptions = ns ? (ns.topics || []).flatMap((t) => (t.subscriptions || [])
    .map((sub) => ({ name: `${t.name}/Subscriptions/${sub.name}`, counts: sub.counts }))) : [];
  const found = [...(ns ? ns.queues || [] : []), ...subscriptions]
    .find((item) => item.name === e.path);
  return found ? found.counts.dead_lettered : state.deadLetters.length;
}

function dedupeWindow() {
  // resubmitting to a subscription sends to its topic: the topic's setting counts
  const e = state.entity;
  let settings = e.settings;
  if (e.kind === "subscription") {
    const topicName = e.path.split("/")[0];
    const ns = state.namespaces.find((n) => n.name === e.namespace);
    const topic = ns && (ns.topics || []).find((t) => t.name === topicName);
    settings = topic ? topic.settings : {};
  }
  return settings.RequiresDuplicateDetection ?
    settings.DuplicateDetectionHistoryTimeWindow || "on" : null;
}

async function settle(action, all) {
  const numbers = all ? "all" : picked();
  if (!all && !numbers.length) { showError("select dead letters first"); return; }
  const count = all ? `all ${deadLetterCount()} dead letter(s)` :
    `${numbers.length} dead letter(s)`;
  const target = state.entity.kind === "subscription" ? `topic ${state.entity.path.split("/")[0]}`
    : state.entity.path;
  const text = action === "resubmit" ?
    `Resubmit ${count} to ${target}? Each copy is sent first, then the dead letter is removed.` :
    `Delete ${count} of ${state.entity.path}? They are gone for good.`;
  const answer = await confirmAction(text, action === "resubmit" ? dedupeWindow() : null);
  if (!answer) return;
  const result = await call(`dead-letters/${action}`, where(),
    { sequence_numbers: numbers, new_message_ids: answer.newIds });
  $("dl-result").textContent = `${action === "resubmit" ? "resubmitted" : "deleted"} ` +
    `${result.done.length}` + (result.not_found.length ?
      `; not found (taken or gone): ${result.not_found.join(", ")}` : "");
  await loadDeadLetters();
}

async function loadSessions() {
  $("session-detail").replaceChildren();
  if (!(state.entity.settings || {}).RequiresSession) {
    $("sessions").replaceChildren(el("li", { class: "note" }, "this entity has no sessions"));
    return;
  }
  const data = await call("sessions", where());
  $("sessions").replaceChildren(...(data.sessions.length ? data.sessions.map((id) =>
    el("li", {}, el("button", { class: "link", onclick: () => showSession(id) }, id))) :
    [el("li", { class: "note" }, "no sessions with messages or state")]));
}

async function showSession(id) {
  const detail = $("session-detail");
  detail.replaceChildren(el("p", { class: "note" }, `session ${id}: loading`));
  const messages = await call("messages", where({ session: id, count: 20 }));
  let stateText;
  try {
    const s = await call("session-state", where({ session: id }));
    stateText = s.state === null ? "(no state)" : s.state;
  } catch (e) {
    stateText = `(cannot read the state: ${e.message})`;
  }
  detail.replaceChildren(el("h3", {}, `session ${id}`),
    el("div", { "data-testid": "session-state" }, "state: ", stateText),
    el("button", { id: "session-receive", onclick: guarded(() => {
      $("peek-form").session.value = id; // the Messages tab receives and settles in it
      showTab("messages");
      return receive();
    }) }, "Receive in this session"),
    ...messages.messages.map((m) => messageCard(m, false)));
}

// ------------------------------------------------------------------ live state

function applyState(data) {
  renderPipelines(data.pipelines);
  renderNamespaces(data.namespaces);
  if (data.pipelines) {
    addSample(data.time, data.pipelines);
    drawChart();
  }
}

async function follow() {
  // server-sent events over fetch (a header can carry the token); reconnects when cut
  for (;;) {
    try {
      const response = await fetch(API + "events", { headers: headers(), cache: "no-store" });
      if (response.status === 401) {
        askForToken();
        return; // nothing to follow until a token is given (the form reloads the page)
      }
      if (!response.ok || !response.body) throw new Error(`events: ${response.status}`);
      $("live").textContent = "live";
      $("live").classList.remove("off");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).trimStart()).join("\n");
          if (data) applyState(JSON.parse(data));
        }
      }
    } catch (e) {
      // offline for now: the badge says so, and we try again
    }
    $("live").textContent = "offline";
    $("live").classList.add("off");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

async function start() {
  try {
    const data = await call("overview");
    state.history = data.history || {};
    applyState(Object.assign({}, data, { pipelines: data.pipelines }));
    document.dispatchEvent(new CustomEvent("dashboard:overview", { detail: data }));
  } catch (e) {
    showError(e.message);
  }
  follow();
}

function guarded(fn) {
  return (event) => {
    showError("");
    Promise.resolve(fn(event)).catch((e) => showError(e.message));
  };
}

$("entity-close").addEventListener("click", () => { $("entity").hidden = true; });
for (const button of document.querySelectorAll(".tabs button")) {
  button.addEventListener("click", guarded(() => showTab(button.dataset.tab)));
}
$("dl-refresh").addEventListener("click", guarded(() => loadDeadLetters(1)));
$("dl-next").addEventListener("click", guarded(() => loadDeadLetters(state.deadLettersNext)));
$("dl-resubmit").addEventListener("click", guarded(() => settle("resubmit", false)));
$("dl-resubmit-all").addEventListener("click", guarded(() => settle("resubmit", true)));
$("dl-delete").addEventListener("click", guarded(() => settle("delete", false)));
$("dl-delete-all").addEventListener("click", guarded(() => settle("delete", true)));
$("sessions-refresh").addEventListener("click", guarded(loadSessions));
window.addEventListener("resize", drawChart);
// Once every script of the page has run: the overview's event has listeners in the scripts
// after this one (eventhubs.js), and a quick answer must not come before they are there.
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
