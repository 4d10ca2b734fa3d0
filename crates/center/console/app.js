// The Sluice console: a page over the center's admin API (POST /api/<Method>, JSON),
// with the session's CSRF token on every call. Whatever comes from the API — names,
// messages, audit entries — is put in the page as text (textContent), never as markup.
"use strict";

const RANK = { viewer: 0, operator: 1, admin: 2 };
const state = { user: "", role: "", csrf: "", roles: {} };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function say(text, isError) {
  const m = document.getElementById("message");
  m.textContent = text || "";
  m.className = isError ? "error" : "";
}

// Whether the logged-in user's role may call `method`.
function may(method) {
  const need = state.roles[method];
  return !!need && RANK[state.role] >= RANK[need.role];
}

async function request(path, body) {
  const r = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-csrf-token": state.csrf },
    body: JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) {
    if (r.status === 401) showLogin();
    const leader = answer.leader ? ` (the leader is ${answer.leader})` : "";
    throw new Error(`${answer.code || r.status}: ${answer.message || r.statusText}${leader}`);
  }
  return answer;
}

const api = (method, body) => request(`/api/${method}`, body);

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((row) => el("tr", {}, ...row.map((c) => el("td", {}, c))))));
}

function ago(ms) {
  if (!ms) return "-";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

// A button that calls `method` with `body`, says how it went and shows the screen again.
function action(label, method, body, confirmText) {
  if (!may(method)) return null;
  return el("button", {
    type: "button",
    "data-method": method,
    onclick: async () => {
      if (confirmText && !window.confirm(confirmText)) return;
      try {
        await api(method, body);
        say(`${label}: done`);
        await show(current);
      } catch (e) {
        say(`${label}: ${e.message}`, true);
      }
    },
  }, label);
}

// An explanation of one document: where its version stands in the binlog, whether it
// equals what MySQL yields now (and how not), and the rows of every table behind it.
function explained(e) {
  const verdict = e.newer_than_read
    ? "The indexed copy was written for a change after the read: explain it again."
    : e.equal ? "The index equals what MySQL yields now."
      : !e.indexed ? "The index does not hold it, but MySQL yields it."
        : !e.in_mysql ? "The index holds it, but MySQL yields no document for it."
          : "The index differs from what MySQL yields now.";
  const out = [
    el("h3", {}, `Document ${e.id} of ${e.pipeline}`),
    el("p", { id: "verdict", class: e.equal ? "" : "error" }, verdict),
    table(["index", "version", "epoch", "binlog position", "MySQL read at"],
      [[e.index, e.indexed ? e.version : "-", e.indexed ? e.version_epoch : "-", e.position || "-", e.read_at]]),
  ];
  if ((e.differences || []).length) {
    out.push(el("h3", {}, "Differences"), el("div", { id: "differences" },
      table(["field", "index", "MySQL"], e.differences.map((d) => [d.field, d.index || "(absent)", d.mysql || "(absent)"]))));
    const fix = action("Resync this document", "ResyncDocuments", { pipeline: e.pipeline, ids: [e.id] });
    if (fix) out.push(el("p", {}, fix));
  }
  for (const t of e.rows || []) {
    const rows = t.rows.map((r) => JSON.parse(r));
    const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
    out.push(el("h3", {}, `${t.node || "root"}: ${t.table} (${rows.length} rows)`),
      table(cols, rows.map((r) => cols.map((c) => JSON.stringify(r[c]) ?? ""))));
  }
  out.push(el("h3", {}, "Indexed"), el("pre", { id: "indexed" }, e.document || "-"),
    el("h3", {}, "From MySQL now"), el("pre", { id: "built" }, e.built || "-"));
  return out;
}

// Rebuilds the documents a condition on the root table, or a list of ids, names.
function resyncForm(pipelines) {
  const form = el("form", { class: "inline", id: "resync" },
    el("label", {}, "Pipeline ", pipelines),
    el("label", {}, "Rows where ", el("input", { name: "where", placeholder: "id < 100" })),
    el("label", {}, "or ids ", el("input", { name: "ids", placeholder: "1,2,3" })),
    el("button", { type: "submit" }, "Resync"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const ids = String(f.get("ids") || "").split(",").map((i) => i.trim()).filter((i) => i);
    try {
      const run = await api("ResyncDocuments", { pipeline: f.get("pipeline"), where: f.get("where"), ids });
      say(`Resync ${run.id} started (${run.scope}): its progress is on the checks screen`);
    } catch (e) {
      say(`Resync: ${e.message}`, true);
    }
  });
  return el("div", {}, el("h3", {}, "Resync documents"), form);
}

// Tables with their columns (the primary key's marked), as MySQL describes them now.
function tablesOf(tables) {
  return table(["table", "rows (estimated)", "columns"], tables.map((t) =>
    [`${t.database}.${t.table}`, t.rows_estimated,
      el("span", {}, ...t.columns.map((c, i) => el("span", { class: c.key ? "key" : "" },
        `${i ? ", " : ""}${c.name} ${c.type}${c.nullable ? "" : " not null"}`)))]));
}

// A new source (or a changed one): tested first, without saving, then added.
function sourceForm() {
  const field = (label, name, attrs) => el("label", {}, `${label} `, el("input", { name, ...attrs }));
  const result = el("div", { id: "source-test" });
  const form = el("form", { class: "grid", id: "put-source" },
    el("h3", {}, "Add a source"),
    field("Name", "name", { required: "" }),
    field("Host", "host", { required: "" }),
    field("Port", "port", { value: "3306", inputmode: "numeric" }),
    field("User", "user", { required: "" }),
    field("Password from", "password_ref", { required: "", placeholder: "env:NAME or file:/path" }),
    field("Server id", "server_id", { required: "", inputmode: "numeric" }),
    field("Tables", "tables", { placeholder: "shop.*, crm.customers (empty: every table)" }),
    el("span", {},
      el("button", { type: "button", id: "test-source" }, "Test connection"),
      el("button", { type: "submit" }, "Add source")));
  const source = () => {
    const f = new FormData(form);
    return {
      name: f.get("name"), host: f.get("host"), port: Number(f.get("port") || 3306), user: f.get("user"),
      password_ref: f.get("password_ref"), server_id: Number(f.get("server_id") || 0),
      tables: String(f.get("tables") || "").split(",").map((t) => t.trim()).filter((t) => t),
    };
  };
  form.querySelector("#test-source").addEventListener("click", async () => {
    result.replaceChildren(el("p", {}, "testing…"));
    try {
      const t = await api("TestSource", source());
      const problems = t.problems || [];
      result.replaceChildren(
        el("p", { id: "test-verdict", class: problems.length ? "error" : "" },
          problems.length ? `${problems.length} problem(s) stop it from streaming:` : `Ready: ${t.server}.`),
        problems.length ? el("ul", {}, ...problems.map((p) => el("li", {}, p))) : "",
        (t.tables || []).length ? tablesOf(t.tables) : el("p", {}, "No table matches."));
    } catch (e) {
      result.replaceChildren(el("p", { id: "test-verdict", class: "error" }, e.message));
    }
  });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const s = await api("PutSource", source());
      say(`source ${s.name} saved`);
      await show("sources");
    } catch (e) {
      say(`Add source: ${e.message}`, true);
    }
  });
  return el("div", {}, form, result);
}

// Moves a source to a new primary: its task resumes there from its confirmed GTID state.
function failoverForm(sources) {
  const form = el("form", { class: "inline", id: "failover" },
    el("label", {}, "Fail over ", el("select", { name: "name" }, ...sources.map((s) => el("option", {}, s.name)))),
    el("label", {}, "to host ", el("input", { name: "host", required: "" })),
    el("label", {}, "port ", el("input", { name: "port", inputmode: "numeric", placeholder: "same" })),
    el("button", { type: "submit" }, "Fail over"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    if (!window.confirm(`Move ${f.get("name")} to ${f.get("host")}?`)) return;
    try {
      await api("FailoverSource", { name: f.get("name"), host: f.get("host"), port: Number(f.get("port") || 0) });
      say(`source ${f.get("name")} failed over`);
      await show("sources");
    } catch (e) {
      say(`Fail over: ${e.message}`, true);
    }
  });
  return form;
}

// A pipeline's kept versions: each a rollback target while kept current, and droppable.
// How far the etl has applied each source of a pipeline, and how old that knowledge is.
function appliedOf(p) {
  const applied = p.applied || [];
  if (!applied.length) return "-";
  return applied.map((a) => `${a.position} (${(Number(a.lag_ms || 0) / 1000).toFixed(1)}s ago)`).join(", ");
}

function history(p) {
  const kept = p.history || [];
  if (!kept.length) return "-";
  const current = p.current_history || [];
  return el("span", {}, ...kept.map((v) => el("span", { class: "version" },
    `v${v}${current.includes(v) ? " (current)" : ""} `,
    current.includes(v) ? action(`Roll back to v${v}`, "RollbackPipeline", { name: p.name, to_version: v },
      `Move ${p.alias} back to v${v}?`) : null,
    action(`Drop v${v}`, "DropVersion", { name: p.name, version: v }, `Drop v${v} of ${p.name} and its index?`))));
}

// The newest compare of a held build: clean, or what differs.
function compared(c, version) {
  if (!c || c.version !== version) return "not compared";
  if (c.state === "running") return `running (${c.chunks_done}/${c.chunks})`;
  if (c.state === "failed") return `failed: ${c.error}`;
  const drift = c.missing + c.extra + c.different;
  const live = c.live ? `; vs live v${c.live.version}: ${c.live.same} same, ${c.live.only_new} only new, ${c.live.only_live} only live, ${c.live.different} different` : "";
  return drift ? `${drift} differ from MySQL (${c.missing} missing, ${c.extra} extra, ${c.different} different)${live}`
    : `equal to MySQL${live}`;
}

const SCREENS = {
  async overview() {
    const [leader, workers, tasks, pipelines] = await Promise.all([
      api("GetLeader"), api("ListWorkers"), api("ListTasks"), api("ListPipelines")]);
    // What wants attention, as the shipped alert rules see it: tasks not streaming or
    // lagging, no live worker, pipelines needing a rebuild or never built.
    const attention = [
      ...(workers.workers || []).length ? [] : ["no worker is alive"],
      ...(tasks.tasks || []).filter((t) => t.state && t.state !== "streaming").map((t) => `task ${t.source} is ${t.state}`),
      ...(tasks.tasks || []).filter((t) => (t.lag_seconds || 0) > 60).map((t) => `task ${t.source} lags ${Math.round(t.lag_seconds)} s`),
      ...(pipelines.pipelines || []).filter((p) => p.needs_rebuild).map((p) => `pipeline ${p.name} needs a rebuild: ${p.needs_rebuild}`),
      ...(pipelines.pipelines || []).filter((p) => !p.live_version && !p.building_version).map((p) => `pipeline ${p.name} was never built`),
    ];
    return [
      el("h2", {}, "Overview"),
      el("p", { id: "leader" }, `Leader ${leader.leader_id || "-"} at epoch ${leader.epoch}, answered by ${leader.answered_by}`),
      el("h3", {}, "Attention"),
      attention.length ? el("ul", { id: "attention" }, ...attention.map((a) => el("li", { class: "error" }, a)))
        : el("p", { id: "attention" }, "Nothing needs attention."),
      el("h3", {}, "Workers"),
      table(["worker", "address", "version", "tasks"], (workers.workers || []).map((w) =>
        [w.id, w.addr, w.version, (w.tasks || []).join(", ") || "-"])),
      el("h3", {}, "Tasks"),
      table(["task", "running on", "position", "state", "lag"], (tasks.tasks || []).map((t) =>
        [t.source, t.running_on || "-", t.position || "-", t.state || "-", `${(t.lag_seconds || 0).toFixed(1)}s`])),
      el("h3", {}, "Pipelines"),
      table(["pipeline", "alias", "state", "live"], (pipelines.pipelines || []).map((p) =>
        [p.name, p.alias, p.state, p.live_version ? `v${p.live_version}` : "-"])),
      action("Rebalance", "Rebalance", {}),
    ];
  },

  async sources() {
    const params = new URLSearchParams(location.hash.split("?")[1] || "");
    const r = await api("ListSources");
    const parts = [
      el("h2", {}, "Sources"),
      table(["source", "server", "user", "password", "server id", "tables", "epoch", ""], (r.sources || []).map((s) =>
        [s.name, `${s.host}:${s.port}`, s.user, s.password_ref, s.server_id, (s.tables || []).join(", ") || "every table", s.epoch,
          el("span", {},
            el("a", { href: `#sources?tables=${encodeURIComponent(s.name)}`, class: "button" }, "Tables"),
            action("Re-snapshot", "ResnapshotSource", { name: s.name },
              `Start ${s.name} again at its server's end and build each of its pipelines anew?`),
            action("Delete", "DeleteSource", { name: s.name }, `Delete source ${s.name}?`))])),
    ];
    const shown = params.get("tables");
    if (shown) {
      const t = await api("ListTables", { source: shown });
      parts.push(el("h3", {}, `Tables of ${shown}`), el("div", { id: "source-tables" }, tablesOf(t.tables || [])));
    }
    if (may("PutSource")) parts.push(sourceForm());
    if (may("FailoverSource") && (r.sources || []).length) parts.push(failoverForm(r.sources));
    return parts;
  },

  async pipelines() {
    const r = await api("ListPipelines");
    const pipelines = r.pipelines || [];
    const building = pipelines.filter((p) => p.building_version);
    const [builds, compares] = await Promise.all([
      Promise.all(building.map((p) => api("GetBuild", { name: p.name }))),
      Promise.all(building.map((p) => api("ListChecks", { pipeline: p.name, kind: "compare", limit: 1 }))),
    ]);
    return [
      el("h2", {}, "Pipelines"),
      table(["pipeline", "table", "alias", "state", "live", "building", "kept", "applied", ""], pipelines.map((p) =>
        [p.name, `${p.database}.${p.table}`, p.alias, p.state,
          p.live_version ? `v${p.live_version}` : "-", p.building_version ? `v${p.building_version}` : "-",
          history(p), appliedOf(p),
          el("span", {},
            may("PreviewPipeline") ? el("a", { href: `#editor?name=${encodeURIComponent(p.name)}`, class: "button" }, "Edit") : null,
            action("Build", "BuildPipeline", { name: p.name }),
            action("Build, hold to verify", "BuildPipeline", { name: p.name, verify: true }),
            action("Check", "StartCheck", { pipeline: p.name }),
            action("Delete", "DeletePipeline", { name: p.name }, `Delete pipeline ${p.name} and its indexes?`))])),
      may("PutPipeline") ? el("p", {}, el("a", { href: "#editor?fresh=1", id: "new-pipeline", class: "button" }, "New pipeline")) : null,
      builds.length ? el("h3", {}, "Builds under way") : null,
      builds.length ? table(["pipeline", "version", "phase", "chunks", "rows", "rows/s", "message", "compare", ""], builds.map((b, i) =>
        [b.pipeline, `v${b.version}`, b.phase, `${b.chunks_done}/${b.chunks}`,
          `${b.rows_done} of ~${b.rows_estimated}`, Math.round(b.rows_per_sec || 0), b.message || "-",
          compared((compares[i].checks || [])[0], b.version),
          el("span", {},
            b.phase === "held" ? action("Compare", "StartCompare", { pipeline: b.pipeline }) : null,
            b.phase === "held" ? action("Swap", "SwapPipeline", { name: b.pipeline }) : null,
            action("Reset", "ResetPipeline", { name: b.pipeline }, `Abandon the build of ${b.pipeline}?`))])) : null,
      builds.length ? el("p", {}, el("button", { type: "button", id: "refresh", onclick: () => show("pipelines") }, "Refresh")) : null,
    ];
  },

  async delayed() {
    const r = await api("ListPipelines");
    const delayed = (r.pipelines || []).filter((p) => JSON.stringify(p.relations || []).includes('"delayed":true'));
    const lists = await Promise.all(delayed.map((p) => api("ListDelayed", { pipeline: p.name, limit: 100 })));
    const runs = await Promise.all(delayed.map((p) => api("ListChecks", { pipeline: p.name, kind: "delayed", limit: 5 })));
    const parts = [el("h2", {}, "Delayed changes")];
    if (!delayed.length) parts.push(el("p", {}, "No pipeline has a delayed relation."));
    delayed.forEach((p, i) => {
      const l = lists[i];
      parts.push(el("h3", {}, `${p.name}: ${l.pending} waiting, ${l.applying} being applied`),
        table(["relation", "row", "changes", "first seen", "last seen", "job"], (l.changes || []).map((c) =>
          [c.node, c.values, c.changes, ago(c.first_seen_ms), ago(c.last_seen_ms), c.job || "waiting"])),
        el("p", {}, action(`Apply ${p.name}'s changes now`, "ApplyDelayed", { pipeline: p.name })),
        table(["job", "state", "changes", "chunks", "rebuilt", "started"], (runs[i].checks || []).map((c) =>
          [c.id, c.state, c.changes, `${c.chunks_done}/${c.chunks}`, c.repaired, ago(c.started_at_ms)])));
    });
    return parts;
  },

  async checks() {
    const r = await api("ListPipelines");
    const lists = await Promise.all((r.pipelines || []).map((p) => api("ListChecks", { pipeline: p.name, limit: 10 })));
    const checks = lists.flatMap((l) => l.checks || []);
    return [
      el("h2", {}, "Checks and repairs"),
      table(["id", "pipeline", "kind", "scope", "state", "chunks", "keys", "missing", "extra", "different", "repaired", "started", "examples"],
        checks.map((c) => [c.id, c.pipeline, c.kind, c.scope || (c.since ? `since ${c.since}` : "-"), c.state,
          `${c.chunks_done}/${c.chunks}`, c.keys, c.missing, c.extra, c.different, c.repaired, ago(c.started_at_ms),
          c.error || (c.examples || []).map((e) => `${e.kind} ${e.id}${e.detail ? `: ${e.detail}` : ""}`).join("; ") || "-"])),
      el("p", {}, ...(r.pipelines || []).map((p) =>
        action(`Check and repair ${p.name}`, "StartCheck", { pipeline: p.name, repair: true }))),
    ];
  },

  async documents() {
    const params = new URLSearchParams(location.hash.split("?")[1] || "");
    const r = await api("ListPipelines");
    const names = (r.pipelines || []).map((p) => p.name);
    const chosen = params.get("pipeline") || names[0] || "";
    const id = params.get("id") || "";
    const pick = (name) => el("select", { name },
      ...names.map((n) => n === chosen ? el("option", { selected: "" }, n) : el("option", {}, n)));
    const form = el("form", { class: "inline", id: "explain" },
      el("label", {}, "Pipeline ", pick("pipeline")),
      el("label", {}, "Document id ", el("input", { name: "id", required: "", value: id })),
      el("button", { type: "submit" }, "Explain"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      const next = `documents?pipeline=${encodeURIComponent(f.get("pipeline"))}&id=${encodeURIComponent(f.get("id"))}`;
      if (location.hash === `#${next}`) show(next);
      else location.hash = next;
    });
    const parts = [el("h2", {}, "Documents"), form];
    if (chosen && id) parts.push(...explained(await api("ExplainDocument", { pipeline: chosen, id })));
    if (may("ResyncDocuments")) parts.push(resyncForm(pick("pipeline")));
    return parts;
  },

  async events() {
    const params = new URLSearchParams(location.hash.split("?")[1] || "");
    const subject = params.get("subject") || "";
    const kind = params.get("kind") || "";
    const within = params.get("within") || "";
    const WITHIN = { "": "any time", "1h": "the last hour", "24h": "the last day", "7d": "the last week" };
    const HOURS = { "1h": 1, "24h": 24, "7d": 168 };
    const since_ms = HOURS[within] ? Date.now() - HOURS[within] * 3600000 : 0;
    const r = await api("ListEvents", { limit: 200, subject, kind, since_ms });
    const form = el("form", { class: "inline", id: "event-filter" },
      el("label", {}, "Subject ", el("input", { name: "subject", value: subject })),
      el("label", {}, "Kind ", el("input", { name: "kind", value: kind, placeholder: "pipeline, build, task_failed…" })),
      el("label", {}, "Within ", el("select", { name: "within" }, ...Object.entries(WITHIN).map(([v, label]) =>
        v === within ? el("option", { value: v, selected: "" }, label) : el("option", { value: v }, label)))),
      el("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new URLSearchParams([...new FormData(form)].filter(([, v]) => v));
      location.hash = `events?${f}`;
    });
    return [
      el("h2", {}, "Events"),
      form,
      table(["when", "origin", "kind", "subject", "message"], (r.events || []).map((e) =>
        [ago(e.at_ms), e.origin, e.kind, e.subject, e.message])),
      keptFor("Events", r.kept_ms),
    ];
  },

  async letters() {
    const r = await api("ListDeadLetters", { limit: 200 });
    return [
      el("h2", {}, "Dead letters"),
      table(["id", "when", "pipeline", "table", "key", "reason", ""], (r.letters || []).map((d) =>
        [d.id, ago(d.at_ms), d.pipeline || "-", d.table, d.key || "-", d.reason,
          d.not_replayable || action("Replay", "ReplayDeadLetters", { pipeline: d.pipeline, ids: [d.id] }) || ""])),
    ];
  },

  async dictionary() {
    const r = await api("ListWords");
    const form = el("form", { class: "inline", id: "add-word" },
      el("label", {}, "Dictionary ", el("select", { name: "dictionary" },
        el("option", { value: "ext" }, "ext"), el("option", { value: "stop" }, "stop"))),
      el("label", {}, "Word ", el("input", { name: "word", required: "" })),
      el("button", { type: "submit" }, "Add word"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      try {
        await api("AddWords", { dictionary: f.get("dictionary"), words: [f.get("word")] });
        say(`word ${f.get("word")} added as a draft`);
        await show("dictionary");
      } catch (e) {
        say(`Add word: ${e.message}`, true);
      }
    });
    return [
      el("h2", {}, "IK dictionary"),
      table(["dictionary", "word", "state", "added", ""], (r.words || []).map((w) => {
        const req = { dictionary: w.dictionary, words: [w.word] };
        return [w.dictionary, w.word, w.state, ago(w.added_at_ms), el("span", {},
          w.state === "published" ? null : action("Publish", "PublishWords", req),
          action("Delete", "DeleteWords", req, `Delete ${w.word}?`))];
      })),
      may("AddWords") ? form : null,
    ];
  },

  async users() {
    const r = await api("ListUsers");
    const form = el("form", { class: "inline", id: "put-user" },
      el("label", {}, "User ", el("input", { name: "name", required: "" })),
      el("label", {}, "Role ", el("select", { name: "role" },
        el("option", {}, "viewer"), el("option", {}, "operator"), el("option", {}, "admin"))),
      el("label", {}, "Password ", el("input", { name: "password", type: "password", autocomplete: "new-password" })),
      el("button", { type: "submit" }, "Save user"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      try {
        await api("PutUser", { name: f.get("name"), role: f.get("role"), password: f.get("password") });
        say(`user ${f.get("name")} saved`);
        await show("users");
      } catch (e) {
        say(`Save user: ${e.message}`, true);
      }
    });
    return [
      el("h2", {}, "Users"),
      table(["user", "role", "password", "created", ""], (r.users || []).map((u) =>
        [u.name, u.role, u.has_password ? "set" : "-", ago(u.created_at_ms),
          action("Delete", "DeleteUser", { name: u.name }, `Remove user ${u.name}?`) || ""])),
      may("PutUser") ? form : null,
    ];
  },

  async audit() {
    const r = await api("ListAudit", { limit: 200 });
    return [
      el("h2", {}, "Audit log"),
      table(["when", "user", "role", "call", "about", "from", "outcome", "detail"], (r.entries || []).map((e) =>
        [ago(e.at_ms), e.user, e.role || "-", e.method, e.target || "-", e.peer || "-", e.outcome, e.detail || "-"])),
      keptFor("Audit entries", r.kept_ms),
    ];
  },
};

// How long a history is kept (the center's retention), as a note under its table.
function keptFor(what, ms) {
  const days = Math.round(Number(ms || 0) / 86400000);
  const hours = Math.round(Number(ms || 0) / 3600000);
  const span = days >= 1 ? `${days} day${days === 1 ? "" : "s"}` : `${hours} hour${hours === 1 ? "" : "s"}`;
  return el("p", { class: "note retention" }, `${what} are kept for ${span}; the leader deletes older ones.`);
}

// Each screen and the call it needs: a screen the user cannot read is not offered.
const NAV = [
  ["overview", "Overview", "ListPipelines"],
  ["sources", "Sources", "ListSources"],
  ["pipelines", "Pipelines", "ListPipelines"],
  ["checks", "Checks", "ListChecks"],
  ["documents", "Documents", "ExplainDocument"],
  ["delayed", "Delayed", "ListDelayed"],
  ["events", "Events", "ListEvents"],
  ["letters", "Dead letters", "ListDeadLetters"],
  ["dictionary", "Dictionary", "ListWords"],
  ["users", "Users", "ListUsers"],
  ["audit", "Audit", "ListAudit"],
];

let current = "overview";

// The screens this user may read.
const offered = () => NAV.filter(([, , need]) => may(need)).map(([screen]) => screen);

async function show(name) {
  name = (name || "").split("?")[0];
  const next = offered().includes(name) ? name : "overview";
  // What was said about another screen does not stay on this one.
  if (next !== current) say("");
  current = next;
  for (const a of document.querySelectorAll("#nav a")) {
    a.className = a.dataset.screen === current ? "current" : "";
  }
  const screen = document.getElementById("screen");
  try {
    const parts = await SCREENS[current]();
    screen.replaceChildren(...parts.filter((p) => p));
    screen.dataset.screen = current;
  } catch (e) {
    say(e.message, true);
  }
}

function showLogin() {
  document.getElementById("login").hidden = false;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  document.getElementById("screen").replaceChildren();
}

function enter(session) {
  Object.assign(state, session);
  document.getElementById("login").hidden = true;
  document.getElementById("who-name").textContent = `${state.user} (${state.role})`;
  document.getElementById("who").hidden = false;
  const nav = document.getElementById("nav");
  nav.replaceChildren(...NAV.filter(([screen]) => offered().includes(screen)).map(([screen, label]) =>
    el("a", { href: `#${screen}`, "data-screen": screen }, label)));
  nav.hidden = false;
  show((location.hash || "#overview").slice(1));
}

async function start() {
  state.roles = await (await fetch("/roles")).json();
  document.getElementById("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    try {
      const session = await request("/login", { user: f.get("user"), password: f.get("password") });
      ev.target.reset();
      say("");
      enter(session);
    } catch (e) {
      say(e.message, true);
    }
  });
  document.getElementById("logout").addEventListener("click", async () => {
    await request("/logout").catch(() => {});
    Object.assign(state, { user: "", role: "", csrf: "" });
    say("logged out");
    showLogin();
  });
  window.addEventListener("hashchange", () => state.user && show(location.hash.slice(1)));
  const r = await fetch("/session", { credentials: "same-origin" });
  if (r.ok) enter(await r.json());
  else showLogin();
}

// After every script of the page (editor.js adds a screen) has run.
document.addEventListener("DOMContentLoaded", start);
