//! `sluicectl pipelines`: specs, builds and their versions, checks, compares and swaps.

use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sluice_model::BuildPhase;
use sluice_model::PipelineSpec;
use sluice_proto::v1::*;

use crate::progress::{Progress, Step};
use crate::{check, or_dash, print, version, Conn, Output};

#[derive(Subcommand)]
pub enum PipelineCmd {
    List,
    /// Create or replace a pipeline (`--spec FILE` for one with relations).
    Put(Box<PipelineArgs>),
    /// Check a pipeline without saving it: its problems (each at its key), the mapping
    /// it generates and, with --document, the document it would build for that `_id`,
    /// read from MySQL now (exit 1 on a problem).
    Preview {
        #[command(flatten)]
        args: Box<PipelineArgs>,
        /// The `_id` of a document to build.
        #[arg(long)]
        document: Option<String>,
    },
    /// One pipeline: its tables as a tree (`-o json`: its whole spec and state).
    Get {
        name: String,
    },
    /// Delete a pipeline and (once no etl writes to them) its indexes.
    Delete {
        name: String,
    },
    /// Build the next version of the index from a snapshot; the alias moves when done.
    Build {
        name: String,
        /// Rows per chunk (default 10000).
        #[arg(long, default_value_t = 0)]
        chunk_rows: u64,
        /// Rows per second per chunk reader (0: no limit).
        #[arg(long, default_value_t = 0)]
        throttle: u64,
        /// Follow the build with a progress bar until the alias moved (with --verify:
        /// until the build is held).
        #[arg(long)]
        wait: bool,
        /// Hold the new version once it caught up, beside the live one and taking live
        /// changes too, until `pipelines swap` (after a clean `pipelines compare`).
        #[arg(long)]
        verify: bool,
    },
    /// Compare a build held by --verify with MySQL (the alias may move only when they
    /// are equal) and with the live version (what the rebuild changes).
    Compare {
        name: String,
        /// Put right what differs from MySQL in the held version (then compare again).
        #[arg(long)]
        repair: bool,
        /// Follow it with a progress bar; exit 1 when it failed or found drift it did not
        /// repair.
        #[arg(long)]
        wait: bool,
    },
    /// Move the alias to a build held by --verify: refused unless its newest compare
    /// found it equal to MySQL, or with --force.
    Swap {
        name: String,
        #[arg(long)]
        force: bool,
        /// Wait until the alias moved.
        #[arg(long)]
        wait: bool,
    },
    /// Abandon a build in progress (the live alias is untouched).
    Reset {
        name: String,
    },
    /// Move the alias back to a kept version that was kept current (default: the newest).
    Rollback {
        name: String,
        /// The version to go back to.
        #[arg(long)]
        to: Option<u32>,
    },
    /// Drop a kept version (no longer a rollback target; its index is deleted).
    DropVersion {
        name: String,
        version: u32,
    },
    /// A build's progress (`--wait` follows it to the end).
    Status {
        name: String,
        #[arg(long)]
        wait: bool,
    },
    /// Compare the live index with MySQL (through the document builder), chunk by chunk
    /// on the workers: documents missing, extra (orphans) or different, with examples.
    Check {
        name: String,
        /// Only roots changed this recently by the spec's `check.updated_column` (`24h`);
        /// orphans are found by a full check only.
        #[arg(long, conflicts_with = "full")]
        since: Option<String>,
        /// Every row (the default).
        #[arg(long)]
        full: bool,
        /// Put right what differs: rewrite documents, delete orphans (through the etl,
        /// at the version of the read, so a newer change always wins).
        #[arg(long)]
        repair: bool,
        /// Follow it with a progress bar; exit 1 when it failed or found drift it did not
        /// repair.
        #[arg(long)]
        wait: bool,
    },
    /// Rebuild chosen documents through the etl at the version of their read (a newer
    /// change always wins): the root rows matching a condition, or documents by `_id`.
    Resync {
        name: String,
        /// A condition on the root table, checked like a pipeline filter
        /// (`"updated_at > '2026-11-01'"`).
        #[arg(
            long = "where",
            required_unless_present = "ids",
            conflicts_with = "ids"
        )]
        condition: Option<String>,
        /// Documents by `_id`, comma-separated.
        #[arg(long, value_delimiter = ',')]
        ids: Vec<String>,
        /// Follow it with a progress bar; exit 1 when it failed.
        #[arg(long)]
        wait: bool,
    },
    /// Why a document looks the way it does: its version and the binlog position it
    /// stands for, the rows that build it now, and how it differs from what MySQL yields.
    Explain {
        name: String,
        id: String,
    },
    /// A pipeline's checks, newest first, with examples of what they found.
    Checks {
        name: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only `check`, `compare` or `delayed` runs.
        #[arg(long, default_value = "")]
        kind: String,
    },
}

#[derive(Args)]
pub struct PipelineArgs {
    name: String,
    /// The whole pipeline from a TOML or JSON file (relations, filters, join mode; see
    /// the README's pipeline spec); the flags below describe a single table instead.
    #[arg(long, conflicts_with_all = ["source", "database", "table", "alias", "columns", "fields", "filter", "id"])]
    spec: Option<std::path::PathBuf>,
    #[arg(long, required_unless_present = "spec")]
    source: Option<String>,
    #[arg(long, required_unless_present = "spec")]
    database: Option<String>,
    #[arg(long, required_unless_present = "spec")]
    table: Option<String>,
    /// Default: the name, lowercased.
    #[arg(long)]
    alias: Option<String>,
    /// Columns to index (comma-separated); none indexes every column.
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,
    /// Only rows matching this SQL condition are documents (e.g. `deleted = 0`).
    #[arg(long)]
    filter: Option<String>,
    /// Columns whose values make the document `_id` (comma-separated); default: the primary key.
    #[arg(long, value_delimiter = ',')]
    id: Vec<String>,
    #[arg(long)]
    shards: Option<u32>,
    #[arg(long)]
    replicas: Option<u32>,
    #[arg(long)]
    tombstone_retention: Option<String>,
    /// Earlier versions kept current for rollback (default 1; 0: none).
    #[arg(long)]
    keep_history: Option<u32>,
    /// The index's refresh_interval (`1s`, `30s`, `-1`: off); default: the server's.
    #[arg(long)]
    refresh_interval: Option<String>,
    /// Build by itself when DDL changes rows without row events (ADD COLUMN with a
    /// default, DROP/MODIFY/RENAME COLUMN, TRUNCATE...); otherwise it is only marked.
    #[arg(long)]
    auto_rebuild: bool,
    /// A column's mapping override, `COLUMN:KEY=VALUE[,KEY=VALUE...]`, repeatable. Keys:
    /// type, analyzer, search_analyzer, keyword (true/false), copy_to (targets joined
    /// by `+`), index (true/false). E.g. `--field title:analyzer=english,copy_to=all`.
    #[arg(long = "field", value_parser = parse_field)]
    fields: Vec<(String, FieldMapping)>,
}

impl PipelineArgs {
    /// The pipeline these arguments describe: the spec file's, or a single table's; the
    /// settings flags apply to either.
    fn spec(&self) -> anyhow::Result<PipelineSpec> {
        let mut spec = match &self.spec {
            Some(path) => {
                let spec = read_spec(path)?;
                if !spec.name.is_empty() && spec.name != self.name {
                    bail!(
                        "{}: names the pipeline `{}`, the command line `{}`",
                        path.display(),
                        spec.name,
                        self.name
                    );
                }
                PipelineSpec {
                    name: self.name.clone(),
                    ..spec
                }
            }
            None => {
                let required = |v: &Option<String>| v.clone().unwrap_or_default();
                let mut spec = PipelineSpec::table(
                    &self.name,
                    &required(&self.source),
                    &required(&self.database),
                    &required(&self.table),
                );
                spec.alias = self.alias.clone().unwrap_or_default();
                spec.columns = self.columns.clone();
                spec.filter = self.filter.clone().unwrap_or_default();
                spec.id = self.id.clone();
                let fields = self.fields.iter().cloned().collect();
                spec.fields = sluice_proto::convert::overrides(&fields);
                spec
            }
        };
        if let Some(n) = self.shards {
            spec.shards = n;
        }
        if let Some(n) = self.replicas {
            spec.replicas = n;
        }
        if let Some(t) = &self.tombstone_retention {
            spec.tombstone_retention = t.clone();
        }
        if let Some(r) = &self.refresh_interval {
            spec.refresh_interval = r.clone();
        }
        if let Some(n) = self.keep_history {
            spec.keep_history = n;
        }
        spec.auto_rebuild |= self.auto_rebuild;
        Ok(spec)
    }
}

/// A pipeline spec file: JSON when it says so (`.json`, or it starts with `{`), TOML
/// otherwise. Errors name the key.
fn read_spec(path: &std::path::Path) -> anyhow::Result<PipelineSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--spec {}", path.display()))?;
    sluice_proto::spec_text::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// `COLUMN:KEY=VALUE[,KEY=VALUE...]` as a column's field mapping override.
fn parse_field(arg: &str) -> Result<(String, FieldMapping), String> {
    let (column, spec) = arg
        .split_once(':')
        .ok_or("expected COLUMN:KEY=VALUE[,KEY=VALUE...]")?;
    let mut f = FieldMapping::default();
    let flag = |key: &str, v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}: `{v}` is not true or false")),
    };
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (key, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected KEY=VALUE"))?;
        match key {
            "type" => f.r#type = v.into(),
            "analyzer" => f.analyzer = v.into(),
            "search_analyzer" => f.search_analyzer = v.into(),
            "keyword" => f.keyword = Some(flag(key, v)?),
            "index" => f.index = Some(flag(key, v)?),
            "copy_to" => f.copy_to.extend(v.split('+').map(String::from)),
            _ => {
                return Err(format!(
                    "`{key}`: not a field key (type, analyzer, search_analyzer, keyword, copy_to, index)"
                ))
            }
        }
    }
    Ok((column.to_owned(), f))
}

/// Runs one `pipelines` command. Longer than 80 lines because it is one short arm per
/// command (a request, then its printing); the longer ones are functions of their own.
pub async fn run(conn: &mut Conn<'_>, out: Output, cmd: &PipelineCmd) -> anyhow::Result<()> {
    match cmd {
        PipelineCmd::Build {
            name,
            chunk_rows,
            throttle,
            wait,
            verify,
        } => {
            let req = BuildRequest {
                name: name.clone(),
                chunk_rows: *chunk_rows,
                throttle_rows_per_sec: *throttle,
                verify: *verify,
            };
            let b = conn
                .call_with(req, |mut c, req| async move { c.build_pipeline(req).await })
                .await?;
            if *wait {
                follow_build(conn, name, out, false).await?;
            } else {
                print_build(out, &b);
            }
        }
        PipelineCmd::Status { name, wait } => {
            if *wait {
                follow_build(conn, name, out, false).await?;
            } else {
                let req = GetBuildRequest { name: name.clone() };
                let b = conn
                    .call_with(req, |mut c, req| async move { c.get_build(req).await })
                    .await?;
                print_build(out, &b);
            }
        }
        PipelineCmd::Check {
            name,
            since,
            full: _,
            repair,
            wait,
        } => {
            let req = CheckRequest {
                pipeline: name.clone(),
                since: since.clone().unwrap_or_default(),
                repair: *repair,
            };
            let c = conn
                .call_with(req, |mut c, req| async move { c.start_check(req).await })
                .await?;
            check::started(conn, out, c, *wait).await?;
        }
        PipelineCmd::Resync {
            name,
            condition,
            ids,
            wait,
        } => {
            let req = ResyncRequest {
                pipeline: name.clone(),
                r#where: condition.clone().unwrap_or_default(),
                ids: ids.clone(),
            };
            let c = conn
                .call_with(
                    req,
                    |mut c, req| async move { c.resync_documents(req).await },
                )
                .await?;
            check::started(conn, out, c, *wait).await?;
        }
        PipelineCmd::Explain { name, id } => {
            let req = ExplainRequest {
                pipeline: name.clone(),
                id: id.clone(),
            };
            let e = conn
                .call_with(
                    req,
                    |mut c, req| async move { c.explain_document(req).await },
                )
                .await?;
            crate::explain::print(out, &e);
        }
        PipelineCmd::Compare { name, repair, wait } => {
            let req = CompareRequest {
                pipeline: name.clone(),
                repair: *repair,
            };
            let c = conn
                .call_with(req, |mut c, req| async move { c.start_compare(req).await })
                .await?;
            check::started(conn, out, c, *wait).await?;
        }
        PipelineCmd::Swap { name, force, wait } => {
            let req = SwapRequest {
                name: name.clone(),
                force: *force,
            };
            let b = conn
                .call_with(req, |mut c, req| async move { c.swap_pipeline(req).await })
                .await?;
            if *wait {
                follow_build(conn, name, out, true).await?;
            } else {
                print_build(out, &b);
            }
        }
        PipelineCmd::Checks { name, limit, kind } => {
            check::list(conn, out, name, kind, *limit).await?;
        }
        PipelineCmd::Reset { name } => {
            let req = ResetRequest { name: name.clone() };
            let p = conn
                .call_with(req, |mut c, req| async move { c.reset_pipeline(req).await })
                .await?;
            print_versions(out, &p);
        }
        PipelineCmd::Rollback { name, to } => {
            let req = RollbackRequest {
                name: name.clone(),
                to_version: to.unwrap_or(0),
            };
            let p = conn
                .call_with(
                    req,
                    |mut c, req| async move { c.rollback_pipeline(req).await },
                )
                .await?;
            print_versions(out, &p);
        }
        PipelineCmd::DropVersion { name, version } => {
            let req = DropVersionRequest {
                name: name.clone(),
                version: *version,
            };
            let p = conn
                .call_with(req, |mut c, req| async move { c.drop_version(req).await })
                .await?;
            print_versions(out, &p);
        }
        PipelineCmd::List => list(conn, out).await?,
        PipelineCmd::Put(a) => put(conn, out, a).await?,
        PipelineCmd::Preview { args, document } => {
            preview(conn, out, args, document.as_deref()).await?
        }
        PipelineCmd::Get { name } => get(conn, out, name).await?,
        PipelineCmd::Delete { name } => {
            crate::delete(conn, out, name, crate::Deleting::Pipeline).await?;
        }
    }
    Ok(())
}

/// `pipelines list`: every pipeline, and which need a rebuild and why.
async fn list(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.list_pipelines(ListPipelinesRequest {}).await })
        .await?;
    print(
        out,
        &[
            "name",
            "source",
            "table",
            "alias",
            "state",
            "live",
            "building",
            "columns",
            "relations",
            "shards",
            "replicas",
            "rebuild",
            "applied",
        ],
        r.pipelines
            .iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    p.source.clone(),
                    format!("{}.{}", p.database, p.table),
                    p.alias.clone(),
                    or_dash(&p.state),
                    version(p.live_version),
                    version(p.building_version),
                    if p.columns.is_empty() {
                        "*".into()
                    } else {
                        p.columns.join(",")
                    },
                    count_relations(&p.relations).to_string(),
                    p.shards.to_string(),
                    p.replicas.to_string(),
                    if p.needs_rebuild.is_empty() {
                        "-"
                    } else {
                        "needed"
                    }
                    .into(),
                    applied_cell(&p.applied),
                ]
            })
            .collect(),
        Value::Array(r.pipelines.iter().map(pipeline_json).collect()),
    );
    if out == Output::Table {
        for p in r.pipelines.iter().filter(|p| !p.needs_rebuild.is_empty()) {
            println!(
                "\n{} needs a rebuild (sluicectl pipelines build {}): {}",
                p.name, p.name, p.needs_rebuild
            );
        }
    }
    Ok(())
}

/// `pipelines put`: creates or replaces a pipeline from its spec.
async fn put(conn: &mut Conn<'_>, out: Output, a: &PipelineArgs) -> anyhow::Result<()> {
    let spec = a.spec()?;
    let p = sluice_proto::convert::pipeline(&spec, &Default::default());
    let p = conn
        .call_with(p, |mut c, p| async move { c.put_pipeline(p).await })
        .await?;
    print(
        out,
        &["pipeline", "alias", "tables"],
        vec![vec![
            p.name.clone(),
            p.alias.clone(),
            (1 + count_relations(&p.relations)).to_string(),
        ]],
        pipeline_json(&p),
    );
    Ok(())
}

/// `pipelines preview`: fails (exit 1) when the spec has a problem.
async fn preview(
    conn: &mut Conn<'_>,
    out: Output,
    a: &PipelineArgs,
    id: Option<&str>,
) -> anyhow::Result<()> {
    let req = PreviewRequest {
        pipeline: Some(sluice_proto::convert::pipeline(
            &a.spec()?,
            &Default::default(),
        )),
        text: String::new(),
        id: id.unwrap_or_default().to_owned(),
    };
    let p = conn
        .call_with(
            req,
            |mut c, req| async move { c.preview_pipeline(req).await },
        )
        .await?;
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    if out == Output::Json {
        let v = json!({
            "problems": p.problems.iter().map(|q| json!({"key": q.key, "message": q.message})).collect::<Vec<_>>(),
            "mapping": parse(&p.mapping),
            "document": parse(&p.document),
            "rows": p.rows.iter().map(|t| json!({
                "node": t.node, "table": t.table,
                "rows": t.rows.iter().map(|r| parse(r)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        for q in &p.problems {
            println!(
                "problem: {}: {}",
                if q.key.is_empty() { "spec" } else { &q.key },
                q.message
            );
        }
        if !p.mapping.is_empty() {
            println!("mapping properties:\n{}", p.mapping);
        }
        if !p.document.is_empty() {
            println!("document: {}", p.document);
        }
    }
    if !p.problems.is_empty() {
        let each: Vec<String> = p
            .problems
            .iter()
            .map(|q| format!("{}: {}", q.key, q.message))
            .collect();
        anyhow::bail!("the spec has problems: {}", each.join("; "));
    }
    Ok(())
}

/// `pipelines get`: one pipeline's spec, its tree of relations drawn as an outline.
async fn get(conn: &mut Conn<'_>, out: Output, name: &str) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.list_pipelines(ListPipelinesRequest {}).await })
        .await?;
    let p = r
        .pipelines
        .iter()
        .find(|p| p.name == name)
        .with_context(|| format!("no pipeline `{name}`"))?;
    if out == Output::Json {
        println!("{}", serde_json::to_string_pretty(&pipeline_json(p))?);
    } else {
        println!(
            "{} {}.{}{} -> {} ({}, live {}, building {})",
            p.name,
            p.database,
            p.table,
            if p.filter.is_empty() {
                String::new()
            } else {
                format!(" where {}", p.filter)
            },
            p.alias,
            p.state,
            version(p.live_version),
            version(p.building_version)
        );
        let mut lines = Vec::new();
        relation_lines(&p.relations, 1, &mut lines);
        for line in lines {
            println!("{line}");
        }
    }
    Ok(())
}

fn build_json(b: &BuildStatus) -> Value {
    json!({"pipeline": b.pipeline, "version": b.version, "phase": b.phase, "chunks": b.chunks,
           "chunks_done": b.chunks_done, "rows_done": b.rows_done, "rows_estimated": b.rows_estimated,
           "rows_per_sec": b.rows_per_sec, "started_at_ms": b.started_at_ms, "message": b.message,
           "needs_rebuild": b.needs_rebuild})
}

fn print_build(out: Output, b: &BuildStatus) {
    print(
        out,
        &[
            "pipeline", "version", "phase", "chunks", "rows", "rows/s", "note",
        ],
        vec![vec![
            b.pipeline.clone(),
            version(b.version),
            b.phase.clone(),
            format!("{}/{}", b.chunks_done, b.chunks),
            format!("{}/~{}", b.rows_done, b.rows_estimated),
            format!("{:.0}", b.rows_per_sec),
            or_dash(&b.message),
        ]],
        build_json(b),
    );
    if out == Output::Table && !b.needs_rebuild.is_empty() {
        println!(
            "\n{} needs a rebuild (sluicectl pipelines build {}): {}",
            b.pipeline, b.pipeline, b.needs_rebuild
        );
    }
}

/// Follows a build with a progress bar until it ends, or until it is held for
/// verification unless `through_held` (a swap was just released).
async fn follow_build(
    conn: &mut Conn<'_>,
    name: &str,
    out: Output,
    through_held: bool,
) -> anyhow::Result<()> {
    let req = GetBuildRequest {
        name: name.to_owned(),
    };
    let mut progress: Option<Progress> = None;
    loop {
        let b = conn
            .call_with(
                req.clone(),
                |mut c, req| async move { c.get_build(req).await },
            )
            .await?;
        let phase = b.phase_of();
        if phase == Some(BuildPhase::Failed) {
            if let Some(p) = progress {
                p.finish();
            }
            print_build(out, &b);
            bail!("the build of version {} failed: {}", b.version, b.message);
        }
        if out == Output::Table {
            progress
                .get_or_insert_with(|| Progress::stderr(format!("{} v{}", b.pipeline, b.version)))
                .show(build_step(&b));
        }
        let finished = matches!(phase, Some(BuildPhase::Done | BuildPhase::None));
        if finished || (phase == Some(BuildPhase::Held) && !through_held) {
            if let Some(p) = progress {
                p.finish();
            }
            print_build(out, &b);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn build_step(b: &BuildStatus) -> Step {
    let eta = if b.rows_per_sec > 0.0 && b.rows_done < b.rows_estimated {
        format!(
            ", ETA {:.0}s",
            (b.rows_estimated - b.rows_done) as f64 / b.rows_per_sec
        )
    } else {
        String::new()
    };
    Step {
        done: b.rows_done,
        total: b.rows_estimated,
        stage: b.phase.clone(),
        detail: format!(
            "{}/~{} rows, {}/{} chunks, {:.0} rows/s{eta}",
            b.rows_done, b.rows_estimated, b.chunks_done, b.chunks, b.rows_per_sec
        ),
    }
}

fn count_relations(relations: &[Relation]) -> usize {
    relations
        .iter()
        .map(|r| 1 + count_relations(&r.relations))
        .sum()
}

/// A pipeline as JSON: its spec as a spec file would say it, and the center's state.
/// Where a pipeline's versions stand: live, kept (`*`: kept current, a rollback target).
fn print_versions(out: Output, p: &Pipeline) {
    let kept: Vec<String> = p
        .history
        .iter()
        .map(|v| {
            let current = if p.current_history.contains(v) {
                "*"
            } else {
                ""
            };
            format!("{v}{current}")
        })
        .collect();
    print(
        out,
        &["pipeline", "state", "live version", "kept (* current)"],
        vec![vec![
            p.name.clone(),
            p.state.clone(),
            p.live_version.to_string(),
            or_dash(&kept.join(",")),
        ]],
        pipeline_json(p),
    );
}

/// How far the etl applied each source: its position, and how old that knowledge is.
fn applied_cell(applied: &[PipelineApplied]) -> String {
    if applied.is_empty() {
        return "-".into();
    }
    applied
        .iter()
        .map(|a| format!("{} ({:.1}s ago)", a.position, a.lag_ms as f64 / 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pipeline_json(p: &Pipeline) -> Value {
    let mut v = match sluice_proto::convert::pipeline_spec(p.clone()) {
        Ok(spec) => serde_json::to_value(spec).expect("a spec serializes"),
        Err(e) => json!({ "name": p.name, "unreadable": e }),
    };
    for (key, value) in [
        ("state", json!(p.state)),
        ("live_version", json!(p.live_version)),
        ("building_version", json!(p.building_version)),
        ("history", json!(p.history)),
        ("current_history", json!(p.current_history)),
        ("needs_rebuild", json!(p.needs_rebuild)),
        (
            "applied",
            json!(p
                .applied
                .iter()
                .map(
                    |a| json!({"source": a.source, "position": a.position, "gtid": a.gtid,
                    "epoch": a.epoch, "lag_ms": a.lag_ms})
                )
                .collect::<Vec<_>>()),
        ),
    ] {
        v[key] = value;
    }
    v
}

/// The pipeline's relations as an indented tree, one line each.
fn relation_lines(relations: &[Relation], depth: usize, out: &mut Vec<String>) {
    for r in relations {
        let kind = RelationKind::try_from(r.kind)
            .map(|k| k.as_str_name().to_ascii_lowercase())
            .unwrap_or_else(|_| "?".into());
        let on: Vec<String> = r.on.iter().map(|(p, c)| format!("{p} = {c}")).collect();
        let mut line = format!(
            "{}{} {kind}{} {} on {}",
            "  ".repeat(depth),
            r.name,
            match r.nested {
                Some(true) => " nested",
                Some(false) => " object",
                None => "",
            },
            if r.database.is_empty() {
                r.table.clone()
            } else {
                format!("{}.{}", r.database, r.table)
            },
            on.join(", ")
        );
        if !r.filter.is_empty() {
            line.push_str(&format!(" where {}", r.filter));
        }
        if r.distinct {
            line.push_str(" distinct");
        }
        if !r.order_by.is_empty() {
            line.push_str(&format!(" order by {}", r.order_by.join(", ")));
        }
        if r.limit > 0 {
            line.push_str(&format!(" limit {}", r.limit));
        }
        out.push(line);
        relation_lines(&r.relations, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("sluicectl-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_spec_reads_alike_from_toml_and_json_and_names_an_unknown_key() {
        let toml = file(
            "shop.toml",
            r#"
source = "shop"
database = "shop"
table = "products"
filter = "deleted = 0"

[[relations]]
name = "skus"
kind = "one_to_many"
table = "skus"
on = { id = "product_id" }
limit = 5
"#,
        );
        let json = file(
            "shop.json",
            r#"{"source": "shop", "database": "shop", "table": "products", "filter": "deleted = 0",
                "relations": [{"name": "skus", "kind": "one_to_many", "table": "skus",
                               "on": {"id": "product_id"}, "limit": 5}]}"#,
        );
        let from_toml = read_spec(&toml).unwrap();
        assert_eq!(from_toml, read_spec(&json).unwrap());
        assert_eq!(from_toml.relations[0].limit, Some(5));
        let typo = file(
            "typo.toml",
            "source = \"s\"\ndatabase = \"d\"\ntable = \"t\"\n[[relations]]\nname = \"r\"\nkind = \"one_to_one\"\ntable = \"x\"\non = { a = \"b\" }\nordr_by = [\"a\"]\n",
        );
        let e = read_spec(&typo).unwrap_err().to_string();
        assert!(e.contains("`relations[0].ordr_by`"), "{e}");
        for p in [toml, json, typo] {
            let _ = std::fs::remove_file(p);
        }
    }
}
