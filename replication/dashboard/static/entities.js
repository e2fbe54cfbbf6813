// Entities: every setting of the open queue, topic or subscription (the Settings tab), its
// status switch, edit and delete; a subscription's rules; a form that creates queues, topics
// and subscriptions. The forms come from the server (entity_form.py: the management API's
// own names, limits and choices). Every change is checked first ("check": the server's
// answer is the sentence the confirmation shows, or what is wrong and in which field), and
// sent only once the person confirms it; a delete needs the name typed. Uses app.js's el,
// call, when, guarded, state and explorer.js's ask.
"use strict";

const admin = { found: null };
const CORRELATION = ["CorrelationId", "MessageId", "To", "ReplyTo", "Label", "SessionId",
  "ReplyToSessionId", "ContentType"];

function readable(name, text) {
  // a setting as people read it: durations spelled out, times in UTC, "never" for MaxValue
  if (text === "") return "(none)";
  if (/^P10675199D/.test(text)) return "never";
  const d = /^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?)?$/.exec(text);
  if (d && text !== "P") {
    const parts = [[d[1], "d"], [d[2], "h"], [d[3], "min"], [d[4], "s"]].filter(([v]) => v)
      .map(([v, unit]) => `${Number(v)} ${unit}`);
    return `${parts.join(" ")} (${text})`;
  }
  return /At$/.test(name) ? when(text) : text;
}

function entityNames(namespace) {
  const ns = state.namespaces.find((n) => n.name === namespace) || {};
  return [...(ns.queues || []), ...(ns.topics || [])].map((e) => e.name);
}

function fieldInputs(fields, namespace, listId) {
  // the inputs of an entity form, from the server's description of each field
  const list = el("datalist", { id: listId },
    entityNames(namespace).map((name) => el("option", { value: name })));
  return [list, el("div", { class: "row fields" }, fields.map((f) => {
    let input;
    if (f.choices) {
      input = el("select", { name: f.name }, f.choices.map((c) => el("option", { value: c }, c)));
      input.value = f.value;
    } else if (f.type === "bool") {
      input = el("input", { type: "checkbox", name: f.name });
      input.checked = Boolean(f.value);
    } else {
      input = el("input", { name: f.name, type: f.type === "int" ? "number" : "text",
        placeholder: f.hint || null, title: f.hint || null,
        list: f.type === "entity" ? listId : null });
      input.value = f.value;
    }
    input.disabled = Boolean(f.immutable);
    const title = f.immutable ? `${f.label} (cannot change once created)` : f.label;
    return f.type === "bool" ? el("label", { class: "check", title }, input, " " + title) :
      el("label", { title }, title, input);
  }))];
}

function named(form, name) { return form.querySelector(`[name="${name}"]`); }

function formValues(box) {
  const values = {};
  for (const input of box.querySelectorAll(".fields [name]")) {
    if (input.disabled) continue;
    values[input.name] = input.type === "checkbox" ? input.checked : input.value;
  }
  return values;
}

function markField(box, note, error) {
  // the error next to the form, and the input it is about marked
  for (const input of box.querySelectorAll(".invalid")) input.classList.remove("invalid");
  note.hidden = !error;
  note.textContent = error ? error.message : "";
  const input = error && error.field ? box.querySelector(`[name="${error.field}"]`) : null;
  if (input) {
    input.classList.add("invalid");
    input.focus();
  }
}

async function mutate(route, params, body, options) {
  // checked first (nothing is sent): the plan, or what is wrong; then confirmed; then done
  const checked = await call(route, params, Object.assign({}, body, { check: true }));
  if (checked.refused) throw Object.assign(new Error(checked.refused), { field: checked.field });
  const answer = await ask(checked.plan, options.fields || [], options);
  if (!answer) return null;
  return call(route, params, Object.assign({}, body, answer));
}

async function guardedForm(box, note, work) {
  markField(box, note, null);
  try {
    await work();
  } catch (e) {
    markField(box, note, e);
  }
}

// ------------------------------------------------------------------ the Settings tab

function settingsWhere() {
  return { namespace: state.entity.namespace, entity: state.entity.path };
}

async function loadSettings(note) {
  const tab = $("tab-settings");
  delete tab.dataset.entity;
  const found = await call("entity", settingsWhere());
  admin.found = found;
  const status = el("select", { id: "status-choice", "data-testid": "status-choice" },
    found.fields.find((f) => f.name === "Status").choices.map((c) =>
      el("option", { value: c }, c)));
  status.value = found.settings.Status;
  const result = el("p", { id: "entity-result", class: "note", "data-testid": "entity-result" },
    note || "");
  tab.replaceChildren(
    el("div", { class: "row" },
      el("label", {}, "status", status),
      el("button", { id: "status-apply", onclick: guarded(switchStatus) }, "Switch status…"),
      el("button", { id: "entity-edit", onclick: () => { editBox.hidden = !editBox.hidden; } },
        "Edit settings"),
      el("button", { id: "entity-delete", class: "danger", onclick: guarded(deleteEntity) },
        "Delete…")),
    result,
    el("dl", { class: "kv", id: "settings", "data-testid": "settings" },
      Object.entries(found.settings).flatMap(([name, text]) => [
        el("dt", {}, name), el("dd", { "data-setting": name }, readable(name, text))])));
  const editNote = el("p", { class: "error", hidden: true, "data-testid": "edit-error" });
  const editBox = el("form", { id: "edit-form", class: "stack", hidden: true,
    "data-testid": "edit-form" },
  el("h3", {}, "Edit settings"),
  fieldInputs(found.fields, state.entity.namespace, "edit-targets"), editNote,
  el("div", { class: "row" }, el("button", { type: "submit", class: "primary" }, "Save…")));
  editBox.addEventListener("submit", (event) => {
    event.preventDefault();
    guardedForm(editBox, editNote, async () => {
      const done = await mutate("entity/update", settingsWhere(),
        { settings: formValues(editBox), etag: found.etag }, { ok: "Save" });
      if (done) await loadSettings(`Done: ${done.done}`);
    });
  });
  tab.append(editBox);
  if (found.kind === "subscription") tab.append(...rulesBox(found.rules));
  tab.dataset.entity = found.path;
}

async function switchStatus() {
  const done = await mutate("entity/update", settingsWhere(), {
    settings: { Status: $("status-choice").value }, etag: admin.found.etag }, { ok: "Switch" });
  if (done) await loadSettings(`Done: ${done.done}`);
}

async function deleteEntity() {
  const path = state.entity.path;
  const done = await mutate("entity/delete", settingsWhere(), {}, {
    fields: [{ name: "confirm", label: "entity name" }], danger: true, ok: "Delete",
    mustType: path });
  if (!done) return;
  $("entity").hidden = true;
  $("create-result").textContent = `Done: ${done.done}`;
}

// ------------------------------------------------------------------ rules

function rulesBox(rules) {
  const form = ruleForm();
  return [
    el("h3", {}, "Rules"),
    el("table", { id: "rules", "data-testid": "rules" },
      el("thead", {}, el("tr", {}, el("th", {}, "rule"), el("th", {}, "filter"),
        el("th", {}, "action"), el("th", {}, ""))),
      el("tbody", {}, rules.map((r) => el("tr", { "data-rule": r.name },
        el("td", {}, r.name), el("td", { class: "rules" }, r.filter),
        el("td", { class: "rules" }, r.action || ""),
        el("td", {},
          el("button", { class: "link", onclick: () => form.fill(r) }, "Edit"), " ",
          el("button", { class: "link danger", onclick: guarded(() => deleteRule(r.name)) },
            "Delete…")))))),
    form.node,
  ];
}

function ruleForm() {
  // one form adds a rule or, filled from one (Edit), changes it
  const note = el("p", { class: "error", hidden: true, "data-testid": "rule-error" });
  const kind = el("select", { name: "filter_kind" },
    el("option", { value: "sql" }, "SQL filter"),
    el("option", { value: "correlation" }, "correlation filter"));
  const sql = el("label", { class: "sql-only" }, "SQL filter",
    el("textarea", { name: "filter", rows: 2, placeholder: "region = 'eu' AND amount > 100" }));
  const properties = el("div", { class: "stack", id: "rule-properties" });
  const correlation = el("fieldset", { class: "correlation-only", hidden: true },
    el("legend", {}, "correlation filter (every field set must match)"),
    el("div", { class: "row" }, CORRELATION.map((name) =>
      el("label", {}, name === "Label" ? "Label (subject)" : name, el("input", { name })))),
    properties,
    el("button", { type: "button", id: "rule-add-property",
      onclick: () => properties.append(propertyRow({})) }, "Add property"));
  const node = el("form", { id: "rule-form", class: "stack", "data-testid": "rule-form" },
    el("h3", { id: "rule-form-title" }, "Add a rule"),
    el("div", { class: "row" },
      el("label", {}, "name", el("input", { name: "name" })), el("label", {}, "filter", kind)),
    sql, correlation,
    el("label", {}, "action (optional)",
      el("input", { name: "action", placeholder: "SET priority = 'high'" })),
    note,
    el("div", { class: "row" },
      el("button", { type: "submit", class: "primary", id: "rule-submit" }, "Add rule…"),
      el("button", { type: "button", onclick: () => fill(null) }, "Clear")));
  const show = () => {
    sql.hidden = kind.value !== "sql";
    correlation.hidden = kind.value !== "correlation";
  };
  kind.addEventListener("change", show);
  let editing = null;
  const fill = (rule) => {
    editing = rule ? rule.name : null;
    node.reset();
    properties.replaceChildren();
    $("rule-form-title").textContent = rule ? `Change rule ${rule.name}` : "Add a rule";
    $("rule-submit").textContent = rule ? "Save rule…" : "Add rule…";
    named(node, "name").disabled = Boolean(rule);
    if (rule) {
      named(node, "name").value = rule.name;
      named(node, "action").value = rule.action || "";
      kind.value = rule.form.correlation ? "correlation" : "sql";
      if (rule.form.sql !== undefined) named(node, "filter").value = rule.form.sql;
      const values = rule.form.correlation || {};
      for (const name of CORRELATION) named(node, name).value = values[name] || "";
      for (const p of values.properties || []) properties.append(propertyRow(p));
    }
    show();
    markField(node, note, null);
  };
  node.addEventListener("submit", (event) => {
    event.preventDefault();
    guardedForm(node, note, async () => {
      const filter = kind.value === "sql" ? { sql: named(node, "filter").value } : {
        correlation: Object.assign(Object.fromEntries(CORRELATION.map((name) =>
          [name, named(node, name).value])),
        { properties: [...properties.children].map((row) => ({
          name: row.querySelector("[name=pname]").value,
          type: row.querySelector("[name=ptype]").value,
          value: row.querySelector("[name=pvalue]").value })) }) };
      const name = editing || named(node, "name").value;
      const done = await mutate(editing ? "rule/update" : "rule/create", settingsWhere(),
        { name, filter, action: named(node, "action").value },
        { ok: editing ? "Save rule" : "Add rule" });
      if (done) await loadSettings(`Done: ${done.done}`);
    });
  });
  return { node, fill };
}

function propertyRow(p) {
  const type = el("select", { name: "ptype" }, ["string", "int", "double", "bool", "timestamp"]
    .map((t) => el("option", { value: t }, t)));
  type.value = p.type || "string";
  const row = el("div", { class: "row property" },
    el("label", {}, "property", el("input", { name: "pname", value: p.name || "" })),
    el("label", {}, "type", type),
    el("label", {}, "value", el("input", { name: "pvalue", value: p.value || "" })),
    el("button", { type: "button", class: "link", onclick: () => row.remove() }, "remove"));
  return row;
}

async function deleteRule(name) {
  const done = await mutate("rule/delete", settingsWhere(), { name }, {
    fields: [{ name: "confirm", label: "rule name" }], danger: true, ok: "Delete",
    mustType: name });
  if (done) await loadSettings(`Done: ${done.done}`);
}

// ------------------------------------------------------------------ create

function createForm() {
  const note = el("p", { class: "error", hidden: true, "data-testid": "create-error" });
  const namespace = el("select", { name: "namespace" });
  const kind = el("select", { name: "kind" },
    ["queue", "topic", "subscription"].map((k) => el("option", { value: k }, k)));
  const topics = el("datalist", { id: "create-topics" });
  const topic = el("input", { name: "topic", list: "create-topics", autocomplete: "off" });
  const topicLabel = el("label", { hidden: true }, "topic", topic, topics);
  const fields = el("div", { id: "create-fields" });
  const form = el("form", { id: "create-form", class: "stack", "data-testid": "create-form" },
    el("div", { class: "row" }, el("label", {}, "namespace", namespace),
      el("label", {}, "kind", kind), topicLabel,
      el("label", {}, "name", el("input", { name: "name", autocomplete: "off" }))),
    fields, note,
    el("div", { class: "row" }, el("button", { type: "submit", class: "primary" }, "Create…"),
      el("span", { id: "create-result", class: "note", "data-testid": "create-result" })));
  const refill = guarded(async () => {
    const names = state.namespaces.map((n) => n.name);
    if ([...namespace.options].map((o) => o.value).join() !== names.join()) {
      namespace.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    }
    topicLabel.hidden = kind.value !== "subscription";
    const data = await call("entity-form", { namespace: namespace.value, kind: kind.value });
    fields.replaceChildren(...fieldInputs(data.fields, namespace.value, "create-targets"));
    fields.dataset.kind = data.kind;
  });
  kind.addEventListener("change", refill);
  topic.addEventListener("focus", () => {
    const ns = state.namespaces.find((n) => n.name === namespace.value) || {};
    topics.replaceChildren(...(ns.topics || []).map((t) => el("option", { value: t.name })));
  });
  namespace.addEventListener("change", refill);
  $("create-box").addEventListener("toggle", () => { if ($("create-box").open) refill(); });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guardedForm(form, note, async () => {
      const body = { kind: kind.value, name: named(form, "name").value,
        settings: formValues(form) };
      if (kind.value === "subscription") body.topic = topic.value;
      const done = await mutate("entity/create", { namespace: namespace.value }, body,
        { ok: "Create" });
      if (done) $("create-result").textContent = `Done: ${done.done}`;
    });
  });
  return form;
}

$("create-box").append(createForm());
