// Drives a center's console in Debian's headless Chromium, as an admin, a viewer and an
// operator (integration-tests/tests/console.rs starts the cluster and runs this).
// Environment: CONSOLE_URL, ES_URL, ADMIN_PASSWORD, VIEWER_PASSWORD, OPERATOR_PASSWORD,
// SOURCE, PIPELINE, SHOTS (the screenshots' directory). Exits non-zero, saying why, on the first
// check that fails.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env("CONSOLE_URL");
const shots = env("SHOTS");
mkdirSync(shots, { recursive: true });
const WAIT = 15000;
const XSS = "<script>alert(1)</script>";

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
// Confirmations: the one a step expects is accepted; any other is dismissed and counted.
const dialogs = [];
let expectedDialog = null;
page.on("dialog", async (d) => {
  if (expectedDialog && d.message().startsWith(expectedDialog)) {
    expectedDialog = null;
    await d.accept();
    return;
  }
  dialogs.push(d.message());
  await d.dismiss();
});
const shot = (name) => page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });

async function login(user, password) {
  await page.locator("#login input[name=user]").fill(user);
  await page.locator("#login input[name=password]").fill(password);
  await page.locator("#login button[type=submit]").click();
  await page.locator("#who-name").filter({ hasText: user }).waitFor({ timeout: WAIT });
  check(await page.locator("#login").isHidden(), `${user} logged in: the login form is gone`);
}

async function logout() {
  await page.locator("#logout").click();
  await page.locator("#login").waitFor({ state: "visible", timeout: WAIT });
}

async function screen(name) {
  await page.goto(`${url}/#${name}`);
  await page.locator(`#screen[data-screen=${name}]`).waitFor({ timeout: WAIT });
}

const navLinks = () => page.locator("#nav a").allTextContents();

// Shows the current screen again until `ready()` holds, for at most two minutes (a
// screen is a snapshot: it is looked at again, as an operator would press Refresh).
async function until(what, ready) {
  const deadline = Date.now() + 120000;
  for (;;) {
    await page.evaluate(() => show(current));
    if (await ready().catch(() => false)) break;
    if (Date.now() > deadline) throw new Error(`not in time: ${what}`);
    await page.waitForTimeout(200);
  }
  check(true, what);
}

// Changes document `id` behind Sluice's back, straight in the index `alias` points to (one
// version above its own, so the write is taken).
async function tamper(alias, id) {
  const es = env("ES_URL");
  const got = await (await fetch(`${es}/${alias}/_doc/${id}`)).json();
  const source = { ...got._source, name: "tampered in the index" };
  const put = await fetch(
    `${es}/${got._index}/_doc/${id}?version=${got._version + 1}&version_type=external&refresh=true`,
    { method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify(source) });
  check(put.ok, `document ${id} tampered with in ${got._index} (${put.status})`);
}

// Explains document `id` of `pipeline` on the documents screen; the verdict shown.
async function explain(pipeline, id) {
  const form = page.locator("#explain");
  await form.locator("select[name=pipeline]").selectOption(pipeline);
  await form.locator("input[name=id]").fill(id);
  await page.evaluate(() => { document.getElementById("verdict")?.remove(); });
  await form.locator("button[type=submit]").click();
  return page.locator("#verdict").textContent({ timeout: WAIT });
}

try {
  await page.goto(url);
  await page.locator("#login").waitFor({ state: "visible", timeout: WAIT });
  await shot("login");

  // --- an admin -------------------------------------------------------------------------
  await login("admin", env("ADMIN_PASSWORD"));
  await page.locator("#leader").filter({ hasText: "Leader c0" }).waitFor({ timeout: WAIT });
  check(true, "the overview names the leader");
  const attention = await page.locator("#attention").textContent();
  check(attention.includes(`pipeline ${env("PIPELINE")} was never built`), `the overview says what wants attention (${attention})`);
  await shot("overview");

  await screen("sources");
  await page.locator("td", { hasText: env("SOURCE") }).first().waitFor({ timeout: WAIT });
  check(true, "the sources screen lists the source");
  // A new source through the form: tested first (the server, no problem, its tables with
  // their columns, a table named as markup shown as text), then added.
  const add = page.locator("#put-source");
  await add.locator("input[name=name]").fill(env("NEW_SOURCE"));
  await add.locator("input[name=host]").fill(env("SOURCE_HOST"));
  await add.locator("input[name=port]").fill(env("SOURCE_PORT"));
  await add.locator("input[name=user]").fill(env("SOURCE_USER"));
  await add.locator("input[name=password_ref]").fill(env("SOURCE_PASSWORD_REF"));
  await add.locator("input[name=server_id]").fill(env("SOURCE_SERVER_ID"));
  await add.locator("input[name=tables]").fill(`${env("DATABASE")}.*`);
  await add.locator("#test-source").click();
  const ready = await page.locator("#test-verdict").textContent({ timeout: WAIT });
  check(ready.startsWith("Ready: "), `the connection test finds the server ready (${ready})`);
  const tested = page.locator("#source-test");
  await tested.locator("td", { hasText: `${env("DATABASE")}.items` }).waitFor({ timeout: WAIT });
  const columns = await tested.locator("tr", { hasText: `${env("DATABASE")}.items` }).locator("td").nth(2).textContent();
  check(columns.includes("id bigint") && columns.includes("name varchar"), `the test lists the table's columns (${columns})`);
  await tested.locator("td", { hasText: `${env("DATABASE")}.${XSS}` }).waitFor({ timeout: WAIT });
  check(await page.locator("#screen script").count() === 0, "a table and a column named as markup are shown as text");
  await shot("source-test");
  await add.locator("button[type=submit]").click();
  await page.locator("#message", { hasText: `source ${env("NEW_SOURCE")} saved` }).waitFor({ timeout: WAIT });
  await page.locator("#screen td", { hasText: env("NEW_SOURCE") }).first().waitFor({ timeout: WAIT });
  check(true, "an admin adds a source through the form");
  await page.locator("tr", { hasText: env("NEW_SOURCE") }).locator("a", { hasText: "Tables" }).click();
  await page.locator("#source-tables td", { hasText: `${env("DATABASE")}.items` }).waitFor({ timeout: WAIT });
  check(true, "a source's tables are listed with their columns");
  await shot("sources");

  // A pipeline of two levels through the spec editor: a mistake shown at its field,
  // the document previewed from MySQL, the same spec as TOML, then saved.
  await screen("pipelines");
  await page.locator("#new-pipeline").click();
  await page.locator("#screen[data-screen=editor]").waitFor({ timeout: WAIT });
  const notes = `${env("PIPELINE")}_notes`;
  const spec = page.locator("#spec-form");
  await spec.locator("input[name=name]").fill(notes);
  await spec.locator("select[name=source]").selectOption(env("SOURCE"));
  await spec.locator("select[name=table] option", { hasText: `${env("DATABASE")}.items` }).waitFor({ state: "attached", timeout: WAIT });
  await page.locator("#spec-form select[name=table]").selectOption(`${env("DATABASE")}.items`);
  await page.locator("#spec-form input[name=alias]").fill(notes);
  await page.locator("#spec-form > button.add-relation").click();
  await page.locator('#spec-form input[name="relations.?.name"]').fill("notes");
  await page.locator('#spec-form select[name="relations.?.table"]').selectOption("item_notes");
  await page.locator('#spec-form input[name="relations.?.on"]').fill("id=nosuch");
  await page.locator('#spec-form input[name="relations.?.columns"]').fill("note");
  await page.locator("#preview").click();
  const misplaced = page.locator('[data-key="relations.notes.on"] .field-error');
  await misplaced.waitFor({ timeout: WAIT });
  check((await misplaced.textContent()).includes("nosuch"), `the mistake is shown at its field (${await misplaced.textContent()})`);
  await page.locator('#spec-form input[name="relations.notes.on"]').fill("id=item_id");
  await page.locator("input[name=preview-id]").fill("7");
  await page.locator("#preview").click();
  const doc = await page.locator("#preview-document").textContent({ timeout: WAIT });
  check(doc.includes("second note of 7") && doc.includes('"notes"'), `the preview builds the document from MySQL (${doc})`);
  check(await page.locator(".field-error").count() === 0, "no mistake is left");
  const mapping = await page.locator("#preview-mapping").textContent();
  check(mapping.includes('"notes"') && mapping.includes("nested"), "the generated mapping is shown");
  await shot("editor");
  await page.locator('#spec-views button[data-view=toml]').click();
  await page.waitForFunction(() => (document.getElementById("spec-text")?.value || "").includes("[[relations]]"), null, { timeout: WAIT });
  const toml = await page.locator("#spec-text").inputValue();
  check(toml.includes('name = "notes"') && toml.includes("item_id"), "the same spec as TOML");
  await page.locator('#spec-views button[data-view=form]').click();
  await page.locator('#spec-form input[name="relations.notes.on"]').waitFor({ timeout: WAIT });
  check(await page.locator('#spec-form input[name="relations.notes.on"]').inputValue() === "id=item_id", "and back as the form");
  await page.locator("#save-spec").click();
  await page.locator("#message", { hasText: `pipeline ${notes} saved` }).waitFor({ timeout: WAIT });
  check(true, "an admin saves a two-level pipeline made in the editor");

  await screen("users");
  const form = page.locator("#put-user");
  await form.locator("input[name=name]").fill("olga");
  await form.locator("select[name=role]").selectOption("operator");
  await form.locator("input[name=password]").fill(env("OPERATOR_PASSWORD"));
  await form.locator("button[type=submit]").click();
  await page.locator("td", { hasText: /^olga$/ }).waitFor({ timeout: WAIT });
  check(true, "an admin adds an operator through the form");
  // A name that is markup: refused, and shown as text wherever it appears.
  await form.locator("input[name=name]").fill(XSS);
  await form.locator("input[name=password]").fill("");
  await form.locator("button[type=submit]").click();
  await page.locator("#message.error", { hasText: "InvalidArgument" }).waitFor({ timeout: WAIT });
  check((await page.locator("#message").textContent()).includes(XSS), "the refusal shows the name as text");
  await shot("users");

  await screen("audit");
  await page.locator("td", { hasText: XSS }).first().waitFor({ timeout: WAIT });
  check(await page.locator("#screen script").count() === 0, "the audit log shows markup as text, no script element");
  await page.locator(".retention", { hasText: "kept for 90 days" }).waitFor({ timeout: WAIT });
  check(true, "the audit log says how long it is kept");
  await shot("audit");
  await logout();

  // --- a viewer -------------------------------------------------------------------------
  await login("vera", env("VIEWER_PASSWORD"));
  // The admin's last screen (the audit log) is not one a viewer may read: the overview
  // shows instead, and nothing was refused.
  await page.locator("#screen[data-screen=overview]").waitFor({ timeout: WAIT });
  check(!(await page.locator("#message").textContent()).includes("PermissionDenied"),
    "a viewer's console asks nothing it would be refused");
  const viewerNav = await navLinks();
  check(!viewerNav.includes("Users") && !viewerNav.includes("Audit"),
    `a viewer is offered no users or audit screen (${viewerNav})`);
  await screen("pipelines");
  await page.locator("td", { hasText: env("PIPELINE") }).first().waitFor({ timeout: WAIT });
  check(await page.locator("#screen button").count() === 0, "a viewer sees no control that changes anything");
  await screen("overview");
  check(await page.locator("#screen button").count() === 0, "not even Rebalance");
  const direct = await page.evaluate(async () => {
    const r = await fetch("/api/Rebalance", {
      method: "POST",
      headers: { "content-type": "application/json", "x-csrf-token": state.csrf },
      body: "{}",
    });
    return { status: r.status, body: await r.json() };
  });
  check(direct.status === 403 && direct.body.code === "PermissionDenied",
    `the API refuses a viewer's call made directly (${JSON.stringify(direct)})`);
  await shot("viewer");
  await screen("events");
  await page.locator("#screen td", { hasText: "pipeline put" }).first().waitFor({ timeout: WAIT });
  await page.locator("#event-filter input[name=subject]").fill(env("PIPELINE"));
  await page.locator("#event-filter input[name=kind]").fill("pipeline");
  await page.locator("#event-filter select[name=within]").selectOption("1h");
  await page.locator("#event-filter button").click();
  await page.waitForFunction((p) => {
    const rows = [...document.querySelectorAll("#screen tbody tr")];
    const cell = (r, n) => r.querySelector(`td:nth-child(${n})`).textContent;
    return rows.length > 0 && rows.every((r) => cell(r, 4) === p && cell(r, 3) === "pipeline");
  }, env("PIPELINE"), { timeout: WAIT });
  check(true, "a viewer reads the events, filtered by subject, kind and time");
  await shot("events");
  await logout();

  // --- an operator ----------------------------------------------------------------------
  await login("olga", env("OPERATOR_PASSWORD"));
  await screen("pipelines");
  const build = page.locator("button[data-method=BuildPipeline]").first();
  await build.click();
  await page.locator("#message", { hasText: "Build: done" }).waitFor({ timeout: WAIT });
  check(true, "an operator starts a build");
  check(await page.locator("button[data-method=DeletePipeline]").count() === 0,
    "an operator is offered no pipeline deletion");
  await shot("pipelines");
  // The build's progress, looked at again until the alias has moved to it.
  const deadline = Date.now() + 120000;
  let phases = new Set();
  for (;;) {
    await page.evaluate(() => show("pipelines"));
    for (const p of await page.locator("#screen table:nth-of-type(2) tbody tr td:nth-child(3)").allTextContents()) {
      phases.add(p);
    }
    const live = await page.locator("#screen table").first().locator("tbody tr td:nth-child(5)").first().textContent();
    if (live === "v2") break;
    if (Date.now() > deadline) throw new Error(`the build never went live (phases seen: ${[...phases]})`);
    await page.waitForTimeout(200);
  }
  check(true, `the pipelines screen follows the build to its swap (phases seen: ${[...phases].join(", ") || "none in time"})`);
  await shot("build-done");

  // A verified build: held once caught up, compared (equal to MySQL), swapped; then the
  // alias rolled back to the version it left, kept current.
  await screen("pipelines");
  // The row of the pipeline itself (not of the one the admin named after it).
  const rowOf = (table) => table.locator("tr").filter({
    has: page.locator("td:nth-child(1)", { hasText: new RegExp(`^${env("PIPELINE")}$`) }),
  });
  const items = rowOf(page.locator("#screen table").first());
  await until("the pipeline shows how far the etl has applied it", async () => {
    await page.evaluate(() => show("pipelines"));
    return /:\d+ \(/.test(await rowOf(page.locator("#screen table").first()).locator("td:nth-child(8)").textContent());
  });
  await items.locator("button", { hasText: "Build, hold to verify" }).click();
  await page.locator("#message", { hasText: "Build, hold to verify: done" }).waitFor({ timeout: WAIT });
  const builds = () => rowOf(page.locator("#screen table:nth-of-type(2)"));
  await until("the build is held", async () => (await builds().locator("td:nth-child(3)").textContent()) === "held");
  await builds().locator("button[data-method=StartCompare]").click();
  await until("the compare finds the held version equal to MySQL", async () =>
    (await builds().locator("td:nth-child(8)").textContent()).startsWith("equal to MySQL"));
  await shot("verified");
  await builds().locator("button[data-method=SwapPipeline]").click();
  const live = () => rowOf(page.locator("#screen table").first()).locator("td:nth-child(5)").textContent();
  await until("the alias moves to v3", async () => (await live()) === "v3");
  const kept = await rowOf(page.locator("#screen table").first()).locator("td:nth-child(7)").textContent();
  check(kept.includes("v2 (current)"), `the version it left is kept current (${kept})`);
  expectedDialog = "Move ";
  await page.locator("button[data-method=RollbackPipeline]", { hasText: "Roll back to v2" }).click();
  await until("the alias rolls back to v2", async () => (await live()) === "v2");
  check(true, "an operator verifies a build, swaps it and rolls it back in the console");
  await shot("rollback");

  // A document changed behind Sluice's back: explain shows the field, resync puts it right.
  await tamper(env("PIPELINE"), "7");
  await screen("documents");
  const verdict = await explain(env("PIPELINE"), "7");
  check(verdict.includes("differs"), `explain finds the tampered document (${verdict})`);
  const differing = await page.locator("#differences tbody td:first-child").allTextContents();
  check(differing.length === 1 && differing[0] === "name", `explain names the field (${differing})`);
  check((await page.locator("#screen h3", { hasText: /^root: / }).count()) === 1, "explain lists the root row");
  await shot("explain");
  await page.locator("button[data-method=ResyncDocuments]").click();
  await page.locator("#message", { hasText: "Resync this document: done" }).waitFor({ timeout: WAIT });
  const resynced = Date.now() + 60000;
  for (;;) {
    const now = await explain(env("PIPELINE"), "7");
    if (now.includes("equals")) break;
    if (Date.now() > resynced) throw new Error(`the resync never put document 7 right (${now})`);
    await page.waitForTimeout(200);
  }
  check(true, "a resync from the explanation puts the document right");
  await shot("resync");

  await screen("dictionary");
  const word = page.locator("#add-word");
  await word.locator("input[name=word]").fill("sluicecanal");
  await word.locator("button[type=submit]").click();
  const row = page.locator("tr", { hasText: "sluicecanal" });
  await row.locator("td", { hasText: /^draft$/ }).waitFor({ timeout: WAIT });
  await row.locator("button[data-method=PublishWords]").click();
  await page.locator("tr", { hasText: "sluicecanal" }).locator("td", { hasText: /^published$/ }).waitFor({ timeout: WAIT });
  check(true, "an operator adds a dictionary word and publishes it");
  await shot("dictionary");

  await screen("checks");
  await page.locator("button[data-method=StartCheck]").first().click();
  await page.locator("#screen td", { hasText: env("PIPELINE") }).first().waitFor({ timeout: WAIT });
  check(true, "an operator starts a check and repair, listed on the checks screen");
  await shot("checks");

  await screen("letters");
  await shot("letters");
  await logout();

  check(dialogs.length === 0, `no dialog opened (${dialogs})`);
  console.log("all browser checks passed");
} catch (e) {
  await shot("failure").catch(() => {});
  console.error(e.stack || String(e));
  process.exitCode = 1;
} finally {
  await browser.close();
}
