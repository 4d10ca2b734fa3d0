// The pipeline spec editor: one spec seen as a form or as TOML or JSON text (the center
// converts between them), checked without saving — each problem shown at the field whose
// key it names — with the mapping it generates and a preview of the document for a root
// id, read live from MySQL; then saved. Uses app.js's el, api, say, show, table, may.
"use strict";

const KIND = { 1: "one_to_one", 2: "one_to_many", 3: "child" };

// What the editor holds: the spec (an admin API `Pipeline`), and the source's tables.
const editing = { spec: null, tables: [], view: "form", text: "" };

function blankSpec() {
  return { name: "", source: "", database: "", table: "", alias: "", filter: "", id: [], columns: [], relations: [], replicas: 1 };
}

function blankRelation() {
  return { name: "", kind: 2, table: "", on: {}, columns: [], filter: "", relations: [] };
}

const csv = (v) => String(v || "").split(",").map((s) => s.trim()).filter((s) => s);
const pairs = (on) => Object.entries(on || {}).map(([p, c]) => `${p}=${c}`).join(", ");
const unpair = (text) => Object.fromEntries(csv(text).map((p) => p.split("=").map((s) => s.trim())).filter((p) => p.length === 2 && p[0] && p[1]));

// An input bound to `obj[prop]`, tagged with the spec key its problems name.
function bound(label, key, obj, prop, kind) {
  const value = kind === "list" ? (obj[prop] || []).join(", ") : kind === "pairs" ? pairs(obj[prop]) : (obj[prop] ?? "");
  const input = el("input", { name: key, value: String(value) });
  input.addEventListener("input", () => {
    obj[prop] = kind === "list" ? csv(input.value) : kind === "pairs" ? unpair(input.value) : kind === "number" ? Number(input.value || 0) : input.value;
  });
  return el("label", { "data-key": key }, `${label} `, input);
}

// A select of the source's tables bound to a table (and its database).
function tablePick(key, obj, withDatabase) {
  const current = obj.database && withDatabase ? `${obj.database}.${obj.table}` : obj.table;
  const names = editing.tables.map((t) => withDatabase ? `${t.database}.${t.table}` : t.table);
  if (current && !names.includes(current)) names.unshift(current);
  const select = el("select", { name: key },
    el("option", { value: "" }, "(pick a table)"),
    ...names.map((n) => n === current ? el("option", { selected: "" }, n) : el("option", {}, n)));
  select.addEventListener("change", () => {
    if (withDatabase) {
      const [db, ...rest] = select.value.split(".");
      obj.database = db;
      obj.table = rest.join(".");
    } else {
      obj.table = select.value;
    }
  });
  const columns = () => {
    const t = editing.tables.find((x) => x.table === obj.table && (!withDatabase || x.database === obj.database));
    return t ? t.columns.map((c) => c.name).join(", ") : "";
  };
  return el("label", { "data-key": key, title: columns() }, "Table ", select);
}

function relationForm(rel, prefix, siblings, onChange) {
  const key = `${prefix}relations.${rel.name || "?"}`;
  const kind = el("select", { name: `${key}.kind` },
    ...Object.entries(KIND).map(([n, label]) => Number(n) === rel.kind ? el("option", { value: n, selected: "" }, label) : el("option", { value: n }, label)));
  kind.addEventListener("change", () => { rel.kind = Number(kind.value); });
  const children = el("div", { class: "relations" },
    ...(rel.relations || []).map((r) => relationForm(r, `${key}.`, rel.relations, onChange)));
  return el("fieldset", { "data-key": key },
    el("legend", {}, `relation ${rel.name || "(new)"}`),
    bound("Name", `${key}.name`, rel, "name"),
    el("label", { "data-key": `${key}.kind` }, "Kind ", kind),
    tablePick(`${key}.table`, rel, false),
    bound("On (parent=child)", `${key}.on`, rel, "on", "pairs"),
    bound("Columns", `${key}.columns`, rel, "columns", "list"),
    bound("Filter", `${key}.filter`, rel, "filter"),
    el("span", {},
      el("button", { type: "button", class: "add-relation", onclick: () => { (rel.relations ||= []).push(blankRelation()); onChange(); } }, `Add a relation under ${rel.name || "it"}`),
      el("button", { type: "button", onclick: () => { siblings.splice(siblings.indexOf(rel), 1); onChange(); } }, "Remove")),
    children);
}

function specForm(sources, onChange) {
  const s = editing.spec;
  const source = el("select", { name: "source" },
    el("option", { value: "" }, "(pick a source)"),
    ...sources.map((n) => n === s.source ? el("option", { selected: "" }, n) : el("option", {}, n)));
  source.addEventListener("change", async () => {
    s.source = source.value;
    await loadTables();
    onChange();
  });
  return el("div", { id: "spec-form" },
    bound("Name", "name", s, "name"),
    el("label", { "data-key": "source" }, "Source ", source),
    tablePick("table", s, true),
    bound("Alias", "alias", s, "alias"),
    bound("Id columns", "id", s, "id", "list"),
    bound("Columns", "columns", s, "columns", "list"),
    bound("Filter", "filter", s, "filter"),
    el("div", { class: "relations" }, ...(s.relations || []).map((r) => relationForm(r, "", s.relations, onChange))),
    el("button", { type: "button", class: "add-relation", onclick: () => { (s.relations ||= []).push(blankRelation()); onChange(); } }, "Add a relation"));
}

async function loadTables() {
  editing.tables = editing.spec.source
    ? ((await api("ListTables", { source: editing.spec.source, all: true }).catch(() => ({}))).tables || [])
    : [];
}

// The spec as the current view holds it, for the center.
const specRequest = (id) => editing.view === "form"
  ? { pipeline: editing.spec, id }
  : { text: editing.text, id };

// Shows each problem at the field whose key it names (or the nearest enclosing one);
// the rest above the form.
function showProblems(problems) {
  for (const old of document.querySelectorAll(".field-error")) old.remove();
  const loose = [];
  for (const p of problems) {
    let key = p.key;
    let at = null;
    while (key && !(at = document.querySelector(`#screen [data-key="${CSS.escape(key)}"]`))) {
      key = key.includes(".") ? key.slice(0, key.lastIndexOf(".")) : "";
    }
    if (at && editing.view === "form") at.append(el("span", { class: "field-error error" }, p.message));
    else loose.push(`${p.key || "spec"}: ${p.message}`);
  }
  const list = document.getElementById("spec-problems");
  list.replaceChildren(...loose.map((m) => el("li", { class: "error" }, m)));
}

SCREENS.editor = async function editor() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const [pipelines, sources] = await Promise.all([api("ListPipelines"), api("ListSources")]);
  const name = params.get("name") || "";
  if (!editing.spec || editing.spec.name !== name || params.get("fresh")) {
    const stored = (pipelines.pipelines || []).find((p) => p.name === name);
    editing.spec = stored ? JSON.parse(JSON.stringify(stored)) : blankSpec();
    editing.view = "form";
    await loadTables();
  }
  const sourceNames = (sources.sources || []).map((s) => s.name);
  const body = el("div", { id: "spec-body" });
  const output = el("div", { id: "spec-output" });
  const views = el("p", { id: "spec-views" });
  const render = () => {
    if (editing.view === "form") body.replaceChildren(specForm(sourceNames, render));
    else {
      const area = el("textarea", { id: "spec-text", rows: "24", cols: "90", spellcheck: "false" });
      area.value = editing.text;
      area.addEventListener("input", () => { editing.text = area.value; });
      body.replaceChildren(area);
    }
    for (const b of views.querySelectorAll("button")) b.className = b.dataset.view === editing.view ? "current" : "";
  };
  // Another view of the same spec: the center reads the one shown and writes the other.
  const switchTo = async (view) => {
    if (view === editing.view) return;
    try {
      const p = await api("PreviewPipeline", specRequest(""));
      if (view === "form") {
        if (!p.pipeline) { showProblems(p.problems || []); return; }
        editing.spec = p.pipeline;
        await loadTables();
      } else {
        editing.text = view === "toml" ? p.toml : p.json;
      }
      editing.view = view;
      render();
      showProblems(p.problems || []);
    } catch (e) {
      say(`Spec: ${e.message}`, true);
    }
  };
  const idInput = el("input", { name: "preview-id", placeholder: "a root id" });
  const preview = async () => {
    try {
      const p = await api("PreviewPipeline", specRequest(idInput.value.trim()));
      // Drawn again first, so every field carries the key its problems name.
      if (editing.view === "form") render();
      showProblems(p.problems || []);
      const parts = [];
      if (!(p.problems || []).length) parts.push(el("p", { id: "spec-verdict" }, "The spec fits its tables."));
      if (p.document) parts.push(el("h3", {}, `Document ${idInput.value.trim()}`), el("pre", { id: "preview-document" }, p.document));
      else if (idInput.value.trim() && !(p.problems || []).length) parts.push(el("p", {}, "MySQL yields no document for that id."));
      for (const t of p.rows || []) {
        const rows = t.rows.map((r) => JSON.parse(r));
        const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
        parts.push(el("h3", {}, `${t.node || "root"}: ${t.table}`), table(cols, rows.map((r) => cols.map((c) => JSON.stringify(r[c]) ?? ""))));
      }
      if (p.mapping) parts.push(el("h3", {}, "Generated mapping"), el("pre", { id: "preview-mapping" }, p.mapping));
      output.replaceChildren(...parts);
    } catch (e) {
      say(`Preview: ${e.message}`, true);
    }
  };
  const save = async () => {
    try {
      let spec = editing.spec;
      if (editing.view !== "form") {
        const p = await api("PreviewPipeline", specRequest(""));
        if (!p.pipeline || (p.problems || []).length) { showProblems(p.problems || []); return; }
        spec = p.pipeline;
      }
      const saved = await api("PutPipeline", spec);
      say(`pipeline ${saved.name} saved`);
      editing.spec = saved;
    } catch (e) {
      say(`Save: ${e.message}`, true);
    }
  };
  views.append(...[["form", "Form"], ["toml", "TOML"], ["json", "JSON"]].map(([v, label]) =>
    el("button", { type: "button", "data-view": v, onclick: () => switchTo(v) }, label)));
  const parts = [
    el("h2", {}, name ? `Pipeline ${name}` : "New pipeline"),
    views,
    el("ul", { id: "spec-problems" }),
    body,
    el("p", { class: "inline" },
      el("label", {}, "Preview the document of ", idInput),
      el("button", { type: "button", id: "preview", onclick: preview }, "Check and preview"),
      may("PutPipeline") ? el("button", { type: "button", id: "save-spec", onclick: save }, "Save") : null),
    output,
  ];
  render();
  return parts;
};

NAV.splice(NAV.findIndex(([s]) => s === "checks"), 0, ["editor", "Spec editor", "PreviewPipeline"]);
